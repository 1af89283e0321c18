"""The transforms of a dataset, and :class:`Chainable`, the methods that chain them.

Every dataset (:class:`~streamrec.pipeline.dataset.Dataset`, a mix, and every transform of
them) inherits :class:`Chainable`: ``ds.parse(spec)`` (``.parse_sequence(context, sequence)``:
read with ``.to_arrow(n)``), ``.batch(n)``, ``.map(fn)``, ``.filter(pred)``, ``.take(n)``,
``.skip(n)``, ``.repeat(epochs)`` and ``.unbatch()`` each return a new dataset reading the
one they are called on through the
:class:`~streamrec.pipeline.transforms.chain.Source` protocol, so they chain in any order. Each one
supports ``async for`` and plain ``for`` (the blocking path crosses the background thread
once per chunk), ``len()`` where it is known, ``set_epoch``, ``stats``, and ``state_dict()`` /
``load_state_dict()`` with exact resume: the state describes the position after the last item
handed out (see :mod:`streamrec.pipeline.transforms.stage` for how, and each op's module for
what it does: ``batch`` (parse, batch, unbatch), ``map``, ``filter``, ``slice`` (take, skip),
``repeat``). Work is done a chunk at a time; a dataset's transforms hold no more than a chunk (a
batch, a map's tasks in flight) beyond the dataset's own ``prefetch_bytes``.

Parse and batch, map and filter keep their source's state as it is (the dataset's: the README
loop that saves ``ds.state_dict()`` stays exact through them); ``take``, ``skip``,
``repeat`` and ``unbatch`` have counters of their own, so save the state of the object you
iterate.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from streamrec.pipeline.transforms.batch import (
    SEQUENCE_NEEDS_ARROW,
    BatchStage,
    ParseStage,
    SequenceParseStage,
    UnbatchStage,
)
from streamrec.pipeline.transforms.filter import FilterStage
from streamrec.pipeline.transforms.map import MapStage, WorkerType
from streamrec.pipeline.transforms.repeat import RepeatStage
from streamrec.pipeline.transforms.slice import SkipStage, TakeStage

if TYPE_CHECKING:
    from streamrec.format.example import FeatureSpec

__all__ = [
    "ArrowDataset",
    "BatchedDataset",
    "Chainable",
    "FilteredDataset",
    "MappedDataset",
    "ParsedDataset",
    "RepeatedDataset",
    "SequenceParsedDataset",
    "SkippedDataset",
    "TakenDataset",
    "UnbatchedDataset",
]

T = TypeVar("T")
U = TypeVar("U")


class Chainable(Generic[T]):
    """The chaining methods, for any :class:`~streamrec.pipeline.transforms.chain.Source` of
    ``T``."""

    def parse(self, spec: Mapping[str, FeatureSpec]) -> ParsedDataset:
        """Records decoded with ``spec``: one dict of numpy arrays per record (see
        :class:`ParsedDataset`); ``.batch(n)`` decodes whole batches into stacked arrays."""
        return ParsedDataset(self, spec)

    def parse_sequence(
        self,
        context: Mapping[str, FeatureSpec] | None = None,
        sequence: Mapping[str, FeatureSpec] | None = None,
    ) -> SequenceParsedDataset:
        """Records decoded as ``SequenceExample`` protos: ``context`` features and ``sequence``
        feature lists, read as Arrow batches with ``.to_arrow(batch_size)`` (see
        :class:`SequenceParsedDataset`)."""
        return SequenceParsedDataset(self, context, sequence)

    def batch(self, batch_size: int, drop_remainder: bool = False) -> BatchedDataset[Any]:
        """Batches of ``batch_size`` items (the last one shorter unless ``drop_remainder``):
        after ``parse``, dicts of stacked arrays; otherwise lists of items (payloads, or what
        ``map`` made). See :class:`BatchedDataset`."""
        return BatchedDataset(self, batch_size, drop_remainder)

    def map(
        self,
        fn: Callable[[T], U],
        num_workers: int = 0,
        *,
        worker_type: WorkerType = "thread",
        mp_context: str | None = None,
        task_items: int = 256,
    ) -> MappedDataset[U]:
        """``fn(item)`` for each item (each batch, on a batched dataset), in order.

        ``num_workers=0`` runs ``fn`` in the reading loop; ``num_workers=n`` on ``n``
        threads (``worker_type="thread"``: for functions that release the GIL: numpy,
        decoders, I/O) or processes (``"process"``, for pure-Python CPU work; ``fn`` must be
        picklable: a module-level function, not a lambda - TypeError at once otherwise;
        ``mp_context``: the start method, default multiprocessing's). Items go to workers
        ``task_items`` at a time, at most ``2 * num_workers`` tasks in flight; order is kept.
        Resuming never re-runs ``fn`` on items already handed out. See :class:`MappedDataset`.
        """
        return MappedDataset(self, fn, num_workers, worker_type, mp_context, task_items)

    def filter(self, predicate: Callable[[T], Any]) -> FilteredDataset[T]:
        """The items for which ``predicate(item)`` is true (``len()`` is unknown)."""
        return FilteredDataset(self, predicate)

    def take(self, n: int) -> TakenDataset[T]:
        """The first ``n`` items of each epoch (per DataLoader worker / host share)."""
        return TakenDataset(self, n)

    def skip(self, n: int) -> SkippedDataset[T]:
        """All but the first ``n`` items of each epoch (per DataLoader worker / host share)."""
        return SkippedDataset(self, n)

    def repeat(self, epochs: int | None = None) -> RepeatedDataset[T]:
        """The epochs one after another, ``epochs`` times (None: forever), advancing
        ``set_epoch`` each pass (see :class:`RepeatedDataset`)."""
        return RepeatedDataset(self, epochs)

    def unbatch(self) -> UnbatchedDataset:
        """The items of each batch (lists, tuples, array rows, or one dict per row of a dict
        of columns); resumes in the middle of a batch."""
        return UnbatchedDataset(self)


class ParsedDataset(ParseStage, Chainable[dict[str, Any]]):
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
    """

    def to_arrow(
        self, batch_size: int = 8192, drop_remainder: bool = False, num_threads: int | None = None
    ) -> ArrowDataset:
        """Batches of ``batch_size`` records as ``pyarrow.RecordBatch``es, one column per
        feature (see :class:`ArrowDataset`; needs pyarrow: ``pip install streamrec[arrow]``).
        ``num_threads``: the threads decoding a batch, as in
        :func:`~streamrec.example.decode_batch` (None: its default)."""
        return ArrowDataset(self, batch_size, drop_remainder, to="arrow", num_threads=num_threads)

    def __repr__(self) -> str:
        return f"ParsedDataset({self.source!r}, spec={sorted(self.spec)!r})"


class SequenceParsedDataset(SequenceParseStage):
    """The records of a dataset as ``SequenceExample`` protos, to be read with :meth:`to_arrow`.

    A batch of records becomes what :func:`streamrec.example.decode_sequence_batch` ``(records,
    context, sequence)`` returns: the ``context`` features' columns, then one ``large_list``
    column of steps per ``sequence`` feature. There is no per-record form: iterating this
    object is a TypeError pointing at :meth:`to_arrow`. The specs are checked here (a feature
    named in both is a ValueError).
    """

    def to_arrow(self, batch_size: int = 8192, drop_remainder: bool = False) -> ArrowDataset:
        """Batches of ``batch_size`` records as ``pyarrow.RecordBatch``es (see
        :class:`ArrowDataset`; needs pyarrow: ``pip install streamrec[arrow]``)."""
        return ArrowDataset(self, batch_size, drop_remainder, to="arrow")

    def __iter__(self) -> Iterator[Any]:
        raise TypeError(SEQUENCE_NEEDS_ARROW)

    def __aiter__(self) -> Any:
        raise TypeError(SEQUENCE_NEEDS_ARROW)

    def __repr__(self) -> str:
        return (
            f"SequenceParsedDataset({self.source!r}, context={sorted(self.context)!r}, "
            f"sequence={sorted(self.sequence)!r})"
        )


class BatchedDataset(BatchStage[T], Chainable[T]):
    """Batches of ``batch_size`` consecutive items of a dataset.

    From a :class:`ParsedDataset`: each batch is what :func:`streamrec.example.decode_batch`
    returns for its records: fixed-length and raw features as ``(n, *shape)`` arrays (an
    ``object`` array of bytes for fixed-length ``bytes``), variable-length features as a
    ``list`` of ``n`` per-record values (1-d int64 / float32 arrays, or lists of bytes).
    From anything else (a :class:`~streamrec.pipeline.dataset.Dataset`, a map, a filter):
    a ``list`` of ``n`` items.

    ``n`` is ``batch_size``, except for the last batch of an iteration, which holds the
    remaining items (fewer) unless ``drop_remainder`` drops them. Batches span chunk and
    shard boundaries; records are decoded once per batch. A batch with a payload that does
    not match the spec raises :class:`~streamrec.errors.ExampleError` /
    :class:`~streamrec.errors.FeatureError` naming the record's index in the batch. A state
    is always on a batch boundary.
    """

    def __repr__(self) -> str:
        what = "raw" if self.spec is None else f"spec={sorted(self.spec)!r}"
        return (
            f"BatchedDataset({self.source!r}, {what}, batch_size={self.batch_size}, "
            f"drop_remainder={self.drop_remainder})"
        )


class ArrowDataset(BatchStage[Any], Chainable[Any]):
    """Parsed records as ``pyarrow.RecordBatch``es of ``batch_size`` rows (the last one shorter
    unless ``drop_remainder``), from :meth:`ParsedDataset.to_arrow` or
    :meth:`SequenceParsedDataset.to_arrow`.

    Every batch has :attr:`schema`: one column per feature in the spec's order, typed as
    :mod:`streamrec.format.example.arrow` lists (fixed-length features as scalars or
    fixed-size lists, variable-length ones as large lists, bytes as large binary); of
    ``SequenceExample`` records, the context's columns, then a ``large_list`` of steps per
    feature list. Batches are built from the C parser's output without a Python object per
    record. A record that does not decode raises after every batch before its own, naming the
    record's shard, index and byte offset. Iterates, resumes
    (a state is on a batch boundary) and chains like any dataset; :meth:`reader` hands the
    batches to Arrow consumers (DuckDB, Polars, ``pyarrow.dataset``) as a stream.
    """

    def __init__(
        self,
        source: Any,
        batch_size: int,
        drop_remainder: bool = False,
        to: str = "arrow",
        num_threads: int | None = None,
    ) -> None:
        super().__init__(source, batch_size, drop_remainder, to, num_threads)
        _ = self.schema  # a spec Arrow cannot hold fails here, not after the first reads

    @property
    def schema(self) -> Any:
        """The ``pyarrow.Schema`` of every batch."""
        from streamrec.format.example.arrow import arrow_schema
        from streamrec.format.example.sequence import sequence_schema

        assert self.spec is not None
        if self.sequence is not None:
            return sequence_schema(self.spec, self.sequence)
        return arrow_schema(self.spec)

    def reader(self) -> Any:
        """One pass over the batches as a ``pyarrow.RecordBatchReader`` (DuckDB queries it,
        ``read_all()`` makes a table). Reading it to its end ends the iteration; a reader
        left part-way holds the iteration (its reads and loop thread) until it is garbage
        collected (``del reader``): pyarrow's ``close()`` does not reach the iteration."""
        from streamrec.format.example.arrow import pyarrow

        return pyarrow().RecordBatchReader.from_batches(self.schema, _closing(iter(self)))

    def __repr__(self) -> str:
        return (
            f"ArrowDataset({self.source!r}, batch_size={self.batch_size}, "
            f"drop_remainder={self.drop_remainder})"
        )


def _closing(iterator: Iterator[Any]) -> Iterator[Any]:
    try:
        yield from iterator
    finally:
        close = getattr(iterator, "close", None)
        if close is not None:
            close()


class MappedDataset(MapStage[T], Chainable[T]):
    """``fn`` applied to every item of a dataset, in order (see :meth:`Chainable.map`).

    Items count as consumed once handed out, so a resumed map never re-runs ``fn`` on them
    (items mapped ahead and not handed out are mapped again). An exception in ``fn`` reaches
    the consumer as raised (from a worker process with the worker's traceback as its
    ``__cause__``); with ``num_workers=0`` every item mapped before it is handed out first.
    Closing the iterator early cancels the tasks not started and shuts the workers down.
    The workers start with each iteration and end with it.
    """

    def __repr__(self) -> str:
        return (
            f"MappedDataset({self.source!r}, {self.fn!r}, num_workers={self.num_workers}, "
            f"worker_type={self.worker_type!r})"
        )


class FilteredDataset(FilterStage[T], Chainable[T]):
    """The items of a dataset for which ``predicate`` is true. Records dropped before the
    last item handed out count as consumed; ``len()`` raises TypeError (unknown)."""

    def __repr__(self) -> str:
        return f"FilteredDataset({self.source!r}, {self.predicate!r})"


class TakenDataset(TakeStage[T], Chainable[T]):
    """The first ``n`` items of each epoch; the source's reads stop there. ``len()`` is
    ``min(n, len(source))``; the state counts the items taken."""

    def __repr__(self) -> str:
        return f"TakenDataset({self.source!r}, {self.n})"


class SkippedDataset(SkipStage[T], Chainable[T]):
    """All but the first ``n`` items of each epoch (read and dropped). ``len()`` is
    ``max(0, len(source) - n)``; the state counts the items skipped."""

    def __repr__(self) -> str:
        return f"SkippedDataset({self.source!r}, {self.n})"


class RepeatedDataset(RepeatStage[T], Chainable[T]):
    """A dataset's epochs one after another: pass ``p`` is epoch ``first + p``, where
    ``first`` is the dataset's epoch when ``repeat`` was called (or ``set_epoch`` on the
    repeat). ``len()`` is ``epochs * len(source)`` (TypeError when endless). The state holds
    the pass; a pass ended with items still held above (a batch spanning two epochs) is
    resumed exactly (see :mod:`streamrec.pipeline.transforms.repeat`)."""

    def __repr__(self) -> str:
        return f"RepeatedDataset({self.source!r}, epochs={self.epochs})"


class UnbatchedDataset(UnbatchStage, Chainable[Any]):
    """The items of each batch of a dataset, one by one. The state is the source's at the
    current batch plus how many of its items were handed out, so a resume continues in the
    middle of a batch (re-reading that batch; a map below it maps it again)."""

    def __repr__(self) -> str:
        return f"UnbatchedDataset({self.source!r})"
