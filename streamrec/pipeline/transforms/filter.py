"""``.filter(predicate)``: the items a predicate keeps.

A kept item costs the records dropped since the previous kept one and itself, so records
dropped before the last item handed out count as consumed and those after it do not (a resume
reads them again, and drops them). ``len()`` is unknown (a TypeError).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from typing import Any, TypeVar

from streamrec._portal import owned_generator
from streamrec.pipeline.transforms.ledger import ItemPiece
from streamrec.pipeline.transforms.stage import Chunks, Stage

__all__ = ["FilterStage", "filter_pieces"]

T = TypeVar("T")


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
