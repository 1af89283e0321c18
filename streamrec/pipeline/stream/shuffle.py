"""A seeded record shuffle buffer with tf.data's semantics.

The buffer fills to ``buffer_size``; then every incoming record replaces a uniformly chosen
buffered one, which is handed on; at the end the rest leave in random order. The same seed and
epoch give the same order everywhere.
"""

from __future__ import annotations

import random
from collections.abc import AsyncGenerator, AsyncIterator

from streamrec._portal import owned_generator
from streamrec.pipeline.position.draws import Draws
from streamrec.pipeline.position.events import Drain, Event, Piece, ShuffleIn

__all__ = ["shuffle_pieces"]


@owned_generator
async def shuffle_pieces(
    pieces: AsyncIterator[Piece],
    buffer_size: int,
    rng: random.Random,
    *,
    buffer: list[bytes] | None = None,
    draining: bool = False,
) -> AsyncGenerator[Piece, None]:
    """Pieces of the records of ``pieces``, shuffled through a buffer of ``buffer_size``.

    Each output piece's events wrap the input events it consumed
    (:class:`~streamrec.pipeline.position.events.ShuffleIn`) so a
    :class:`~streamrec.pipeline.position.trackers.ShuffleTracker` can mirror the buffer. A resumed
    shuffle starts from ``buffer`` (and ``rng``'s state); ``draining`` means the input had
    already ended: the buffer is handed on as it is.
    """
    if buffer_size < 1:
        raise ValueError(f"shuffle_buffer must be >= 1, not {buffer_size}")
    buffer = list(buffer or ())
    if draining:
        yield buffer, [Drain(False)]
        return
    # the draws of Draws.below, inlined (once per record): what the consumer's tracker mirrors
    getrandbits, bits = rng.getrandbits, buffer_size.bit_length()
    pending: list[Event] = []
    async for chunk, events in pieces:
        pending.append(ShuffleIn(events, list(map(len, chunk))))
        out: list[bytes] = []
        append = out.append
        for record in chunk:
            if len(buffer) < buffer_size:
                buffer.append(record)
                continue
            index = getrandbits(bits)
            while index >= buffer_size:
                index = getrandbits(bits)
            append(buffer[index])
            buffer[index] = record
        if out:
            yield out, pending
            pending = []
    Draws(rng, None).shuffle(buffer)
    pending.append(Drain(True))
    yield buffer, pending
