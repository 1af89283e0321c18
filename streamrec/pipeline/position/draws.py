"""The shuffle buffer's random draws, counted, so that a state names its generator in one number.

The buffer draws from ``random.Random`` (Mersenne Twister) seeded by ``(seed, epoch)``. Its
full state is 625 numbers (~7 KB of JSON); but a generator seeded with a known seed is also
exactly described by how many 32-bit words it has produced since, and ``getrandbits`` re-draws
those words in C (~10^8 a second). So the draws are made here, as ``randrange(n)`` and
``shuffle`` make them (one ``getrandbits(n.bit_length())`` until it is below ``n``), counting
the words they take; a state saves the count (up to :data:`WORDS_MOST`, a replay of a few
seconds at most) and the full state beyond it, or when the count is not known (a generator
restored from a full state, as states before version 3 saved it).
"""

from __future__ import annotations

import random
from collections.abc import MutableSequence
from typing import Any

__all__ = ["WORDS_MOST", "Draws", "restore"]

WORDS_MOST = 1 << 30
"""The most words a state names by their count (the replay on resume stays a few seconds:
a forged count cannot stall a resume for longer); a generator further on is saved in full."""

_REPLAY_WORDS = 1 << 16  # words re-drawn per getrandbits call (a 256 KiB integer each)


class Draws:
    """Draws from ``rng``, each as ``rng.randrange(n)`` and ``rng.shuffle`` would make it,
    counting the 32-bit words taken since the generator was seeded (``words``; None when not
    known)."""

    __slots__ = ("rng", "words")

    def __init__(self, rng: random.Random, words: int | None = 0) -> None:
        self.rng = rng
        self.words = words

    def below(self, n: int) -> int:
        """A uniform integer in ``[0, n)``, ``n`` >= 1 (as ``randrange(n)``)."""
        getrandbits = self.rng.getrandbits
        k = n.bit_length()
        r = getrandbits(k)
        calls = 1
        while r >= n:
            r = getrandbits(k)
            calls += 1
        if self.words is not None:
            self.words += calls * ((k + 31) >> 5)
        return r

    def shuffle(self, items: MutableSequence[Any]) -> None:
        """Shuffle ``items`` in place (as ``rng.shuffle``)."""
        below = self.below
        for i in reversed(range(1, len(items))):
            j = below(i + 1)
            items[i], items[j] = items[j], items[i]

    def saved(self) -> int | tuple[Any, ...]:
        """The generator as a state saves it: the count of words drawn, or its full state."""
        if self.words is not None and self.words <= WORDS_MOST:
            return self.words
        return self.rng.getstate()

    def copy(self) -> Draws:
        rng = random.Random()
        rng.setstate(self.rng.getstate())
        return Draws(rng, self.words)


def restore(rng: random.Random, saved: int | tuple[Any, ...]) -> Draws:
    """``rng`` (just seeded as the state's generator was) brought to where ``saved`` (from
    :meth:`Draws.saved`, checked by the state's parser) says, and its draws from there."""
    if not isinstance(saved, int):
        rng.setstate(saved)
        return Draws(rng, None)
    left = saved
    while left:
        step = min(left, _REPLAY_WORDS)
        rng.getrandbits(32 * step)  # (exactly ``step`` words, as drawn one by one)
        left -= step
    return Draws(rng, saved)
