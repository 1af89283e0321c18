"""Parsing and batching on top of a :class:`~streamrec.pipeline.dataset.Dataset`.

:class:`ParsedDataset` decodes ``Example`` payloads with a feature spec and yields one dict per
record; :class:`BatchedDataset` yields batches of ``batch_size`` records: stacked numpy arrays
from a parsed dataset, lists of ``bytes`` from a raw one. Both work chunk by chunk underneath
(one :func:`~streamrec.example.decode_batch` per chunk or batch, never per record), support
``async for`` and plain ``for`` (the blocking path crosses the background thread once per chunk,
via :func:`streamrec._portal.iterate_chunks`), and forward ``set_epoch``, ``stats``,
``state_dict`` and ``load_state_dict`` to the underlying dataset.

Exact resume: a dict or batch counts as consumed once it has been handed out; records the
transform has taken from the dataset but not handed out yet (the tail of a chunk waiting for the
rest of its batch) do not. The transform reports how many records it has handed out through
``Dataset.mark_consumed(n)`` (it reads the dataset with ``record_chunks(auto_consume=False)``),
so the dataset's ``state_dict()`` always describes the position after the last record of the
last item handed out, and resuming from it yields exactly the items that would have come next
(a state is always on a batch boundary, so a resumed ``BatchedDataset`` with the same
``batch_size`` makes the same batches). Records of a remainder that ``drop_remainder`` discards
count as consumed when the dataset ends. In the blocking path ``mark_consumed`` is called from
the consumer's thread, never while the background loop is advancing the dataset's iteration.
``state_dict()`` raises :class:`NotImplementedError` on a dataset without ``mark_consumed``.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Generator, Iterator, Mapping, Sequence
from contextlib import aclosing
from itertools import repeat
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast, overload

from streamrec._portal import iterate_chunks
from streamrec.errors import StreamrecError
from streamrec.format.example import FeatureSpec, decode, decode_batch

if TYPE_CHECKING:
    from streamrec.pipeline.dataset import Dataset
    from streamrec.pipeline.stats import Stats

__all__ = ["BatchedDataset", "ParsedDataset"]

T = TypeVar("T")

#: What the loop side hands the consumer side per record chunk: the items, the number of
#: records in each item (None: one each) and records consumed without an item (a dropped
#: remainder).
_Piece = tuple[list[T], list[int] | None, int]


class _Handout:
    """Counts the records handed to the consumer and reports them with ``mark(n)``.

    The piece in hand is read through the list iterator ``it``; the items it has already
    produced are handed out (``__length_hint__`` says how many are left), so no per-item
    bookkeeping is needed. ``flush()`` reports what was handed out since the last report.
    """

    __slots__ = ("_count", "_done", "_it", "_mark", "_marked", "_sizes")

    def __init__(self, mark: Callable[[int], None] | None) -> None:
        self._mark = mark
        self._marked = 0  # records reported so far
        self._done = 0  # records of the pieces before the one in hand
        self._count = 0  # items in the piece in hand
        self._sizes: list[int] | None = None
        self._it: Any = None

    def take(self, count: int, sizes: list[int] | None, it: Iterator[Any], skipped: int) -> None:
        """The consumer now reads a piece of ``count`` items through ``it``."""
        self._done += self._handed() + skipped
        self._count, self._sizes, self._it = count, sizes, it
        self.flush()

    def _handed(self) -> int:
        if self._it is None:
            return 0
        items = self._count - self._it.__length_hint__()
        return items if self._sizes is None else sum(self._sizes[:items])

    def total(self) -> int:
        """Records handed out so far (no side effect: any thread may ask)."""
        return self._done + self._handed()

    def flush(self) -> None:
        """Report every record handed out so far."""
        total = self._done + self._handed()
        if self._mark is not None and total > self._marked:
            self._mark(total - self._marked)
            self._marked = total


def _open_chunks(dataset: Dataset, handout: _Handout) -> AsyncGenerator[list[bytes], None]:
    """The dataset's record chunks, read so that only ``handout`` counts records consumed.

    The dataset asks ``handout`` to report before it describes its position, so its own
    ``state_dict()`` is as exact as the transform's. A dataset without ``mark_consumed`` is read
    with plain ``record_chunks()`` (iteration works; ``state_dict()`` is refused).
    """
    if not hasattr(dataset, "mark_consumed"):
        return dataset.record_chunks()
    record_chunks: Any = dataset.record_chunks
    chunks: AsyncGenerator[list[bytes], None] = record_chunks(
        auto_consume=False, report_consumed=handout.flush, handed_out=handout.total
    )
    return chunks


class _Transformed(Generic[T]):
    """Shared machinery: iteration on both paths, consumption tracking, forwarding."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset
        """The underlying :class:`~streamrec.pipeline.dataset.Dataset`."""
        self._handout: _Handout | None = None

    def _pieces(self, chunks: AsyncGenerator[list[bytes], None]) -> AsyncGenerator[_Piece[T], None]:
        """The items made from ``chunks``; closes ``chunks`` however it ends."""
        raise NotImplementedError

    # ---------------------------------------------------------------- iteration

    async def __aiter__(self) -> AsyncGenerator[T, None]:
        handout = self._handout = _Handout(getattr(self.dataset, "mark_consumed", None))
        chunks = _open_chunks(self.dataset, handout)
        async with aclosing(self._pieces(chunks)) as pieces:
            try:
                async for items, sizes, skipped in pieces:
                    it = iter(items)
                    handout.take(len(items), sizes, it, skipped)
                    for item in it:
                        yield item
            finally:
                handout.flush()  # before the dataset's iteration closes

    def __iter__(self) -> Iterator[T]:
        handout = self._handout = _Handout(getattr(self.dataset, "mark_consumed", None))
        chunks = _open_chunks(self.dataset, handout)

        async def one_per_handover() -> AsyncGenerator[list[_Piece[T]], None]:
            async with aclosing(self._pieces(chunks)) as pieces:
                async for piece in pieces:
                    yield [piece]

        pieces = cast(Generator[_Piece[T], None, None], iterate_chunks(one_per_handover))
        try:
            for items, sizes, skipped in pieces:
                it = iter(items)
                handout.take(len(items), sizes, it, skipped)
                yield from it
        finally:
            handout.flush()  # before the dataset's iteration closes
            pieces.close()

    # ---------------------------------------------------------------- forwarded

    def __len__(self) -> int:
        """Items this consumer gets in one epoch: one per record of ``len(dataset)`` (see
        ``Dataset.__len__``; a TypeError where the record count is unknown)."""
        return len(self.dataset)

    @property
    def stats(self) -> Stats:
        """The underlying dataset's counters."""
        return self.dataset.stats

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch of the underlying dataset (see ``Dataset.set_epoch``)."""
        self.dataset.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """The underlying dataset's state, positioned after the last item handed out.

        Raises :class:`NotImplementedError` if the dataset cannot count records consumed
        through a transform (no ``mark_consumed``).
        """
        state_dict = getattr(self.dataset, "state_dict", None)
        if state_dict is None or not hasattr(self.dataset, "mark_consumed"):
            raise NotImplementedError(
                f"{type(self.dataset).__name__} has no mark_consumed()/state_dict(): the "
                "position after parsing or batching cannot be saved"
            )
        if self._handout is not None:
            self._handout.flush()
        return cast(dict[str, Any], state_dict())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (from :meth:`state_dict`) on the next iteration."""
        load_state_dict = getattr(self.dataset, "load_state_dict", None)
        if load_state_dict is None:
            raise NotImplementedError(f"{type(self.dataset).__name__} has no load_state_dict()")
        self._handout = None
        load_state_dict(state)

    def __getstate__(self) -> dict[str, Any]:
        # for pickling (DataLoader workers under spawn): the iteration in progress stays here
        state = self.__dict__.copy()
        state["_handout"] = None
        return state


class ParsedDataset(_Transformed[dict[str, Any]]):
    """The records of a dataset decoded as ``Example`` protos, one dict per record.

    Each record becomes exactly what :func:`streamrec.example.decode` ``(payload, spec)``
    returns: a dict with one entry per spec'd feature, :class:`~streamrec.example.
    FixedLenFeature` and :class:`~streamrec.example.RawFeature` values as arrays of their
    ``shape`` (0-d arrays for ``shape=()``), :class:`~streamrec.example.VarLenFeature` values
    as 1-d arrays or lists of bytes. Decoding runs once per chunk of records
    (:func:`~streamrec.example.decode_batch`); the arrays of a record are views into its
    chunk's arrays.

    A payload that does not match the spec raises :class:`~streamrec.errors.ExampleError` or
    :class:`~streamrec.errors.FeatureError` after every record before it has been yielded.
    For many records per step, :meth:`batch` is faster (no per-record dicts).

    ``async for features in ds.parse(spec)`` or ``for features in ...``; usually built with
    ``Dataset.parse(spec)``.
    """

    def __init__(self, dataset: Dataset, spec: Mapping[str, FeatureSpec]) -> None:
        super().__init__(dataset)
        decode_batch([], spec)  # a bad spec fails here, not in the first chunk
        self.spec = dict(spec)
        """The feature spec."""

    def batch(
        self, batch_size: int, drop_remainder: bool = False
    ) -> BatchedDataset[dict[str, Any]]:
        """Batches of ``batch_size`` records, decoded together (see :class:`BatchedDataset`)."""
        return BatchedDataset(self, batch_size, drop_remainder)

    async def _pieces(
        self, chunks: AsyncGenerator[list[bytes], None]
    ) -> AsyncGenerator[_Piece[dict[str, Any]], None]:
        spec = self.spec
        async with aclosing(chunks) as source:
            async for chunk in source:
                try:
                    decoded = decode_batch(chunk, spec)
                except StreamrecError as error:
                    good, failure = _decode_until_failure(chunk, spec, error)
                    if good:
                        yield good, None, 0
                    raise failure from None
                yield _split(decoded, len(chunk)), None, 0

    def __repr__(self) -> str:
        return f"ParsedDataset({self.dataset!r}, spec={sorted(self.spec)!r})"


class BatchedDataset(_Transformed[T]):
    """Batches of ``batch_size`` consecutive records of a dataset.

    From a :class:`ParsedDataset`: each batch is what :func:`streamrec.example.decode_batch`
    returns for its records: fixed-length and raw features as ``(n, *shape)`` arrays (an
    ``object`` array of bytes for fixed-length ``bytes``), variable-length features as a
    ``list`` of ``n`` per-record values (1-d int64 / float32 arrays, or lists of bytes).
    From a :class:`~streamrec.pipeline.dataset.Dataset`: each batch is a ``list`` of ``n``
    payloads (``bytes``).

    ``n`` is ``batch_size``, except for the last batch of an iteration, which holds the
    remaining records (fewer) unless ``drop_remainder`` drops them. Batches span chunk and
    shard boundaries; records are decoded once per batch. A batch with a payload that does
    not match the spec raises :class:`~streamrec.errors.ExampleError` /
    :class:`~streamrec.errors.FeatureError` naming the record's index in the batch.

    Usually built with ``Dataset.batch(n)`` or ``Dataset.parse(spec).batch(n)``.
    """

    @overload
    def __init__(
        self: BatchedDataset[list[bytes]],
        source: Dataset,
        batch_size: int,
        drop_remainder: bool = False,
    ) -> None: ...

    @overload
    def __init__(
        self: BatchedDataset[dict[str, Any]],
        source: ParsedDataset,
        batch_size: int,
        drop_remainder: bool = False,
    ) -> None: ...

    def __init__(
        self, source: Dataset | ParsedDataset, batch_size: int, drop_remainder: bool = False
    ) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, not {batch_size!r}")
        if isinstance(source, _Transformed) and not isinstance(source, ParsedDataset):
            raise TypeError(f"cannot batch a {type(source).__name__}")
        if isinstance(source, ParsedDataset):
            super().__init__(source.dataset)
            self.spec: dict[str, FeatureSpec] | None = source.spec
            """The feature spec, or None for batches of raw payloads."""
        else:
            super().__init__(source)
            self.spec = None
        self.batch_size = batch_size
        self.drop_remainder = drop_remainder

    def __len__(self) -> int:
        """Batches this consumer gets in one epoch: ``len(dataset) / batch_size``, rounded up
        (the shorter last batch), or down with ``drop_remainder``."""
        records = super().__len__()
        if self.drop_remainder:
            return records // self.batch_size
        return -(-records // self.batch_size)

    def _finish(self, records: list[bytes]) -> T:
        if self.spec is None:
            return cast(T, records)
        return cast(T, decode_batch(records, self.spec))

    async def _pieces(
        self, chunks: AsyncGenerator[list[bytes], None]
    ) -> AsyncGenerator[_Piece[T], None]:
        n = self.batch_size
        finish = self._finish
        pending: list[bytes] = []  # always a list of ours: chunks are never modified
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
                batches: list[T] = []
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
            if self.drop_remainder:
                yield [], None, len(pending)
            else:
                yield [finish(pending)], [len(pending)], 0

    def __repr__(self) -> str:
        what = "raw" if self.spec is None else f"spec={sorted(self.spec)!r}"
        return (
            f"BatchedDataset({self.dataset!r}, {what}, batch_size={self.batch_size}, "
            f"drop_remainder={self.drop_remainder})"
        )


def _split(decoded: Mapping[str, Any], n: int) -> list[dict[str, Any]]:
    """A decode_batch result of ``n`` records as ``n`` per-record dicts (views, no copies)."""
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
    good: list[dict[str, Any]] = []
    for payload in chunk:
        try:
            good.append(decode(payload, spec))
        except StreamrecError as failure:
            return good, failure
    return good, error  # pragma: no cover - decode and decode_batch agree
