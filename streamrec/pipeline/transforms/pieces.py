"""The chunk algorithms of the transforms: source chunks in, pieces out (see
:mod:`streamrec.pipeline.transforms.ledger` for what a piece says about consumption).

Every function works a chunk at a time (one ``decode_batch`` per chunk or batch, list slicing
for take/skip); per-item Python work is only what the user's function or predicate costs.
Each closes its source chunks however it ends. Example decoding is imported on first use
(protobuf stays unloaded until a spec is used).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from contextlib import aclosing
from itertools import repeat
from typing import TYPE_CHECKING, Any

from streamrec._portal import owned_generator
from streamrec.errors import ExampleError, StateError, StreamrecError
from streamrec.pipeline.transforms.ledger import ItemPiece

if TYPE_CHECKING:
    from streamrec.format.example import FeatureSpec

__all__ = [
    "batch_pieces",
    "filter_pieces",
    "map_pieces",
    "parse_pieces",
    "skip_pieces",
    "split_batch",
    "take_pieces",
    "unbatch_pieces",
]

Chunks = AsyncGenerator[list[Any], None]


@owned_generator
async def parse_pieces(
    chunks: Chunks,
    spec: Mapping[str, FeatureSpec],
    placed: Callable[[ExampleError, object], ExampleError] | None = None,
) -> AsyncGenerator[ItemPiece, None]:
    """One dict per record, one ``decode_batch`` per chunk; a bad record raises after every
    good one before it (``placed(error, payload)`` names where the record comes from)."""
    from streamrec.format.example import decode_batch

    async with aclosing(chunks) as source:
        async for chunk in source:
            try:
                decoded = decode_batch(chunk, spec)
            except StreamrecError as error:
                good, failure = _decode_until_failure(chunk, spec, error)
                if placed is not None and isinstance(failure, ExampleError):
                    at = len(good) if failure.batch_index is None else failure.batch_index
                    failure = placed(failure, chunk[at])
                if good:
                    yield good, None, 0
                raise failure from None
            yield split_batch(decoded, len(chunk)), None, 0


@owned_generator
async def batch_pieces(
    chunks: Chunks, n: int, drop_remainder: bool, finish: Callable[[list[Any]], Any]
) -> AsyncGenerator[ItemPiece, None]:
    """Batches of ``n`` consecutive items (``finish`` makes each), spanning chunks."""
    pending: list[Any] = []  # always a list of ours: chunks are never modified
    async with aclosing(chunks) as source:
        async for chunk in source:
            if len(pending) + len(chunk) < n:
                pending.extend(chunk)
                continue
            if pending:
                pending.extend(chunk)
                records = pending
            else:
                records = chunk
            full = len(records) - len(records) % n
            batches: list[Any] = []
            try:
                for start in range(0, full, n):
                    batches.append(finish(records[start : start + n]))
            except StreamrecError:
                if batches:  # the good batches before the bad one still come first
                    yield batches, [n] * len(batches), 0
                raise
            pending = records[full:]
            yield batches, [n] * len(batches), 0
    if pending:
        if drop_remainder:
            yield [], None, len(pending)
        else:
            yield [finish(pending)], [len(pending)], 0


@owned_generator
async def map_pieces(chunks: Chunks, fn: Callable[[Any], Any]) -> AsyncGenerator[ItemPiece, None]:
    """``fn`` on every item, inline; an exception comes after the items mapped before it."""
    async with aclosing(chunks) as source:
        async for chunk in source:
            out: list[Any] = []
            try:
                out.extend(map(fn, chunk))  # (keeps what was mapped before an exception)
            except BaseException:
                if out:
                    yield out, None, 0
                raise
            yield out, None, 0


@owned_generator
async def filter_pieces(
    chunks: Chunks, predicate: Callable[[Any], Any]
) -> AsyncGenerator[ItemPiece, None]:
    """The items ``predicate`` keeps. A kept item costs the records dropped since the
    previous kept one and itself, so records dropped before the last item handed out count
    as consumed and those after it do not (they are read again on resume, and dropped)."""
    carry = 0  # dropped items since the last kept one
    async with aclosing(chunks) as source:
        async for chunk in source:
            kept: list[Any] = []
            sizes: list[int] = []
            last = -1
            try:
                for i, item in enumerate(chunk):
                    if predicate(item):
                        kept.append(item)
                        sizes.append(i - last + carry)
                        carry, last = 0, i
            except BaseException:
                if kept:
                    yield kept, sizes, 0
                raise
            carry += len(chunk) - 1 - last
            if kept:
                yield kept, sizes, 0
    if carry:
        yield [], None, carry


@owned_generator
async def take_pieces(chunks: Chunks, left: int) -> AsyncGenerator[ItemPiece, None]:
    """The first ``left`` items; the source is closed (its reads cancelled) right after."""
    async with aclosing(chunks) as source:
        if left <= 0:
            return
        async for chunk in source:
            if len(chunk) >= left:
                yield chunk[:left], None, 0
                return
            left -= len(chunk)
            yield chunk, None, 0


@owned_generator
async def skip_pieces(chunks: Chunks, left: int) -> AsyncGenerator[ItemPiece, None]:
    """All but the first ``left`` items (consumed, without an item, as they are dropped)."""
    async with aclosing(chunks) as source:
        async for chunk in source:
            if left >= len(chunk):
                left -= len(chunk)
                yield [], None, len(chunk)
                continue
            yield (chunk[left:] if left else chunk), None, left
            left = 0


@owned_generator
async def unbatch_pieces(chunks: Chunks, drop_first: int) -> AsyncGenerator[ItemPiece, None]:
    """The items of each batch; a batch counts as consumed with its last item (an empty one
    with the item before it). The first ``drop_first`` items of the first batch were handed
    out before a resume."""
    async with aclosing(chunks) as source:
        async for chunk in source:
            items: list[Any] = []
            sizes: list[int] = []
            lead = 0  # empty batches before the piece's first item
            for batch in chunk:
                rows = split_batch(batch)
                if drop_first:
                    if drop_first >= len(rows):
                        raise StateError(
                            f"unbatch.in_batch: {drop_first} items already handed out of a "
                            f"batch of {len(rows)} (is this the state of another dataset?)"
                        )
                    rows, drop_first = rows[drop_first:], 0
                if not rows:
                    if sizes:
                        sizes[-1] += 1
                    else:
                        lead += 1
                    continue
                items.extend(rows)
                sizes.extend(repeat(0, len(rows) - 1))
                sizes.append(1)
            if items or lead:
                yield items, (sizes if items else None), lead


def split_batch(batch: Any, n: int | None = None) -> list[Any]:
    """The items of one batch: a list or tuple's elements, a numpy array's rows, or, for a
    dict of per-item columns (``decode_batch``'s: arrays and lists of ``n``), one dict per
    item (views into the columns, no copies)."""
    if isinstance(batch, list):
        return batch
    if isinstance(batch, tuple):
        return list(batch)
    if isinstance(batch, Mapping):
        if n is None:
            lengths = {len(value) for value in batch.values()}
            if len(lengths) > 1:
                raise ValueError(f"cannot unbatch a dict whose columns have lengths {lengths}")
            n = lengths.pop() if lengths else 0
        return _split(batch, n)
    if hasattr(batch, "ndim") and hasattr(batch, "__len__"):
        return list(batch)
    raise TypeError(
        f"cannot unbatch a {type(batch).__name__}: batches must be lists, tuples, numpy "
        "arrays or dicts of per-item columns"
    )


def _split(decoded: Mapping[str, Any], n: int) -> list[dict[str, Any]]:
    if not decoded:
        return [{} for _ in range(n)]
    names = list(decoded)
    columns = [_rows(decoded[name], n) for name in names]
    rows = zip(*columns, strict=True)
    return list(map(dict, map(zip, repeat(names), rows)))  # ~2x a comprehension of dict(zip())


def _rows(value: Any, n: int) -> Sequence[Any]:
    if isinstance(value, list):  # VarLenFeature: already one value per record
        return value
    if value.ndim == 1:  # shape (): 0-d arrays, as decode() gives (iteration gives scalars)
        return [value[i, ...] for i in range(n)]
    return list(value)


def _decode_until_failure(
    chunk: list[bytes], spec: Mapping[str, FeatureSpec], error: StreamrecError
) -> tuple[list[dict[str, Any]], StreamrecError]:
    """The records of ``chunk`` before the first that fails to decode, and its error."""
    from streamrec.format.example import decode

    good: list[dict[str, Any]] = []
    for payload in chunk:
        try:
            good.append(decode(payload, spec))
        except StreamrecError as failure:
            return good, failure
    return good, error  # pragma: no cover - decode and decode_batch agree
