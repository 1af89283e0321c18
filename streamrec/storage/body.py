"""Reading an HTTP response body into pieces, without holding it twice.

``aiohttp``'s ``read()`` (and aiobotocore's ``Body.read()``, which calls it) gathers every
chunk of a body in a list and then joins them into one ``bytes``: for a moment the whole body
exists twice, and a block of 8 MiB costs 16 MiB. :func:`read_pieces` keeps the chunks as they
arrive instead, joined only up to about :data:`~streamrec.storage.base.PIECE_BYTES` at a time.
"""

from __future__ import annotations

import re
from typing import Any

from streamrec.storage.base import PIECE_BYTES

__all__ = ["parse_content_range", "read_pieces"]

_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)")


async def read_pieces(content: Any, piece_bytes: int = PIECE_BYTES) -> list[bytes]:
    """The rest of an ``aiohttp.StreamReader`` as pieces of about ``piece_bytes``.

    Errors (a connection reset or a truncated body) propagate; the caller translates them.
    """
    pieces: list[bytes] = []
    pending: list[bytes] = []
    pending_bytes = 0
    while True:
        chunk: bytes = await content.readany()
        if not chunk:
            break
        pending.append(chunk)
        pending_bytes += len(chunk)
        if pending_bytes >= piece_bytes:
            pieces.append(pending[0] if len(pending) == 1 else b"".join(pending))
            pending, pending_bytes = [], 0
    if pending:
        pieces.append(pending[0] if len(pending) == 1 else b"".join(pending))
    return pieces


def parse_content_range(value: str | None) -> tuple[int, int, int | None] | None:
    """``(first, last, total)`` of a ``Content-Range: bytes first-last/total`` header
    (``total`` None when the server says ``*``); None when absent or not understood."""
    if not value:
        return None
    match = _CONTENT_RANGE.fullmatch(value.strip())
    if match is None:
        return None
    first, last, total = match.groups()
    return int(first), int(last), None if total == "*" else int(total)
