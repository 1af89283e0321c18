"""Reading an HTTP response body into pieces, without holding it twice.

``aiohttp``'s ``read()`` (and aiobotocore's ``Body.read()``, which calls it) gathers every
chunk of a body in a list and then joins them into one ``bytes``: for a moment the whole body
exists twice, and a block of 8 MiB costs 16 MiB. :func:`read_pieces` keeps the chunks as they
arrive instead (up to 256 KiB each, what asyncio reads off a socket at once), joining only
chunks smaller than :data:`~streamrec.storage.base.PIECE_BYTES` (a slow link's trickle) until
they make that size: joining every chunk into 1 MiB pieces, as before, was a copy of every byte
read (~0.15-0.25 s of CPU per GB here, a fifth of the reader's cost on loopback).

:func:`capped_answers` is the ``response_class`` of the aiohttp sessions that send a client's
requests (S3's :class:`~streamrec.storage.s3.session.NoRedirectSender`, Azure's transport):
an answer the client reads whole (a listing page, an error, a multipart upload's XML: never
an object's bytes, which stream) is read to at most a bound, past which it is
:class:`AnswerTooLong`, not a body of any length held in memory.
"""

from __future__ import annotations

import functools
import re
import time
from typing import Any

from streamrec.errors import ObjectChangedError, StorageError
from streamrec.redact import redact
from streamrec.storage import timing
from streamrec.storage.base import PIECE_BYTES, ObjectInfo
from streamrec.storage.translate import from_status, translate

__all__ = [
    "ERROR_ANSWER_BYTES",
    "ERROR_DETAIL_BYTES",
    "AnswerTooLong",
    "capped_answers",
    "error_detail",
    "read_at_most",
    "parse_content_range",
    "get_range",
    "ranges_ignored",
    "read_pieces",
    "read_pieces_within",
    "too_long",
]

_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)")

ERROR_DETAIL_BYTES = 4 << 10
"""Most bytes of an error answer's body read (for the excerpt its error quotes)."""
ERROR_ANSWER_BYTES = 64 << 10
"""Most bytes of an error answer a client's session reads (S3's and Azure's error documents
are a few hundred bytes: the door reads as much, ``ERROR_BODY_BYTES``)."""


async def error_detail(content: Any, limit: int = ERROR_DETAIL_BYTES) -> str:
    """The start of an error answer's body, off an ``aiohttp.StreamReader``: at most
    ``limit`` bytes are read, never the rest (a 500 may come with any body: the connection
    is dropped with the response, as aiohttp drops one whose body was not read to its end)."""
    return (await read_at_most(content, limit)).decode("utf-8", "replace")


async def read_at_most(content: Any, limit: int) -> bytes:
    """The first ``limit`` bytes of an ``aiohttp.StreamReader`` (all of a shorter body)."""
    pieces: list[bytes] = []
    left = limit
    while left > 0:
        piece = await content.read(left)
        if not piece:
            break
        pieces.append(piece)
        left -= len(piece)
    return b"".join(pieces)


async def read_pieces(
    content: Any, piece_bytes: int = PIECE_BYTES, *, limit: int | None = None, what: str = ""
) -> list[bytes]:
    """The rest of an ``aiohttp.StreamReader`` as pieces: its chunks as they arrive, those
    smaller than ``piece_bytes`` joined until they make ``piece_bytes``.

    With ``limit``, a body longer than ``limit`` bytes raises a (not transient)
    :class:`~streamrec.errors.StorageError`, its message starting with ``what``, as soon as a
    chunk goes past it, before that chunk is kept: memory stays within what was asked for
    whatever the server sends.
    Errors (a connection reset or a truncated body) propagate; the caller translates them.
    """
    pieces = await read_pieces_within(content, limit, piece_bytes)
    if pieces is None:
        raise StorageError(f"{what}: {too_long(limit)}")
    return pieces


def too_long(limit: int | None) -> str:
    """What is wrong with a body longer than the ``limit`` bytes a range GET asked for."""
    return (
        f"the server sent more than the {limit} bytes asked for "
        "(it ignored the Range header, or its Content-Length is wrong)"
    )


async def read_pieces_within(
    content: Any, limit: int | None, piece_bytes: int = PIECE_BYTES
) -> list[bytes] | None:
    """:func:`read_pieces`, but None (the rest of the body left unread) as soon as the body
    goes past ``limit`` bytes: for the callers that have another way when it does."""
    pieces: list[bytes] = []
    pending: list[bytes] = []
    pending_bytes = 0
    total = 0
    while True:
        chunk: bytes = await content.readany()
        if not chunk:
            break
        total += len(chunk)
        if limit is not None and total > limit:
            return None
        if not pending and len(chunk) >= piece_bytes:
            pieces.append(chunk)  # kept as it is: no copy
            continue
        pending.append(chunk)
        pending_bytes += len(chunk)
        if pending_bytes >= piece_bytes:
            pieces.append(pending[0] if len(pending) == 1 else b"".join(pending))
            pending, pending_bytes = [], 0
    if pending:
        pieces.append(pending[0] if len(pending) == 1 else b"".join(pending))
    return pieces


def ranges_ignored(obj: ObjectInfo, start: int, end: int) -> StorageError:
    """The error for a server that answered a range GET with the whole object (200)."""
    return StorageError(
        f"{obj.url}: the server ignored the Range header (asked for bytes {start}-{end - 1} of "
        f"{obj.size}, it answered 200 with the whole object); streamrec reads objects in "
        "ranges and needs a server that answers 206 Partial Content"
    )


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


PROBE_STATUSES = frozenset({200, 206, 416})
"""Answers to a probing range GET that are not errors (416: the object is empty)."""


def probed_size(
    status: int, content_range: str | None, content_length: int | None, length: int
) -> int | None:
    """The object's size from the answer (one of :data:`PROBE_STATUSES`) to a GET of its first
    ``length`` bytes; None when the answer cannot tell (empty, ranges ignored on a big object,
    transcoded): the caller looks the object up instead."""
    parsed = parse_content_range(content_range)
    if status == 206 and parsed is not None and parsed[2] is not None:
        return parsed[2]
    if status == 200 and (content_length or length + 1) <= length:
        return content_length or 0  # the whole (small) object
    return None


async def probe_first_bytes(
    session: Any,
    request_url: str,
    url: str,
    headers: dict[str, str],
    length: int,
    version_header: str,
) -> tuple[ObjectInfo, list[bytes]] | None:
    """GET ``request_url`` (the object ``url``) with ``headers`` asking for its first ``length``
    bytes, on an aiohttp ``session``: the object (size from the answer, version from the
    ``version_header`` response header) and those bytes, or None when the answer cannot tell
    the size or holds more than was asked (the caller looks the object up instead)."""
    action = "reading its first bytes"
    try:
        async with session.get(request_url, headers=headers) as response:
            status = response.status
            version = response.headers.get(version_header)
            if status not in PROBE_STATUSES:
                raise from_status(status, url, action, await error_detail(response.content))
            size = probed_size(
                status, response.headers.get("Content-Range"), response.content_length, length
            )
            if size is None:
                return None  # empty, transcoded or no ranges
            pieces = await read_pieces_within(response.content, length)
    except StorageError:
        raise
    except Exception as exc:
        raise translate(exc, url, action) from exc
    if pieces is None:
        return None  # more than was asked: look the object up instead
    return ObjectInfo(url, size, version), pieces


async def get_range(
    session: Any,
    request_url: str,
    obj: ObjectInfo,
    start: int,
    end: int,
    headers: dict[str, str],
    version_header: str,
) -> list[bytes]:
    """Bytes ``start:end`` of ``obj`` as pieces, by a GET of ``request_url`` with ``headers``
    (the ``Range`` added here) on an aiohttp ``session``: an error answer is its error (its
    first bytes as the detail), a version other than ``obj.version`` in the
    ``version_header`` answer header is :class:`~streamrec.errors.ObjectChangedError` (not
    every server honours a conditional request), a 200 to a partial range is
    :func:`ranges_ignored`, and a body longer than the range is an error before it is kept."""
    action = f"reading bytes {start}-{end - 1}"
    headers = {**headers, "Range": f"bytes={start}-{end - 1}"}
    try:
        asked = time.perf_counter()
        async with session.get(request_url, headers=headers) as response:
            timing.first_byte(time.perf_counter() - asked)  # (aiohttp: once the headers came)
            status = response.status
            if status not in (200, 206):
                raise from_status(status, obj.url, action, await error_detail(response.content))
            served = response.headers.get(version_header)
            if obj.version and served and served != obj.version:
                raise ObjectChangedError(f"{obj.url}: the object changed while it was being read")
            if status == 200 and (start, end) != (0, obj.size):
                raise ranges_ignored(obj, start, end)
            return await read_pieces(
                response.content, limit=end - start, what=f"{obj.url}: {action}"
            )
    except StorageError:
        raise
    except Exception as exc:
        raise translate(exc, obj.url, action) from exc


class AnswerTooLong(ValueError):
    """An answer read whole (no object's bytes) longer than any such answer is: refused
    before the rest of it is read (its connection dropped)."""


@functools.cache
def capped_answers(limit_bytes: int) -> type[Any]:
    """A subclass of ``aiohttp.ClientResponse`` (a session's public ``response_class``) whose
    ``read()``, what aiobotocore and azure-core call for an answer they take whole, reads at
    most ``limit_bytes`` of the body: a longer one (its ``Content-Length`` or what arrives) is
    :class:`AnswerTooLong` naming the url. Of an error answer (3xx-5xx) it reads the first
    :data:`ERROR_ANSWER_BYTES`, the rest dropped with the connection (as the clients'
    parsers take it: its status decides where its document is cut short). Streamed bodies
    (``content``) are left alone, and a ``HEAD``'s ``Content-Length`` (the object's) is not
    taken for its body. aiohttp's own ``text()`` and ``json()`` are not used on it (the
    clients decode what ``read()`` gave)."""
    import aiohttp

    class CappedAnswer(aiohttp.ClientResponse):
        async def read(self) -> bytes:
            if self.status >= 300:  # its Code and Message come first: the rest dropped
                try:
                    body = await read_at_most(self.content, ERROR_ANSWER_BYTES)
                finally:
                    if self.content.at_eof():
                        self.release()
                    else:
                        self.close()
                return body
            length = self.content_length
            if self.method != "HEAD" and length is not None and length > limit_bytes:
                self.close()
                raise AnswerTooLong(_too_long_answer(self, length, limit_bytes))
            pieces: list[bytes] = []
            left = limit_bytes
            try:
                while piece := await self.content.read(left + 1):
                    left -= len(piece)
                    if left < 0:  # (refused before its pieces are joined)
                        raise AnswerTooLong(_too_long_answer(self, None, limit_bytes))
                    pieces.append(piece)
            except BaseException:
                self.close()
                raise
            self.release()  # (at its end: the connection goes back to the pool)
            return b"".join(pieces)

    return CappedAnswer


def _too_long_answer(response: Any, length: int | None, limit_bytes: int) -> str:
    """What refused ``response`` says: its request (a signature in its url redacted), its
    length (None: more than the bound) and the bound."""
    size = f"more than {limit_bytes:,}" if length is None else f"{length:,}"
    return (
        f"{response.method} {redact(str(response.url))}: an answer of {size} bytes, refused: "
        f"an answer read whole is at most {limit_bytes:,} bytes (no listing page, error or "
        "upload answer is longer)"
    )
