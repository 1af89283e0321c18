"""What each transform does, as a :class:`~streamrec.pipeline.transforms.stage.Stage`: its pieces,
its length, its own counters. The public classes (with the chaining methods) are in
:mod:`streamrec.pipeline.transforms.chainable`; :class:`RepeatStage` is in
:mod:`streamrec.pipeline.transforms.repeat`.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from streamrec.errors import ExampleError
from streamrec.pipeline.transforms.ledger import ItemPiece, Ledger
from streamrec.pipeline.transforms.mapper import WorkerType, check_picklable, map_in_workers
from streamrec.pipeline.transforms.pieces import (
    batch_pieces,
    filter_pieces,
    map_pieces,
    parse_pieces,
    skip_pieces,
    take_pieces,
    unbatch_pieces,
)
from streamrec.pipeline.transforms.stage import Stage, check_count

if TYPE_CHECKING:
    from streamrec.format.example import FeatureSpec

__all__ = [
    "BatchStage",
    "FilterStage",
    "MapStage",
    "ParseStage",
    "SkipStage",
    "TakeStage",
    "UnbatchStage",
]

T = TypeVar("T")
Chunks = AsyncGenerator[list[Any], None]


def _count(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{what} must be a non-negative int, not {value!r}")
    return value


class ParseStage(Stage[dict[str, Any]]):
    """Example payloads decoded with a spec, one dict per record."""

    def __init__(self, source: Any, spec: Mapping[str, FeatureSpec]) -> None:
        from streamrec.format.example import decode_batch

        super().__init__(source)
        decode_batch([], spec)  # a bad spec fails here, not in the first chunk
        self.spec = dict(spec)
        """The feature spec."""

    def _pieces(self, chunks: Chunks) -> AsyncGenerator[ItemPiece, None]:
        return parse_pieces(chunks, self.spec, self._placed)


class BatchStage(Stage[T]):
    """Batches of ``batch_size`` consecutive items."""

    def __init__(self, source: Any, batch_size: int, drop_remainder: bool = False) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, not {batch_size!r}")
        if isinstance(source, BatchStage):
            raise TypeError(f"cannot batch a {type(source).__name__} (unbatch() it first)")
        self.spec: dict[str, FeatureSpec] | None = None
        """The feature spec when the records are decoded per batch, else None."""
        if isinstance(source, ParseStage):  # decode each batch at once, not record by record
            super().__init__(source.source)
            self.spec = source.spec
        else:
            super().__init__(source)
        self.batch_size = batch_size
        self.drop_remainder = drop_remainder

    def __len__(self) -> int:
        """Batches this consumer gets in one epoch: ``len(source) / batch_size``, rounded up
        (the shorter last batch), or down with ``drop_remainder``."""
        records = super().__len__()
        if self.drop_remainder:
            return records // self.batch_size
        return -(-records // self.batch_size)

    def _finish(self, records: list[Any]) -> Any:
        if self.spec is None:
            return records
        from streamrec.format.example import decode_batch

        try:
            return decode_batch(records, self.spec)
        except ExampleError as error:
            if error.batch_index is not None:  # say where the record is, not "of the batch"
                self._placed(error, records[error.batch_index])
            raise

    def _pieces(self, chunks: Chunks) -> AsyncGenerator[ItemPiece, None]:
        return batch_pieces(chunks, self.batch_size, self.drop_remainder, self._finish)


class MapStage(Stage[T]):
    """``fn`` on each item, inline or on worker threads or processes, in order."""

    def __init__(
        self,
        source: Any,
        fn: Callable[[Any], T],
        num_workers: int = 0,
        worker_type: WorkerType = "thread",
        mp_context: str | None = None,
        task_items: int = 256,
    ) -> None:
        super().__init__(source)
        if not callable(fn):
            raise TypeError(f"map needs a callable, not {type(fn).__name__}")
        if worker_type not in ("thread", "process"):
            raise ValueError(f"worker_type must be 'thread' or 'process', not {worker_type!r}")
        if _count(num_workers, "num_workers") and worker_type == "process":
            check_picklable(fn)
        if _count(task_items, "task_items") < 1:
            raise ValueError("task_items must be at least 1")
        self.fn = fn
        self.num_workers = num_workers
        self.worker_type: WorkerType = worker_type
        self.mp_context = mp_context
        self.task_items = task_items

    def _pieces(self, chunks: Chunks) -> AsyncGenerator[ItemPiece, None]:
        if not self.num_workers:
            return map_pieces(chunks, self.fn)
        return map_in_workers(
            chunks,
            self.fn,
            self.num_workers,
            self.worker_type,
            mp_context=self.mp_context,
            task_items=self.task_items,
        )


class FilterStage(Stage[T]):
    """The items a predicate keeps."""

    def __init__(self, source: Any, predicate: Callable[[T], Any]) -> None:
        super().__init__(source)
        if not callable(predicate):
            raise TypeError(f"filter needs a callable, not {type(predicate).__name__}")
        self.predicate = predicate

    def __len__(self) -> int:
        """Unknown until read: a TypeError, like ``len()`` of an object without a length."""
        raise TypeError(f"len() of a filtered dataset is unknown ({self!r})")

    def _pieces(self, chunks: Chunks) -> AsyncGenerator[ItemPiece, None]:
        return filter_pieces(chunks, self.predicate)


class TakeStage(Stage[T]):
    """The first ``n`` items of each epoch; state: ``{"take": {"taken": k}, "source": ...}``."""

    state_key = "take"

    def __init__(self, source: Any, n: int) -> None:
        super().__init__(source)
        self.n = _count(n, "take(n): n")

    def __len__(self) -> int:
        """``min(n, len(source))``."""
        return min(self.n, super().__len__())

    def _initial(self) -> dict[str, int]:
        return {"taken": 0}

    def _counters(self, ledger: Ledger) -> dict[str, int]:
        return {"taken": self._base["taken"] + ledger.items}

    def _check(self, counters: dict[str, Any]) -> dict[str, int]:
        return {"taken": check_count(counters, "taken", "take", self.n)}

    def _pieces(self, chunks: Chunks) -> AsyncGenerator[ItemPiece, None]:
        return take_pieces(chunks, self.n - self._base["taken"])


class SkipStage(Stage[T]):
    """All but the first ``n`` items of each epoch; state: ``{"skip": {"skipped": k}, ...}``."""

    state_key = "skip"

    def __init__(self, source: Any, n: int) -> None:
        super().__init__(source)
        self.n = _count(n, "skip(n): n")

    def __len__(self) -> int:
        """``max(0, len(source) - n)``."""
        return max(0, super().__len__() - self.n)

    def _initial(self) -> dict[str, int]:
        return {"skipped": 0}

    def _counters(self, ledger: Ledger) -> dict[str, int]:
        return {"skipped": min(self.n, self._base["skipped"] + ledger.upstream)}

    def _check(self, counters: dict[str, Any]) -> dict[str, int]:
        return {"skipped": check_count(counters, "skipped", "skip", self.n)}

    def _pieces(self, chunks: Chunks) -> AsyncGenerator[ItemPiece, None]:
        return skip_pieces(chunks, self.n - self._base["skipped"])


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
