"""Which source each draw of a mix takes from: counter-based, stratified, in numpy chunks.

Sans-I/O: a pure function of ``(seed, epoch, draw number, active sources)``, so a mix's
position is one integer (the draw counter) plus which sources are still active, and any draw is
computed in O(1) without replaying the ones before it.

Draws come in blocks of :data:`BLOCK`. Within a block, draw ``j`` gets the uniform number
``u = (stratum_j + jitter_j) / BLOCK``, where the strata are a permutation of ``0..BLOCK-1``
keyed by ``(seed, epoch, block)`` and the jitter a keyed hash of the draw number: every block
has exactly one ``u`` in each ``1/BLOCK`` of ``[0, 1)``, in random order. ``u`` picks the
source whose slice of the cumulative (active, renormalised) weights holds it. So each block's
counts are within one of ``weight x BLOCK`` for every source (realised proportions converge as
``1/draws``, not ``1/sqrt(draws)`` as independent draws would), while the order inside a block
is random. Exhausted sources drop out of the cumulative weights; the same ``u`` then falls on
the others in proportion to their weights (renormalised).

The keyed hash is SplitMix64's finaliser over ``draw number + key``: vectorised numpy uint64
arithmetic, the same on every platform.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

__all__ = ["BLOCK", "Draws", "check_weights", "first_stop_length", "mix_key"]

BLOCK = 256
"""Draws per stratified block."""

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_JITTER_SALT = np.uint64(0x5851F42D4C957F2D)

UIntArray = npt.NDArray[np.uint64]
IntArray = npt.NDArray[np.int64]


def mix_key(seed: int, epoch: int) -> int:
    """The 64-bit key of a mix's draws in ``epoch``."""
    digest = hashlib.blake2b(f"streamrec.mix:{seed}:{epoch}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def _hash(key: int, counters: UIntArray) -> UIntArray:
    """SplitMix64's output for each counter (wrapping uint64 arithmetic, vectorised)."""
    z = counters * _GOLDEN + np.uint64(key)
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))  # type: ignore[no-any-return]


def uniforms(key: int, first_block: int, blocks: int) -> npt.NDArray[np.float64]:
    """The stratified uniform numbers of draws ``first_block * BLOCK`` onward, ``blocks``
    whole blocks of them."""
    counters = np.arange(first_block * BLOCK, (first_block + blocks) * BLOCK, dtype=np.uint64)
    with np.errstate(over="ignore"):
        order = _hash(key, counters).reshape(blocks, BLOCK)
        jitter = _hash(key ^ int(_JITTER_SALT), counters) >> np.uint64(11)
    # argsort of random keys: a uniformly random permutation of the strata in each block
    strata = np.argsort(order, axis=1, kind="stable").ravel()
    fraction = jitter.astype(np.float64) * (1.0 / (1 << 53))
    return (strata + fraction) * (1.0 / BLOCK)  # type: ignore[no-any-return]


def check_weights(weights: Sequence[float] | None, sources: int) -> list[float]:
    """``weights`` as positive finite floats summing to 1 (None: equal), or ValueError."""
    if sources < 1:
        raise ValueError("mix needs at least one dataset")
    if weights is None:
        return [1.0 / sources] * sources
    values = [float(w) for w in weights]
    if len(values) != sources:
        raise ValueError(f"mix got {sources} datasets but {len(values)} weights")
    if not all(np.isfinite(w) and w > 0 for w in values):
        raise ValueError(f"mix weights must be positive and finite, not {list(weights)!r}")
    total = sum(values)
    return [w / total for w in values]


def choose(
    u: npt.NDArray[np.float64], weights: Sequence[float], active: Sequence[bool]
) -> IntArray:
    """The source each of ``u`` picks among the ``active`` ones (at least one)."""
    w = np.array([wi if on else 0.0 for wi, on in zip(weights, active, strict=True)])
    bounds = np.cumsum(w) / w.sum()
    last = max(i for i, on in enumerate(active) if on)
    bounds[last:] = 2.0  # rounding never sends a draw past the last active source
    # inactive sources have empty slices: side="right" steps over them
    return np.searchsorted(bounds, u, side="right").astype(np.int64)


class Draws:
    """The choices of a window of draws for one active set, with per-source running counts
    (so how far buffered records reach is a binary search, not a scan)."""

    WINDOW_BLOCKS = 16

    def __init__(
        self, key: int, first: int, weights: Sequence[float], active: Sequence[bool]
    ) -> None:
        first_block = first // BLOCK
        self.start = first_block * BLOCK
        """Draw number of ``choices[0]``."""
        u = uniforms(key, first_block, self.WINDOW_BLOCKS)
        self.choices = choose(u, weights, active)
        self.end = self.start + len(self.choices)
        sources = len(weights)
        onehot = self.choices[None, :] == np.arange(sources)[:, None]
        self.counts = np.cumsum(onehot, axis=1, dtype=np.int64)
        """``counts[i, k]``: draws of source ``i`` among ``choices[: k + 1]``."""

    def reach(self, draw: int, available: Sequence[int]) -> int:
        """The first draw at or after ``draw`` (within the window; ``end`` if none) whose
        source has no record left, when source ``i`` has ``available[i]`` records buffered."""
        offset = draw - self.start
        first = self.end
        for i, have in enumerate(available):
            row = self.counts[i]
            before = int(row[offset - 1]) if offset else 0
            k = int(np.searchsorted(row, before + have + 1, side="left"))
            first = min(first, self.start + k)
        return first


def first_stop_length(key: int, weights: Sequence[float], lengths: Sequence[int]) -> int:
    """Records a ``stop="first"`` mix yields: the draws before the first that picks a source
    with no record left (sources of ``lengths`` records). O(draws), in growing windows (up to
    a million draws at a time: ~10 ns per draw)."""
    left = np.array(lengths, dtype=np.int64)
    active = [True] * len(weights)
    draw, blocks = 0, 16
    while True:
        choices = choose(uniforms(key, draw // BLOCK, blocks), weights, active)
        counts = np.bincount(choices, minlength=len(weights))
        if np.all(counts <= left):
            left -= counts
            draw += len(choices)
            blocks = min(2 * blocks, 4096)
            continue
        stops = [
            int(np.flatnonzero(choices == i)[left[i]])
            for i in range(len(weights))
            if counts[i] > left[i]
        ]
        return draw + min(stops)
