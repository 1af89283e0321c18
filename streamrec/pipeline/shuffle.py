"""A seeded record shuffle buffer with tf.data's semantics.

The buffer fills to ``buffer_size``; then every incoming record replaces a uniformly chosen
buffered one, which is handed on; at the end the rest leave in random order. The same seed and
epoch give the same order everywhere.
"""

from __future__ import annotations

import random
from collections.abc import AsyncGenerator, AsyncIterator

__all__ = ["shuffle_chunks"]


async def shuffle_chunks(
    chunks: AsyncIterator[list[bytes]], buffer_size: int, rng: random.Random
) -> AsyncGenerator[list[bytes], None]:
    """Chunks of the records of ``chunks``, shuffled through a buffer of ``buffer_size``."""
    if buffer_size < 1:
        raise ValueError(f"shuffle_buffer must be >= 1, not {buffer_size}")
    buffer: list[bytes] = []
    pick = rng.randrange
    async for chunk in chunks:
        out: list[bytes] = []
        append = out.append
        for record in chunk:
            if len(buffer) < buffer_size:
                buffer.append(record)
                continue
            index = pick(buffer_size)
            append(buffer[index])
            buffer[index] = record
        if out:
            yield out
    rng.shuffle(buffer)
    if buffer:
        yield buffer
