"""The one protocol every link of a dataset chain implements: :class:`Source`.

A chain starts at a root that reads storage (:class:`~streamrec.pipeline.dataset.Dataset`; a
mix of datasets implements the same protocol) and continues through transforms
(:mod:`streamrec.pipeline.transforms.chainable`: ``parse``, ``batch``, ``map``, ``filter``,
``take``, ``skip``, ``repeat``, ``unbatch``). Each transform reads the link below it through this
protocol only, and offers it to the link above, so links compose in any order.

How exact resume travels down a chain: a link reads its source with
``record_chunks(auto_consume=False, report_consumed=..., handed_out=...)`` and tells it with
``mark_consumed(n)`` how many of the source's items its own consumer has really taken (a
batch counts its records once the batch is handed out; a filter counts the records it
dropped before the item it hands out). The consumer at the top counts lazily; whenever any
link is asked for ``state_dict()`` it first calls the ``report_consumed`` hook it was given,
which makes the consumer report, link by link, down to the root. So ``state_dict()`` of any
link describes the position after the last item handed to the top consumer.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

if TYPE_CHECKING:
    from streamrec.pipeline.stats import Stats

__all__ = ["Source"]

T = TypeVar("T")


@runtime_checkable
class Source(Protocol[T]):
    """What a link of a dataset chain offers the link above it (and the PyTorch adapter).

    ``record_chunks`` yields the link's items in chunks (lists). With ``auto_consume=True`` a
    chunk counts as consumed once it is yielded; with ``False`` only what ``mark_consumed(n)``
    reports (in order, never more than was yielded) counts. ``report_consumed()`` is called
    before the link describes its position (the consumer makes its outstanding
    ``mark_consumed`` calls there); ``handed_out()`` says, without side effects, how many
    items the consumer has taken in this iteration (for ``stats.records``).

    ``state_dict()`` is JSON-serialisable; ``load_state_dict`` makes the next iteration
    continue from it. ``set_epoch`` chooses the epoch (``epoch`` tells it); a different epoch
    starts at its beginning. ``len()`` is the items of one epoch for this consumer, or a
    ``TypeError`` where unknown.
    """

    def record_chunks(
        self,
        *,
        auto_consume: bool = True,
        report_consumed: Callable[[], None] | None = None,
        handed_out: Callable[[], int] | None = None,
    ) -> AsyncGenerator[list[T], None]:
        """The items in reading order, as chunks (see the class documentation)."""
        ...

    def mark_consumed(self, n: int) -> None:
        """``n`` more items of ``record_chunks(auto_consume=False)`` reached the consumer."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """The position after the last item consumed."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` on the next iteration."""
        ...

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch."""
        ...

    @property
    def epoch(self) -> int:
        """The epoch chosen."""
        ...

    @property
    def stats(self) -> Stats:
        """Counters of everything the chain read."""
        ...

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[T]: ...
