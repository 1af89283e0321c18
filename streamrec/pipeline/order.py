"""The order of an indexed epoch: which record each position holds, and who reads it (sans-I/O).

With every shard indexed, the records are numbered ``0 .. N-1`` (shard by shard, in listing
order: :class:`~streamrec.pipeline.indexed.table.RecordTable`) and an epoch is a fixed
sequence of positions ``0 .. N-1``, each holding one record, decided by ``(seed, epoch)`` alone:

* ``"none"``: position ``p`` holds record ``p``;
* ``"global"``: a pseudo-random permutation of all records (a keyed Feistel network with cycle
  walking: any position's record in O(1), no table of N entries);
* ``"block"``: windows of ``window`` consecutive records are permuted, then the records of
  each run of ``mix`` positions are permuted among themselves (a shuffle "buffer" of ``mix``
  records drawn from ``mix / window`` windows, decided by position, not by timing). Reads
  fetch whole windows (coalesced range reads), so small records keep the link busy.

Consumers (hosts x DataLoader workers) read contiguous *parts* of the sequence of positions
still to read. Because the sequence is fixed, a consumer's progress is one number (positions
taken from its part), and the positions not yet consumed are a short list of intervals: any
number of consumers can continue from them (:func:`remaining_after`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

__all__ = [
    "EpochOrder",
    "Intervals",
    "Part",
    "feistel_permute",
    "part_of",
    "remaining_after",
]

Int64Array = npt.NDArray[np.int64]
Intervals = list[tuple[int, int]]
"""Half-open intervals ``[start, end)`` of positions, sorted, disjoint."""

ShuffleKind = Literal["none", "global", "block"]
_ROUNDS = 4


def _keys(*parts: object) -> list[np.uint64]:
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8 * _ROUNDS).digest()
    return [np.uint64(int.from_bytes(digest[8 * k : 8 * k + 8], "little")) for k in range(_ROUNDS)]


def _mix(x: npt.NDArray[np.uint64], key: np.uint64) -> npt.NDArray[np.uint64]:
    """A 64-bit mixing function (splitmix64's finaliser) of ``x ^ key``."""
    with np.errstate(over="ignore"):
        z = x ^ key
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        out: npt.NDArray[np.uint64] = z ^ (z >> np.uint64(31))
        return out


def _network(n: int) -> tuple[np.uint64, np.uint64]:
    bits = max(2, int(n - 1).bit_length())
    bits += bits % 2
    return np.uint64(bits // 2), np.uint64((1 << (bits // 2)) - 1)


def feistel_permute(
    values: Int64Array,
    n: int,
    keys: Sequence[np.uint64],
    tweak: npt.NDArray[np.uint64] | None = None,
    *,
    inverse: bool = False,
) -> Int64Array:
    """A keyed permutation of ``0 .. n-1`` applied to ``values`` (each in that range); a
    different one for each ``tweak`` value (per element); ``inverse``: the inverse permutation.

    A balanced Feistel network over the smallest even number of bits covering ``n`` is a
    permutation of ``0 .. 2**bits - 1``; values it maps to ``n`` or beyond are mapped again
    (cycle walking) until they land inside, which keeps it a permutation of ``0 .. n-1``.
    """
    if n <= 1:
        return np.array(values, dtype=np.int64)
    half, mask = _network(n)
    out = values.astype(np.uint64)
    tweaks = np.zeros(len(out), dtype=np.uint64) if tweak is None else tweak.astype(np.uint64)
    order = list(reversed(keys)) if inverse else list(keys)
    todo = np.arange(len(out))
    while len(todo):
        x, t = out[todo], tweaks[todo]
        left, right = x >> half, x & mask
        for key in order:
            if inverse:
                left, right = right ^ (_mix(left ^ t, key) & mask), left
            else:
                left, right = right, left ^ (_mix(right ^ t, key) & mask)
        x = (left << half) | right
        out[todo] = x
        todo = todo[x >= np.uint64(n)]
    return out.astype(np.int64)


@dataclass(frozen=True)
class EpochOrder:
    """The record at each position of one epoch (see the module docstring)."""

    records: int
    shuffle: ShuffleKind = "none"
    seed: int = 0
    epoch: int = 0
    window: int = 1  # "block": records per window
    mix: int = 1  # "block": positions permuted among themselves

    def __post_init__(self) -> None:
        if self.window < 1 or self.mix < 1:
            raise ValueError("window and mix must be >= 1")

    def records_at(self, positions: Int64Array) -> Int64Array:
        """The record each of ``positions`` (in ``0 .. records-1``) holds."""
        n = self.records
        if self.shuffle == "none" or n <= 1:
            return np.array(positions, dtype=np.int64)
        if self.shuffle == "global":
            return feistel_permute(positions, n, _keys("global", self.seed, self.epoch))
        return self._block(positions)

    def _block(self, positions: Int64Array) -> Int64Array:
        n, w, m = self.records, self.window, self.mix
        # 1. within runs of ``mix`` positions (the last run may be shorter): a different
        #    permutation of each run (its number is the tweak)
        run = positions // m
        start = run * m
        size = np.minimum(m, n - start)
        mixed = np.empty_like(positions)
        for length in np.unique(size).tolist():
            chosen = size == length
            keys = _keys("mix", self.seed, self.epoch, length)
            within = positions[chosen] - start[chosen]
            tweak = run[chosen].astype(np.uint64)
            mixed[chosen] = start[chosen] + feistel_permute(within, length, keys, tweak)
        # 2. windows in permuted order; the last window (maybe short) is placed like any other
        windows = -(-n // w)
        short = n - (windows - 1) * w  # records in the last window
        keys = _keys("windows", self.seed, self.epoch)
        last = np.array([windows - 1], dtype=np.int64)
        last_at = int(feistel_permute(last, windows, keys, inverse=True)[0])
        before_short = mixed < last_at * w
        in_short = (~before_short) & (mixed < last_at * w + short)
        after = ~(before_short | in_short)
        shifted = mixed - last_at * w - short
        slot = np.where(before_short, mixed // w, np.where(in_short, last_at, 0))
        slot = np.where(after, last_at + 1 + shifted // w, slot)
        offset = np.where(before_short, mixed % w, np.where(in_short, mixed - last_at * w, 0))
        offset = np.where(after, shifted % w, offset)
        window_ids = feistel_permute(slot.astype(np.int64), windows, keys)
        return window_ids * w + offset


@dataclass(frozen=True)
class Part:
    """A consumer's share of the positions: ``intervals`` in reading order, ``length`` of them
    in all (``pad``: more than the intervals hold; the extra positions wrap around to the
    start of all the intervals, so that every consumer reads the same number)."""

    intervals: Intervals
    length: int

    def positions(self, start: int, stop: int, pool: Intervals) -> Int64Array:
        """Positions ``start .. stop-1`` of this part (``pool``: every consumer's intervals,
        whose start the padding wraps around to)."""
        held = sum(b - a for a, b in self.intervals)
        own = _take(self.intervals, start, min(stop, held))
        if stop <= held:
            return own
        total = sum(b - a for a, b in pool)
        wrapped = [(k - held) % total for k in range(max(start, held), stop)]
        return np.concatenate([own, _take_each(pool, wrapped)])


def _take(intervals: Intervals, start: int, stop: int) -> Int64Array:
    pieces: list[Int64Array] = []
    before = 0
    for a, b in intervals:
        length = b - a
        lo, hi = max(start - before, 0), min(stop - before, length)
        if lo < hi:
            pieces.append(np.arange(a + lo, a + hi, dtype=np.int64))
        before += length
        if before >= stop:
            break
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)


def _take_each(intervals: Intervals, ranks: Sequence[int]) -> Int64Array:
    return np.array([int(_take(intervals, r, r + 1)[0]) for r in ranks], dtype=np.int64)


def part_of(
    remaining: Intervals, consumers: int, consumer: int, even: Literal[None, "drop", "pad"] = None
) -> Part:
    """Consumer ``consumer``'s part of the positions ``remaining``: contiguous, the first
    ``total % consumers`` parts one longer. ``even="drop"``: every part ``total // consumers``
    long (the rest is not read this epoch); ``"pad"``: every part as long as the longest
    (short parts wrap around to the start)."""
    if not 0 <= consumer < consumers:
        raise ValueError(f"consumer {consumer} of {consumers}")
    total = sum(b - a for a, b in remaining)
    base, extra = divmod(total, consumers)
    start = consumer * base + min(consumer, extra)
    length = base + (consumer < extra)
    intervals = _slice(remaining, start, start + length)
    if even == "drop":
        intervals = _slice(intervals, 0, base)
        return Part(intervals, base)
    if even == "pad":
        return Part(intervals, base + (extra > 0))
    return Part(intervals, length)


def _slice(intervals: Intervals, start: int, stop: int) -> Intervals:
    out: Intervals = []
    before = 0
    for a, b in intervals:
        length = b - a
        lo, hi = max(start - before, 0), min(stop - before, length)
        if lo < hi:
            out.append((a + lo, a + hi))
        before += length
    return out


def remaining_after(remaining: Intervals, consumers: int, taken: Sequence[int]) -> Intervals:
    """The positions of ``remaining`` not yet consumed once each of ``consumers`` consumers
    (parts as :func:`part_of` gives them, without padding) took the first ``taken[c]``
    positions of its part."""
    if len(taken) != consumers:
        raise ValueError(f"{len(taken)} counts for {consumers} consumers")
    out: Intervals = []
    for consumer, count in enumerate(taken):
        part = part_of(remaining, consumers, consumer)
        held = sum(b - a for a, b in part.intervals)
        if not 0 <= count <= held:
            raise ValueError(f"consumer {consumer} took {count} of its {held} positions")
        out += _slice(part.intervals, count, held)
    return _merged(out)


def _merged(intervals: Intervals) -> Intervals:
    out: Intervals = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        elif a < b:
            out.append((a, b))
    return out
