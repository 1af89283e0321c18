"""``.take(n)`` and ``.skip(n)``: the first ``n`` items of each epoch, or all but them.

Both cut chunks by list slicing (no per-item work) and count in their state the items taken or
skipped so far. A take closes its source (cancelling its reads) as soon as it has ``n`` items;
a skip's dropped items count as consumed as they are dropped (``repeat`` uses it to drop the
items of a pass read again on resume).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any, TypeVar

from streamrec._portal import owned_generator
from streamrec.pipeline.transforms.ledger import ItemPiece, Ledger
from streamrec.pipeline.transforms.stage import Chunks, Stage, check_count, non_negative_int

__all__ = ["SkipStage", "TakeStage", "skip_pieces", "take_pieces"]

T = TypeVar("T")


class TakeStage(Stage[T]):
    """The first ``n`` items of each epoch; state: ``{"take": {"taken": k}, "source": ...}``."""

    state_key = "take"

    def __init__(self, source: Any, n: int) -> None:
        super().__init__(source)
        self.n = non_negative_int(n, "take(n): n")

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


class SkipStage(Stage[T]):
    """All but the first ``n`` items of each epoch; state: ``{"skip": {"skipped": k}, ...}``."""

    state_key = "skip"

    def __init__(self, source: Any, n: int) -> None:
        super().__init__(source)
        self.n = non_negative_int(n, "skip(n): n")

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
