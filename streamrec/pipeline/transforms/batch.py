"""``.parse(spec)``, ``.batch(n)`` and ``.unbatch()``: records decoded as ``Example`` protos,
batches of consecutive items, and the items of batches again (``.parse_sequence(...)``: records
as ``SequenceExample`` protos, decoded by the batch above it, into Arrow only).

A parse decodes a chunk at a time (one ``decode_batch`` per chunk); a batch of a parse decodes
each batch at once instead (it reads the parse's source: no per-record dicts). A record that
does not decode raises after every good one before it, naming where it comes from. An unbatch
splits lists, tuples, numpy arrays and dicts of per-item columns (:func:`split_batch`) and
resumes in the middle of a batch (its state counts the items of the batch handed out). Example
decoding is imported on first use (protobuf stays unloaded until a spec is used).
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from contextlib import aclosing
from itertools import repeat
from typing import TYPE_CHECKING, Any, TypeVar

from streamrec._portal import owned_generator
from streamrec.errors import ExampleError, StateError, StreamrecError
from streamrec.format.payload import RecordSpans
from streamrec.pipeline.transforms.ledger import ItemPiece, Ledger
from streamrec.pipeline.transforms.stage import Chunks, Stage, check_count

if TYPE_CHECKING:
    from streamrec.format.example import FeatureSpec
    from streamrec.pipeline.stats import Stats

__all__ = [
    "BatchStage",
    "ParseStage",
    "SequenceParseStage",
    "UnbatchStage",
    "batch_pieces",
    "parse_pieces",
    "split_batch",
    "unbatch_pieces",
]

T = TypeVar("T")


class ParseStage(Stage[dict[str, Any]]):
    """Example payloads decoded with a spec, one dict per record."""

    takes_records_in_place = True

    def __init__(self, source: Any, spec: Mapping[str, FeatureSpec]) -> None:
        from streamrec.format.example import decode_batch

        super().__init__(source)
        decode_batch([], spec)  # a bad spec fails here, not in the first chunk
        self.spec = dict(spec)
        """The feature spec."""

    def _pieces(self, chunks: Chunks) -> AsyncGenerator[ItemPiece, None]:
        return parse_pieces(chunks, self.spec, self._placed, self._live_stats())


class SequenceParseStage(Stage[Any]):
    """``SequenceExample`` payloads to decode with a ``context`` and a ``sequence`` spec, a batch
    at a time, by the batch stage that reads it (``to_arrow``): there are no per-record dicts,
    so iterating it alone is a TypeError saying so."""

    takes_records_in_place = True

    def __init__(
        self,
        source: Any,
        context: Mapping[str, FeatureSpec] | None,
        sequence: Mapping[str, FeatureSpec] | None,
    ) -> None:
        from streamrec.format.example import decode_sequence_batch

        super().__init__(source)
        decode_sequence_batch([], context, sequence)  # a bad spec fails here, not in a batch
        self.context = dict(context or {})
        """The context features' spec."""
        self.sequence = dict(sequence or {})
        """The feature lists' spec (each a column of steps)."""

    def _pieces(self, chunks: Chunks) -> AsyncGenerator[ItemPiece, None]:
        raise TypeError(SEQUENCE_NEEDS_ARROW)


SEQUENCE_NEEDS_ARROW = (
    "SequenceExamples are decoded a batch at a time, into Arrow: iterate "
    "ds.parse_sequence(context=..., sequence=...).to_arrow(batch_size)"
)


@owned_generator
async def parse_pieces(
    chunks: Chunks,
    spec: Mapping[str, FeatureSpec],
    placed: Callable[[ExampleError, object], ExampleError] | None = None,
    stats: Stats | None = None,
) -> AsyncGenerator[ItemPiece, None]:
    """One dict per record, one ``decode_batch`` per chunk; a bad record raises after every
    good one before it (``placed(error, payload)`` names where the record comes from). The
    decoding time is added to ``stats.parse_s``."""
    from streamrec.format.example import decode_batch

    async with aclosing(chunks) as source:
        async for chunk in source:
            started = time.perf_counter()
            try:
                decoded = decode_batch(chunk, spec)
            except StreamrecError as error:
                good, failure = _decode_until_failure(chunk, spec, error)
                if placed is not None and isinstance(failure, ExampleError):
                    at = len(good) if failure.batch_index is None else failure.batch_index
                    failure = placed(failure, _record(chunk, at))
                if good:
                    yield good, None, 0
                raise failure from None
            items = split_batch(decoded, len(chunk))
            if stats is not None:
                stats.parse_s += time.perf_counter() - started
            yield items, None, 0


def _record(records: Sequence[bytes], k: int) -> object:
    """What locates record ``k`` of ``records`` (the very object; one left in place: its
    :meth:`~streamrec.format.payload.RecordSpans.ref`)."""
    return records.ref(k) if isinstance(records, RecordSpans) else records[k]


def _decode_until_failure(
    chunk: Sequence[bytes], spec: Mapping[str, FeatureSpec], error: StreamrecError
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


class BatchStage(Stage[T]):
    """Batches of ``batch_size`` consecutive items."""

    def __init__(
        self,
        source: Any,
        batch_size: int,
        drop_remainder: bool = False,
        to: str = "numpy",
        num_threads: int | None = None,
    ) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, not {batch_size!r}")
        if num_threads is not None and (type(num_threads) is not int or num_threads < 1):
            raise ValueError(f"num_threads must be None or an int >= 1, not {num_threads!r}")
        if isinstance(source, BatchStage):
            raise TypeError(f"cannot batch a {type(source).__name__} (unbatch() it first)")
        self.spec: dict[str, FeatureSpec] | None = None
        """The feature spec when the records are decoded per batch (of a ``SequenceExample``:
        its context), else None."""
        self.sequence: dict[str, FeatureSpec] | None = None
        """The feature lists' spec when the records are ``SequenceExample`` protos, else None."""
        if isinstance(source, ParseStage):  # decode each batch at once, not record by record
            super().__init__(source.source)
            self.spec = source.spec
            self.takes_records_in_place = True
        elif isinstance(source, SequenceParseStage):
            super().__init__(source.source)
            self.spec, self.sequence = source.context, source.sequence
            self.takes_records_in_place = True
        else:
            super().__init__(source)
        if to != "numpy" and self.spec is None:
            raise TypeError(f"{to} batches need parsed records: ds.parse(spec).to_{to}(...)")
        if self.sequence is not None and to != "arrow":
            raise TypeError(SEQUENCE_NEEDS_ARROW)
        self.batch_size = batch_size
        self.drop_remainder = drop_remainder
        self.to = to
        """What a batch of parsed records is: ``"numpy"`` (a dict of arrays) or ``"arrow"``."""
        self.num_threads = num_threads
        """decode_batch's ``num_threads`` (None: its default)."""
        self._parse_stats: Stats | None = None

    def __len__(self) -> int:
        """Batches this consumer gets in one epoch: ``len(source) / batch_size``, rounded up
        (the shorter last batch), or down with ``drop_remainder``."""
        records = super().__len__()
        if self.drop_remainder:
            return records // self.batch_size
        return -(-records // self.batch_size)

    def _decode(self, records: Sequence[Any]) -> Any:
        """``records`` decoded as one batch (the spec is set)."""
        assert self.spec is not None
        if self.sequence is not None:
            from streamrec.format.example import decode_sequence_batch

            return decode_sequence_batch(records, self.spec, self.sequence)
        from streamrec.format.example import decode_batch

        return decode_batch(records, self.spec, to=self.to, num_threads=self.num_threads)

    def _finish(self, records: Sequence[Any]) -> Any:
        if self.spec is None:
            return records
        started = time.perf_counter()
        try:
            return self._decode(records)
        except ExampleError as error:
            if error.batch_index is not None:  # say where the record is, not "of the batch"
                self._placed(error, _record(records, error.batch_index))
            raise
        finally:
            if self._parse_stats is not None:
                self._parse_stats.parse_s += time.perf_counter() - started

    def _finish_many(self, records: Sequence[Any], n: int) -> list[Any] | None:
        """The batches of ``records`` (a multiple of ``n``) decoded in one call and split into
        views (one call's overhead per chunk, not per batch: measured, 7 % less CPU for 1 KiB
        records in batches of 256, none for 10 KiB); None where that fails or does not apply (then
        batch by batch: the good batches come before the error, which names its record). A
        batch's arrays are views of its chunk's: holding one holds the chunk's decoded data."""
        if self.spec is None or len(records) <= n:
            return None
        started = time.perf_counter()
        try:
            decoded = self._decode(records)
        except StreamrecError:
            return None
        finally:
            if self._parse_stats is not None:
                self._parse_stats.parse_s += time.perf_counter() - started
        if self.to == "arrow":
            return [decoded.slice(start, n) for start in range(0, len(records), n)]
        return [
            {name: column[start : start + n] for name, column in decoded.items()}
            for start in range(0, len(records), n)
        ]

    def _pieces(self, chunks: Chunks) -> AsyncGenerator[ItemPiece, None]:
        self._parse_stats = self._live_stats() if self.spec is not None else None
        return batch_pieces(
            chunks, self.batch_size, self.drop_remainder, self._finish, self._finish_many
        )


@owned_generator
async def batch_pieces(
    chunks: Chunks,
    n: int,
    drop_remainder: bool,
    finish: Callable[[Sequence[Any]], Any],
    finish_many: Callable[[Sequence[Any], int], list[Any] | None] | None = None,
) -> AsyncGenerator[ItemPiece, None]:
    """Batches of ``n`` consecutive items (``finish`` makes each), spanning chunks;
    ``finish_many(items, n)`` may make all of a chunk's batches at once (None: it did not)."""
    # never modified (a new sequence when more items come): records left in place
    # (RecordSpans) stay in place
    pending: Sequence[Any] = []
    async with aclosing(chunks) as source:
        async for chunk in source:
            records = _joined(pending, chunk) if pending else chunk
            if len(records) < n:
                pending = records
                continue
            full = len(records) - len(records) % n
            batches: list[Any] = []
            many = None if finish_many is None else finish_many(records[:full], n)
            try:
                if many is not None:
                    batches = many
                for start in range(len(batches) * n, full, n):
                    batches.append(finish(records[start : start + n]))
            except StreamrecError:
                if batches:  # the good batches before the bad one still come first
                    yield batches, [n] * len(batches), 0
                raise
            pending = records[full:]
            if isinstance(pending, RecordSpans):
                pending = pending.compact()  # (the rest of the chunk's pieces may go)
            yield batches, [n] * len(batches), 0
    if pending:
        if drop_remainder:
            yield [], None, len(pending)
        else:
            yield [finish(pending)], [len(pending)], 0


def _joined(pending: Sequence[Any], chunk: Sequence[Any]) -> Sequence[Any]:
    """``pending``'s items, then ``chunk``'s (a new sequence)."""
    if isinstance(chunk, RecordSpans) or isinstance(pending, RecordSpans):
        # (in place still: the records keep their buffers, so an error still finds its place)
        return RecordSpans.join([pending, chunk])
    return [*pending, *chunk]


class UnbatchStage(Stage[Any]):
    """The items of each batch; state: ``{"unbatch": {"in_batch": k}, "source": ...}``, the
    source's state at the current batch and the items of it already handed out."""

    state_key = "unbatch"

    def __len__(self) -> int:
        """Known for a :class:`BatchStage` source: its records (without a dropped remainder);
        a TypeError otherwise (batch sizes unknown)."""
        source = self.source
        if not isinstance(source, BatchStage):
            raise TypeError(f"len() of an unbatched {type(source).__name__} is unknown")
        records = len(source.source)
        return records - records % source.batch_size if source.drop_remainder else records

    def _initial(self) -> dict[str, int]:
        return {"in_batch": 0}

    def _counters(self, ledger: Ledger) -> dict[str, int]:
        return {"in_batch": ledger.tail}

    def _check(self, counters: dict[str, Any]) -> dict[str, int]:
        return {"in_batch": check_count(counters, "in_batch", "unbatch", None)}

    def _pieces(self, chunks: Chunks) -> AsyncGenerator[ItemPiece, None]:
        return unbatch_pieces(chunks, self._base["in_batch"])


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
