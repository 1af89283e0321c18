"""``.repeat(epochs)``: the source again and again, one epoch per pass, resumable exactly.

Pass ``p`` reads the source at epoch ``first + p`` (``set_epoch`` before each pass; ``first``
is the source's epoch when ``repeat`` was called, or what ``set_epoch`` on the repeat says).
The state is ``{"repeat": {"pass": p, "skip": c}, "source": <the source's state>}``.

The links above may hold items of pass ``p`` when pass ``p + 1`` starts (a batch being
filled, a map reading ahead), and the source, now at the next epoch, can no longer describe
a position inside pass ``p``. So when a pass ends with items not yet consumed, the repeat
keeps the source's state of that moment (every item before them consumed) and counts how
many of them are consumed after it: the state is then that snapshot with ``skip`` = that
count, and a resume reads the rest of pass ``p`` from the snapshot, dropping ``skip`` items
(read again, not handed out), before the next passes.

A pass that yields nothing from its start ends the repeat (repeating an empty epoch forever
would never yield).
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncGenerator
from typing import Any, TypeVar

from streamrec._portal import owning
from streamrec.pipeline.transforms.ledger import Ledger
from streamrec.pipeline.transforms.slice import skip_pieces
from streamrec.pipeline.transforms.stage import Stage, check_count

__all__ = ["RepeatStage"]

T = TypeVar("T")


class RepeatStage(Stage[T]):
    """The source's epochs one after another (see the module documentation)."""

    state_key = "repeat"

    def __init__(self, source: Any, epochs: int | None = None) -> None:
        super().__init__(source)
        if epochs is not None and (
            isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 0
        ):
            raise ValueError(f"repeat(epochs): a non-negative int or None, not {epochs!r}")
        self.epochs = epochs
        self._first: int = getattr(source, "epoch", 0)
        self._pass = 0
        self._skip_base = 0
        # passes ended with items not consumed yet: [pass, source state then, consumed, items]
        self._tails: deque[list[Any]] = deque()
        self._deferred: dict[str, Any] | None = None  # a state to load (pickled mid-pass)

    def __len__(self) -> int:
        """``epochs * len(source)``; a TypeError for ``epochs=None`` (endless)."""
        if self.epochs is None:
            raise TypeError("len() of an endless repeat()")
        return self.epochs * len(self.source)

    @property
    def epoch(self) -> int:
        """The epoch of the first pass."""
        return self._first

    def set_epoch(self, epoch: int) -> None:
        """The epoch of the first pass (passes then read ``epoch``, ``epoch + 1``, ...); the
        next iteration starts at the first pass."""
        self._deferred = None
        self._resume = None
        self._ledger = None
        self._report = self._handed = None
        self._tails.clear()
        self._pass = 0
        self._first = epoch
        self.source.set_epoch(epoch)

    def _initial(self) -> dict[str, int]:
        return {"pass": 0, "skip": 0}

    def _counters(self, ledger: Ledger) -> dict[str, int]:
        return {"pass": self._pass, "skip": max(0, self._skip_base - ledger.upstream)}

    def _check(self, counters: dict[str, Any]) -> dict[str, int]:
        return {
            "pass": check_count(counters, "pass", "repeat", self.epochs),
            "skip": check_count(counters, "skip", "repeat", None),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (from :meth:`state_dict`) on the next iteration."""
        self._deferred = None
        self._tails.clear()
        super().load_state_dict(state)
        assert self._resume is not None
        self._first = self.source.epoch - self._resume["pass"]

    def state_dict(self) -> dict[str, Any]:
        """The position after the last item handed out (see the module documentation)."""
        if self._deferred is not None:
            return dict(self._deferred)
        self._report_down()
        if self._tails:
            pass_, snapshot, consumed, _ = self._tails[0]
            return {"repeat": {"pass": pass_, "skip": consumed}, "source": snapshot}
        return super().state_dict()

    def mark_consumed(self, n: int) -> None:
        """``n`` more items reached the consumer: first the rest of ended passes."""
        tails = self._tails
        while n and tails:
            tail = tails[0]
            k = min(n, tail[3] - tail[2])
            tail[2] += k
            n -= k
            if tail[2] == tail[3]:
                tails.popleft()
        if n:
            super().mark_consumed(n)

    async def record_chunks(
        self,
        *,
        auto_consume: bool = True,
        report_consumed: Any = None,
        handed_out: Any = None,
    ) -> AsyncGenerator[list[T], None]:
        """The passes' items in chunks (see
        :class:`~streamrec.pipeline.transforms.chain.Source`)."""
        if self._deferred is not None:
            self.load_state_dict(self._deferred)
        resume, self._resume = self._resume, None
        resumed = resume is not None and self._resume_epoch == self.source.epoch
        start = resume if resume is not None and resumed else self._initial()
        self._report = None if auto_consume else report_consumed
        self._handed = None if auto_consume else handed_out
        self._tails.clear()
        pass_, skip = start["pass"], start["skip"]
        source = self.source
        ledger: Ledger | None = None
        while self.epochs is None or pass_ < self.epochs:
            if ledger is not None:
                self._report_down()
                left = ledger.pending()
                if left:  # items of the last pass still in the links above: keep where
                    self._tails.append([pass_ - 1, source.state_dict(), 0, left])
            if not (resumed and pass_ == start["pass"]):
                source.set_epoch(self._first + pass_)
            self._pass, self._skip_base = pass_, skip
            ledger = self._ledger = Ledger()
            got = 0
            async with owning(skip_pieces(self._open_source(), skip)) as pieces:
                async for items, sizes, skipped in pieces:
                    consumed = ledger.add(len(items), sizes, skipped)
                    if auto_consume:
                        consumed += ledger.consume(len(items))
                    if consumed:
                        self._mark_source(consumed)
                    got += len(items)
                    if items:
                        yield items
            if not got and not skip and not (resumed and pass_ == start["pass"]):
                break  # an empty epoch
            pass_, skip = pass_ + 1, 0

    def __getstate__(self) -> dict[str, Any]:
        # mid-iteration with items of an ended pass outstanding: the source object is already
        # past them, so the copy loads the exact state (the snapshot) when it is first used
        tails = bool(self._tails)
        deferred = self.state_dict() if tails else self._deferred
        state = super().__getstate__()
        state["_tails"] = deque()
        state["_deferred"] = deferred
        return state
