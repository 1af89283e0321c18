"""First-ready reading's finished shards, as ranges of ordinals: a state names them in a few
numbers however many shards there are (they finish nearly in plan order: a range grows, and a
few shards still being read stand between ranges)."""

from __future__ import annotations

import bisect

__all__ = ["Done", "add_done", "covered"]

_MAX = 2**63 - 1

Done = list[tuple[int, int]]
"""Finished shards as ranges of ordinals ``[first, end)``: ascending, disjoint, not touching."""


def add_done(done: Done, ordinal: int) -> None:
    """Shard ``ordinal`` finished: into its range (or a new one); nothing if it is in one."""
    k = bisect.bisect_right(done, (ordinal, _MAX))  # the ranges starting at or before it
    if k > 0 and done[k - 1][1] > ordinal:
        return
    before = k > 0 and done[k - 1][1] == ordinal
    after = k < len(done) and done[k][0] == ordinal + 1
    if before and after:
        done[k - 1 : k + 1] = [(done[k - 1][0], done[k][1])]
    elif before:
        done[k - 1] = (done[k - 1][0], ordinal + 1)
    elif after:
        done[k] = (ordinal, done[k][1])
    else:
        done.insert(k, (ordinal, ordinal + 1))


def covered(done: Done, ordinal: int) -> bool:
    """Whether ``ordinal`` is in one of the ranges."""
    k = bisect.bisect_right(done, (ordinal, _MAX))
    return k > 0 and done[k - 1][1] > ordinal
