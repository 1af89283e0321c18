"""A fault-injecting HTTP/1.1 proxy for loopback tests.

``FaultProxy(upstream_host, upstream_port)`` listens on a free loopback port and forwards every
client connection to the upstream server, parsing each HTTP/1.1 request and response
(Content-Length, chunked and read-until-close bodies; keep-alive; no pipelining). It runs an
asyncio server on its own event loop in its own thread, so it is started and stopped from
plain synchronous test code::

    with FaultProxy("127.0.0.1", server.port) as proxy:
        proxy.reset_mid_body(100, path="/data.bin", times=1)
        ... point the client at proxy.url ...
        assert proxy.faults[0].fired == 1

Fault plan. Each fault matches on ``method`` (e.g. "GET"), ``path`` (a substring of the request
target, or a compiled regex searched in it; the target includes the query string) and
``range_only`` (only requests that carry a Range header, or Azure's ``x-ms-range``), and
applies to the first ``times`` matching requests (None: all). Faults are tried in the order
they were added; the first one that matches and has budget left is applied. ``delay`` faults
are the exception: every matching delay applies, in addition to (before) the chosen fault.
``fault.fired`` counts how often a fault was actually applied; a fault that turns out not to
apply to a response (a short_206 on a 200, a reset_mid_body on a body no longer than
``after_bytes``) does not use up its budget. Faults may be added and cleared from any thread
while the proxy runs.

- ``reset_mid_body(after_bytes)``: send the response head and ``after_bytes`` body bytes, then
  reset the client connection (SO_LINGER 0: the client gets RST, not FIN).
- ``truncate_body(after_bytes)``: send the head and ``after_bytes`` body bytes, then close
  cleanly (FIN): the client sees fewer bytes than Content-Length.
- ``short_206(keep_bytes)``: turn a 206 into a *valid* shorter 206: only the first
  ``keep_bytes`` of the body, with Content-Length and Content-Range rewritten to match.
- ``status(code)``: answer ``code`` without contacting upstream (body by ``flavor``: S3 XML
  error such as SlowDown for "s3", a GCS JSON error for "gcs", an Azure XML error with its
  ``x-ms-error-code`` header (ServerBusy for 503/500) for "azure", plain text for "http").
- ``stall(seconds)``: send nothing for ``seconds`` (before the response, or after
  ``after_bytes`` body bytes), then carry on; stop() cancels a stall at once.
- ``delay(seconds)``: wait ``seconds`` before forwarding the request.

Rate limit. ``bytes_per_s_per_connection`` (a constructor argument, or set on a running proxy)
caps what each client connection receives, as a link whose every connection is held to that
bandwidth (a congestion window, a per-flow shaper): responses are paced out in pieces of
16 KiB by a token bucket of one piece per connection. Together with ``delay`` it emulates a
remote store: a round trip and a bandwidth per connection, so more connections move more.

``after_bytes`` counts body bytes as they go over the wire (for a chunked response that includes
the chunk framing). ``Location`` headers that point at the upstream are rewritten to point at
the proxy, so follow-up requests (e.g. GCS resumable upload sessions) also go through it.

``proxy.records`` lists every request (method, target, Range, headers, status sent, fault
applied) in order of arrival, ``proxy.count(method, path)`` counts them (e.g. a client's
retries), and
``proxy.errors`` holds unexpected exceptions inside the proxy itself (should stay empty).

Every wait is bounded: upstream reads and client writes time out, idle client connections are
dropped, and stop() cancels every connection task, closes every socket and joins the thread
(raising if it did not end in time).
"""

from __future__ import annotations

import asyncio
import builtins
import concurrent.futures
import contextlib
import dataclasses
import re
import socket
import struct
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from types import TracebackType
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit

__all__ = ["Fault", "FaultKind", "FaultProxy", "Flavor", "ProxyRecord"]

T = TypeVar("T")
FaultKind = Literal["reset_mid_body", "truncate_body", "short_206", "status", "stall", "delay"]
Flavor = Literal["http", "s3", "gcs", "azure"]

_HEAD_LIMIT = 1 << 20
_CHUNK = 1 << 16
_PACE_BYTES = 16 << 10  # the token bucket's piece (and burst) when a rate limit is set


class ProtocolError(Exception):
    """The peer sent something that is not HTTP/1.1 as we understand it."""


# --------------------------------------------------------------------------------------------
# the fault plan


@dataclass(eq=False)
class Fault:
    """One entry of the fault plan. Create through FaultProxy's methods; read ``fired``."""

    kind: FaultKind
    method: str | None = None
    path: str | re.Pattern[str] | None = None
    range_only: bool = False
    times: int | None = None
    after_bytes: int | None = None
    keep_bytes: int = 0
    code: int = 503
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes | None = None
    seconds: float = 0.0
    _fired: int = 0
    _reserved: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def fired(self) -> int:
        """How many requests this fault has been applied to."""
        with self._lock:
            return self._fired

    def matches(self, method: str, target: str, has_range: bool) -> bool:
        if self.method is not None and self.method.upper() != method.upper():
            return False
        if self.range_only and not has_range:
            return False
        if self.path is None:
            return True
        if isinstance(self.path, re.Pattern):
            return self.path.search(target) is not None
        return self.path in target

    def _reserve(self) -> bool:
        with self._lock:
            if self.times is not None and self._fired + self._reserved >= self.times:
                return False
            self._reserved += 1
            return True

    def _fire(self) -> None:
        """The reserved request got this fault."""
        with self._lock:
            self._reserved -= 1
            self._fired += 1

    def _release(self) -> None:
        """The reserved request did not get this fault after all: give the budget back."""
        with self._lock:
            self._reserved -= 1


@dataclass
class ProxyRecord:
    """One request seen by the proxy: what was asked, what the client got, which fault.

    Recorded when the request head arrives; ``status`` and ``fault`` are filled in as the
    response goes out (``status`` stays None if no response head was sent; ``done`` turns
    true when the proxy has finished with the request).
    """

    method: str
    target: str
    range: str | None
    status: int | None = None  # the status sent to the client
    fault: FaultKind | None = None  # the fault applied to this request, if any
    done: bool = False
    headers: dict[str, str] = field(default_factory=dict)  # the request's (names lower-cased)


# --------------------------------------------------------------------------------------------
# HTTP/1.1 messages


@dataclass
class _Message:
    start: str
    headers: list[tuple[str, str]]

    def get(self, name: str) -> str | None:
        lowered = name.lower()
        for key, value in self.headers:
            if key.lower() == lowered:
                return value
        return None

    def tokens(self, name: str) -> set[str]:
        lowered = name.lower()
        found: set[str] = set()
        for key, value in self.headers:
            if key.lower() == lowered:
                found.update(token.strip().lower() for token in value.split(","))
        return found

    def remove(self, name: str) -> None:
        lowered = name.lower()
        self.headers = [(k, v) for k, v in self.headers if k.lower() != lowered]

    def set(self, name: str, value: str) -> None:
        self.remove(name)
        self.headers.append((name, value))

    def serialize(self) -> bytes:
        lines = [self.start, *(f"{k}: {v}" for k, v in self.headers), "", ""]
        return "\r\n".join(lines).encode("latin-1")

    @property
    def version(self) -> str:
        return self.start.split(" ", 1)[0] if self.start.startswith("HTTP/") else self.start[-8:]

    def wants_close(self) -> bool:
        connection = self.tokens("Connection")
        if self.version == "HTTP/1.0":
            return "keep-alive" not in connection
        return "close" in connection


def _parse(head: bytes) -> _Message:
    text = head.decode("latin-1")
    lines = text.split("\r\n")
    start = lines[0]
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        if not line:
            continue
        if line[0] in " \t" and headers:  # obsolete line folding
            key, value = headers[-1]
            headers[-1] = (key, f"{value} {line.strip()}")
            continue
        key, sep, value = line.partition(":")
        if not sep:
            raise ProtocolError(f"bad header line {line!r}")
        headers.append((key.strip(), value.strip()))
    return _Message(start, headers)


@dataclass
class _Request:
    message: _Message
    method: str
    target: str

    @classmethod
    def parse(cls, head: bytes) -> _Request:
        message = _parse(head)
        parts = message.start.split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise ProtocolError(f"bad request line {message.start!r}")
        return cls(message, parts[0], parts[1])


@dataclass
class _Response:
    message: _Message
    status: int

    @classmethod
    def parse(cls, head: bytes) -> _Response:
        message = _parse(head)
        parts = message.start.split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise ProtocolError(f"bad status line {message.start!r}")
        return cls(message, int(parts[1]))


async def _read_head(reader: asyncio.StreamReader) -> bytes | None:
    """One message head (through the blank line), or None on a clean EOF before any byte."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as error:
        if not error.partial.strip():
            return None
        raise ProtocolError("connection closed inside a message head") from error
    except asyncio.LimitOverrunError as error:
        raise ProtocolError("message head too long") from error
    return head.lstrip(b"\r\n")


def _body_framing(message: _Message) -> tuple[str, int]:
    if "chunked" in message.tokens("Transfer-Encoding"):
        return "chunked", 0
    length = message.get("Content-Length")
    if length is not None:
        if not length.strip().isdigit():
            raise ProtocolError(f"bad Content-Length {length!r}")
        return "length", int(length)
    return "none", 0


def _response_framing(method: str, response: _Response) -> tuple[str, int]:
    if method == "HEAD" or response.status in (204, 304) or 100 <= response.status < 200:
        return "none", 0
    kind, length = _body_framing(response.message)
    return ("close", 0) if kind == "none" else (kind, length)


async def _iter_body(
    reader: asyncio.StreamReader, kind: str, length: int
) -> AsyncIterator[tuple[bytes, bytes]]:
    """Yield (wire bytes, payload bytes) pieces of a body framed as `kind`."""
    if kind == "length":
        remaining = length
        while remaining:
            piece = await reader.read(min(remaining, _CHUNK))
            if not piece:
                raise asyncio.IncompleteReadError(b"", remaining)
            remaining -= len(piece)
            yield piece, piece
    elif kind == "chunked":
        while True:
            line = await reader.readuntil(b"\r\n")
            size_text = line.split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError as error:
                raise ProtocolError(f"bad chunk size {line!r}") from error
            if size == 0:
                trailer = line
                while True:
                    trailer_line = await reader.readuntil(b"\r\n")
                    trailer += trailer_line
                    if trailer_line == b"\r\n":
                        break
                yield trailer, b""
                return
            yield line, b""
            remaining = size
            while remaining:
                piece = await reader.read(min(remaining, _CHUNK))
                if not piece:
                    raise asyncio.IncompleteReadError(b"", remaining)
                remaining -= len(piece)
                yield piece, piece
            crlf = await reader.readexactly(2)
            if crlf != b"\r\n":
                raise ProtocolError("chunk not followed by CRLF")
            yield crlf, b""
    elif kind == "close":
        while True:
            piece = await reader.read(_CHUNK)
            if not piece:
                return
            yield piece, piece


_S3_ERRORS = {
    400: ("BadRequest", "Bad Request"),
    403: ("AccessDenied", "Access Denied"),
    404: ("NoSuchKey", "The specified key does not exist."),
    429: ("SlowDown", "Please reduce your request rate."),
    500: ("InternalError", "We encountered an internal error. Please try again."),
    503: ("SlowDown", "Please reduce your request rate."),
}
_AZURE_ERRORS = {
    403: "AuthorizationFailure",
    404: "BlobNotFound",
    412: "ConditionNotMet",
    500: "ServerBusy",
    503: "ServerBusy",
}
_GCS_REASONS = {429: "rateLimitExceeded", 500: "backendError", 503: "backendError"}


def _error_body(flavor: Flavor, code: int) -> tuple[bytes, str]:
    try:
        phrase = HTTPStatus(code).phrase
    except ValueError:
        phrase = "Injected Fault"
    if flavor == "s3":
        name, message = _S3_ERRORS.get(code, ("InjectedFault", phrase))
        xml = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{name}</Code><Message>{message}</Message>"
            "<RequestId>FAULTPROXY</RequestId><HostId>faultproxy</HostId></Error>"
        )
        return xml.encode(), "application/xml"
    if flavor == "azure":
        name = _AZURE_ERRORS.get(code, "InjectedFault")
        xml = (
            '<?xml version="1.0" encoding="utf-8"?>'
            f"<Error><Code>{name}</Code><Message>{phrase} (injected)</Message></Error>"
        )
        return xml.encode(), "application/xml"
    if flavor == "gcs":
        reason = _GCS_REASONS.get(code, "injectedFault")
        json_text = (
            f'{{"error": {{"code": {code}, "message": "{phrase} (injected)", '
            f'"errors": [{{"message": "{phrase} (injected)", "domain": "global", '
            f'"reason": "{reason}"}}]}}}}'
        )
        return json_text.encode(), "application/json; charset=UTF-8"
    return f"{code} {phrase} (injected)\n".encode(), "text/plain; charset=utf-8"


_CONTENT_RANGE = re.compile(r"^\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*$")


class _Closed(Exception):
    """The client connection is finished (normally or by a fault)."""


# --------------------------------------------------------------------------------------------
# the proxy


class FaultProxy:
    """Fault-injecting HTTP/1.1 proxy in front of ``upstream_host:upstream_port``.

    ``flavor`` ("http", "s3" or "gcs") picks the body of injected error responses.
    Timeouts (seconds): ``connect_timeout`` to the upstream, ``upstream_timeout`` for each
    read from it, ``write_timeout`` for each write to the client, ``idle_timeout`` for a client
    connection between requests, ``stop_timeout`` for stop() as a whole.
    ``bytes_per_s_per_connection``: the most bytes per second sent to each client connection
    (None: no limit); may be changed while the proxy runs.
    """

    def __init__(
        self,
        upstream_host: str,
        upstream_port: int,
        *,
        flavor: Flavor = "http",
        host: str = "127.0.0.1",
        rewrite_location: bool = True,
        connect_timeout: float = 5.0,
        upstream_timeout: float = 30.0,
        write_timeout: float = 30.0,
        idle_timeout: float = 60.0,
        stop_timeout: float = 5.0,
        bytes_per_s_per_connection: float | None = None,
    ) -> None:
        if bytes_per_s_per_connection is not None and bytes_per_s_per_connection <= 0:
            raise ValueError(f"rate must be positive, not {bytes_per_s_per_connection}")
        self.bytes_per_s_per_connection = bytes_per_s_per_connection
        self.upstream_host = upstream_host
        self.upstream_port = upstream_port
        self.flavor: Flavor = flavor
        self.host = host
        self.rewrite_location = rewrite_location
        self.connect_timeout = connect_timeout
        self.upstream_timeout = upstream_timeout
        self.write_timeout = write_timeout
        self.idle_timeout = idle_timeout
        self.stop_timeout = stop_timeout
        self.port = 0
        self._lock = threading.Condition()  # notified when a record changes (wait_until)
        self._faults: list[Fault] = []
        self._records: list[ProxyRecord] = []
        self._errors: list[BaseException] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._transports: set[asyncio.BaseTransport] = set()

    @classmethod
    def for_url(cls, upstream_url: str, **kwargs: Any) -> FaultProxy:
        """A proxy in front of the host and port of `upstream_url` (not started)."""
        parts = urlsplit(upstream_url)
        if parts.scheme != "http" or parts.hostname is None:
            raise ValueError(f"FaultProxy needs an http:// URL, not {upstream_url!r}")
        return cls(parts.hostname, parts.port or 80, **kwargs)

    # lifecycle ---------------------------------------------------------------------------
    @property
    def url(self) -> str:
        if not self.port:
            raise RuntimeError("FaultProxy not started")
        return f"http://{self.host}:{self.port}"

    @property
    def upstream_url(self) -> str:
        return f"http://{self.upstream_host}:{self.upstream_port}"

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> FaultProxy:
        if self._thread is not None:
            raise RuntimeError("FaultProxy already started")
        loop = asyncio.new_event_loop()
        thread = threading.Thread(
            target=self._run_loop, args=(loop,), name=f"FaultProxy->{self.upstream_url}"
        )
        thread.daemon = True
        self._loop, self._thread = loop, thread
        thread.start()
        future = asyncio.run_coroutine_threadsafe(self._start_server(), loop)
        try:
            future.result(timeout=self.stop_timeout)
        except BaseException:
            self.stop()
            raise
        return self

    @staticmethod
    def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
        finally:
            # cancelled again until they end: a cancel can be lost (3.10/3.11's wait_for
            # swallows one that races its inner future), and a connection task left pending
            # when the loop closes is collected later, in another test, as a warning
            deadline = time.monotonic() + 5.0
            while (pending := asyncio.all_tasks(loop)) and time.monotonic() < deadline:
                for task in pending:
                    task.cancel()
                loop.run_until_complete(asyncio.wait(pending, timeout=0.5))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _start_server(self) -> None:
        self._server = await asyncio.start_server(
            self._client_connected, self.host, 0, limit=_HEAD_LIMIT
        )
        self.port = self._server.sockets[0].getsockname()[1]

    def stop(self) -> None:
        """Close the listener and every connection, stop the loop and join the thread."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        try:
            if thread.is_alive() and not loop.is_closed():
                future = asyncio.run_coroutine_threadsafe(self._shutdown(), loop)
                with contextlib.suppress(concurrent.futures.TimeoutError):
                    future.result(timeout=self.stop_timeout)
                with contextlib.suppress(RuntimeError):  # loop closed meanwhile
                    loop.call_soon_threadsafe(loop.stop)
            thread.join(self.stop_timeout)
        finally:
            self._loop = self._thread = None
        if thread.is_alive():
            raise RuntimeError("FaultProxy thread did not stop in time")

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        tasks = [task for task in self._tasks if not task.done()]
        for task in tasks:
            task.cancel()
        for transport in list(self._transports):
            _abort(transport)
        if tasks:
            await asyncio.wait(tasks, timeout=self.stop_timeout / 2)
        if self._server is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), self.stop_timeout / 4)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # the fault plan ----------------------------------------------------------------------
    def add(self, fault: Fault) -> Fault:
        with self._lock:
            self._faults.append(fault)
        return fault

    def remove(self, fault: Fault) -> None:
        with self._lock:
            self._faults = [f for f in self._faults if f is not fault]

    def clear(self) -> None:
        """Remove every fault (requests in flight keep the fault they already got)."""
        with self._lock:
            self._faults = []

    @property
    def faults(self) -> list[Fault]:
        with self._lock:
            return list(self._faults)

    @property
    def records(self) -> builtins.list[ProxyRecord]:
        """Every request seen so far, in order of arrival (copies, safe to keep)."""
        with self._lock:
            return [dataclasses.replace(record) for record in self._records]

    @property
    def errors(self) -> builtins.list[BaseException]:
        """Unexpected exceptions inside the proxy (bugs, not network trouble); should be []."""
        with self._lock:
            return list(self._errors)

    def clear_records(self) -> None:
        with self._lock:
            self._records.clear()

    def count(self, method: str | None = None, path: str | None = None) -> int:
        """How many requests were seen, optionally only those with `method` / `path` in target."""
        return sum(
            1
            for record in self.records
            if (method is None or record.method == method)
            and (path is None or path in record.target)
        )

    def reset_mid_body(
        self,
        after_bytes: int,
        *,
        method: str | None = None,
        path: str | re.Pattern[str] | None = None,
        range_only: bool = False,
        times: int | None = None,
    ) -> Fault:
        """Send the head and `after_bytes` body bytes, then RST the client connection."""
        _check_non_negative(after_bytes, "after_bytes")
        return self.add(
            Fault("reset_mid_body", method, path, range_only, times, after_bytes=after_bytes)
        )

    def truncate_body(
        self,
        after_bytes: int,
        *,
        method: str | None = None,
        path: str | re.Pattern[str] | None = None,
        range_only: bool = False,
        times: int | None = None,
    ) -> Fault:
        """Send the head and `after_bytes` body bytes, then close the connection cleanly."""
        _check_non_negative(after_bytes, "after_bytes")
        return self.add(
            Fault("truncate_body", method, path, range_only, times, after_bytes=after_bytes)
        )

    def short_206(
        self,
        keep_bytes: int,
        *,
        method: str | None = None,
        path: str | re.Pattern[str] | None = None,
        range_only: bool = False,
        times: int | None = None,
    ) -> Fault:
        """Rewrite a 206 into a valid 206 of only its first `keep_bytes` bytes (>= 1)."""
        if keep_bytes < 1:
            raise ValueError("keep_bytes must be at least 1 (a 206 cannot be empty)")
        return self.add(Fault("short_206", method, path, range_only, times, keep_bytes=keep_bytes))

    def status(
        self,
        code: int,
        *,
        method: str | None = None,
        path: str | re.Pattern[str] | None = None,
        range_only: bool = False,
        times: int | None = None,
        headers: dict[str, str] | None = None,
        body: bytes | None = None,
    ) -> Fault:
        """Answer `code` without contacting upstream; `body` defaults by the proxy's flavor."""
        return self.add(
            Fault(
                "status",
                method,
                path,
                range_only,
                times,
                code=code,
                headers=dict(headers or {}),
                body=body,
            )
        )

    def stall(
        self,
        seconds: float,
        *,
        after_bytes: int | None = None,
        method: str | None = None,
        path: str | re.Pattern[str] | None = None,
        range_only: bool = False,
        times: int | None = None,
    ) -> Fault:
        """Send nothing for `seconds`: before the response head, or after `after_bytes`."""
        if after_bytes is not None:
            _check_non_negative(after_bytes, "after_bytes")
        return self.add(
            Fault(
                "stall", method, path, range_only, times, after_bytes=after_bytes, seconds=seconds
            )
        )

    def delay(
        self,
        seconds: float,
        *,
        method: str | None = None,
        path: str | re.Pattern[str] | None = None,
        range_only: bool = False,
        times: int | None = None,
    ) -> Fault:
        """Wait `seconds` before forwarding; combines with any other fault."""
        return self.add(Fault("delay", method, path, range_only, times, seconds=seconds))

    def _select(self, request: _Request) -> tuple[list[Fault], Fault | None]:
        has_range = _range_of(request.message) is not None
        delays: list[Fault] = []
        chosen: Fault | None = None
        for fault in self.faults:
            if not fault.matches(request.method, request.target, has_range):
                continue
            if fault.kind == "delay":
                if fault._reserve():
                    delays.append(fault)
            elif chosen is None and fault._reserve():
                chosen = fault
        return delays, chosen

    def _record(self, request: _Request) -> ProxyRecord:
        record = ProxyRecord(request.method, request.target, _range_of(request.message))
        record.headers = {key.lower(): value for key, value in request.message.headers}
        with self._lock:
            self._records.append(record)
        return record

    def _update(
        self, record: ProxyRecord, *, status: int | None = None, fault: Fault | None = None
    ) -> None:
        with self._lock:
            if status is not None:
                record.status = status
            if fault is not None:
                record.fault = fault.kind
            self._lock.notify_all()

    def wait_until(
        self, seen: Callable[[builtins.list[ProxyRecord]], bool], timeout_s: float = 10.0
    ) -> bool:
        """Wait until ``seen(records)`` holds (checked whenever a record changes); False if it
        does not within ``timeout_s`` (a bound, not a pace: the proxy runs in its own thread,
        so a client that gave up may have done so before the proxy got to its request)."""
        with self._lock:
            return self._lock.wait_for(lambda: seen(self._records), timeout_s)

    def _finish(self, record: ProxyRecord) -> None:
        with self._lock:
            record.done = True

    # per connection ----------------------------------------------------------------------
    async def _client_connected(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._transports.add(writer.transport)
        connection = _Connection(self, reader, writer)
        try:
            await connection.serve()
        except asyncio.CancelledError:
            pass  # stop(): end quietly (a cancelled task here makes asyncio log noise)
        except (_Closed, OSError, ProtocolError, asyncio.TimeoutError, asyncio.IncompleteReadError):
            pass  # the connection ended: by a fault, a timeout, or a peer hanging up
        except Exception as error:  # a bug in the proxy: keep it for the test to see
            with self._lock:
                self._errors.append(error)
        finally:
            connection.close()
            self._transports.discard(writer.transport)
            self._tasks.discard(task)


def _range_of(message: _Message) -> str | None:
    """The range a request asks for: ``Range``, or Azure's ``x-ms-range``."""
    return message.get("Range") or message.get("x-ms-range")


def _check_non_negative(value: int, name: str) -> None:
    if value < 0:
        raise ValueError(f"{name} must be >= 0")


def _abort(transport: asyncio.BaseTransport) -> None:
    if isinstance(transport, asyncio.WriteTransport):
        transport.abort()
    else:
        transport.close()


class _Connection:
    """One client connection and the upstream connection that serves it."""

    def __init__(
        self, proxy: FaultProxy, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.proxy = proxy
        self.reader = reader
        self.writer = writer
        self.upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self.fault: Fault | None = None  # the fault chosen for the current request
        self.applied = False
        self.record = ProxyRecord("", "", None)  # the current request's record
        self.paced_until = 0.0  # the rate limit's bucket: when the next piece may go

    # helpers -----------------------------------------------------------------------------
    async def _timed(self, awaitable: Awaitable[T], timeout: float) -> T:
        return await asyncio.wait_for(awaitable, timeout)

    async def send(self, data: bytes) -> None:
        if self.writer.is_closing():
            raise _Closed
        rate = self.proxy.bytes_per_s_per_connection
        if rate is None:
            self.writer.write(data)
            await self._timed(self.writer.drain(), self.proxy.write_timeout)
            return
        view = memoryview(data)
        for at in range(0, len(data), _PACE_BYTES):
            piece = view[at : at + _PACE_BYTES]
            wait = self.paced_until - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)  # the link's pace, not a synchronisation
            # an idle connection earns no credit beyond one piece
            self.paced_until = max(self.paced_until, time.monotonic()) + len(piece) / rate
            if self.writer.is_closing():
                raise _Closed
            self.writer.write(piece)
            await self._timed(self.writer.drain(), self.proxy.write_timeout)

    async def flush(self) -> None:
        """Wait until everything written has been handed to the kernel."""
        transport = self.writer.transport
        if isinstance(transport, asyncio.WriteTransport):
            transport.set_write_buffer_limits(high=0)
        await self._timed(self.writer.drain(), self.proxy.write_timeout)

    async def reset_client(self) -> None:
        await self.flush()
        sock = self.writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.writer.transport.abort()

    async def close_client(self) -> None:
        await self.flush()
        self.writer.close()
        with contextlib.suppress(OSError, asyncio.TimeoutError):
            await self._timed(self.writer.wait_closed(), self.proxy.write_timeout)

    def drop_upstream(self) -> None:
        if self.upstream is not None:
            self.proxy._transports.discard(self.upstream[1].transport)
            self.upstream[1].transport.abort()
            self.upstream = None

    def close(self) -> None:
        self.drop_upstream()
        if not self.writer.is_closing():
            self.writer.transport.abort()

    async def connect_upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.upstream is None:
            reader, writer = await self._timed(
                asyncio.open_connection(
                    self.proxy.upstream_host, self.proxy.upstream_port, limit=_HEAD_LIMIT
                ),
                self.proxy.connect_timeout,
            )
            self.proxy._transports.add(writer.transport)
            self.upstream = (reader, writer)
        return self.upstream

    # the request loop --------------------------------------------------------------------
    async def serve(self) -> None:
        while True:
            head = await self._timed(_read_head(self.reader), self.proxy.idle_timeout)
            if head is None:
                return
            request = _Request.parse(head)
            delays, fault = self.proxy._select(request)
            for delay in delays:
                delay._fire()
            keep_alive = await self.handle(request, delays, fault)
            if not keep_alive:
                await self.close_client()
                return

    async def handle(self, request: _Request, delays: list[Fault], fault: Fault | None) -> bool:
        """Serve one request; returns whether the client connection stays open."""
        self.fault, self.applied = fault, False  # see apply()
        self.record = self.proxy._record(request)
        try:
            message = request.message
            expects_continue = "100-continue" in message.tokens("Expect")
            framing, length = _body_framing(message)
            has_body = framing == "chunked" or length > 0
            for delay in delays:
                await asyncio.sleep(delay.seconds)
            if fault is not None and fault.kind == "status":
                self.apply()
                if expects_continue and has_body:
                    # Answer at once, as a server would; the client never sends the body.
                    await self.send_status(request, fault, close=True)
                    return False
                await self.read_request_body(framing, length)
                await self.send_status(request, fault, close=message.wants_close())
                return not message.wants_close()
            if expects_continue:
                message.remove("Expect")
                if has_body:
                    await self.send(b"HTTP/1.1 100 Continue\r\n\r\n")
            body = await self.read_request_body(framing, length)
            if fault is not None and fault.kind == "stall" and fault.after_bytes is None:
                self.apply()
                await asyncio.sleep(fault.seconds)
            keep_alive = await self.exchange(request, body, fault)
            return keep_alive and not message.wants_close()
        finally:
            if fault is not None and not self.applied:
                fault._release()
            self.proxy._finish(self.record)

    def apply(self) -> None:
        """The current request's fault takes effect now (counted at once in fault.fired)."""
        if self.fault is not None and not self.applied:
            self.applied = True
            self.fault._fire()
            self.proxy._update(self.record, fault=self.fault)

    async def read_request_body(self, framing: str, length: int) -> bytes:
        pieces: list[bytes] = []
        async for wire, _ in _iter_body(self.reader, framing, length):
            pieces.append(wire)
        return b"".join(pieces)

    async def send_head(self, message: _Message, status: int) -> None:
        self.proxy._update(self.record, status=status)  # before the client can see it
        await self.send(message.serialize())

    async def send_status(self, request: _Request, fault: Fault, close: bool) -> None:
        if fault.body is not None:
            body, content_type = fault.body, "application/octet-stream"
        else:
            body, content_type = _error_body(self.proxy.flavor, fault.code)
        try:
            phrase = HTTPStatus(fault.code).phrase
        except ValueError:
            phrase = "Injected Fault"
        response = _Message(f"HTTP/1.1 {fault.code} {phrase}", [])
        response.set("Content-Type", content_type)
        if self.proxy.flavor == "azure" and fault.body is None:
            response.set("x-ms-error-code", _AZURE_ERRORS.get(fault.code, "InjectedFault"))
        for key, value in fault.headers.items():
            response.set(key, value)
        response.set("Content-Length", str(len(body)))
        if close:
            response.set("Connection", "close")
        await self.send_head(response, fault.code)
        if request.method != "HEAD":
            await self.send(body)

    async def bad_gateway(self, reason: str) -> bool:
        body = f"502 Bad Gateway (fault proxy): {reason}\n".encode()
        message = _Message("HTTP/1.1 502 Bad Gateway", [])
        message.set("Content-Type", "text/plain")
        message.set("Content-Length", str(len(body)))
        message.set("Connection", "close")
        await self.send_head(message, 502)
        await self.send(body)
        return False

    async def exchange(self, request: _Request, body: bytes, fault: Fault | None) -> bool:
        """Forward one request upstream and its response back (applying `fault`).

        Returns whether the client connection may stay open.
        """
        outgoing = request.message.serialize() + body
        head: bytes | None = None
        for attempt in range(2):
            reused = self.upstream is not None
            try:
                up_reader, up_writer = await self.connect_upstream()
            except (OSError, asyncio.TimeoutError) as error:
                return await self.bad_gateway(f"cannot connect upstream: {error!r}")
            try:
                up_writer.write(outgoing)
                await self._timed(up_writer.drain(), self.proxy.upstream_timeout)
                head = await self._timed(_read_head(up_reader), self.proxy.upstream_timeout)
            except (OSError, asyncio.TimeoutError, ProtocolError) as error:
                self.drop_upstream()
                if reused and attempt == 0:
                    continue  # a kept-alive upstream connection had gone stale
                return await self.bad_gateway(f"upstream failed: {error!r}")
            if head is None:
                self.drop_upstream()
                if reused and attempt == 0:
                    continue
                return await self.bad_gateway("upstream closed without answering")
            break
        assert head is not None
        response = _Response.parse(head)
        while 100 <= response.status < 200:  # interim responses: pass on, read the next head
            await self.send(self.rewrite(response).serialize())
            next_head = await self._timed(_read_head(up_reader), self.proxy.upstream_timeout)
            if next_head is None:
                raise ProtocolError("upstream closed after an interim response")
            response = _Response.parse(next_head)
        framing, length = _response_framing(request.method, response)
        # When the upstream ends its connection, so does the client's (transparently).
        closing = response.message.wants_close() or framing == "close"

        if fault is not None and fault.kind == "short_206" and response.status == 206:
            await self.send_short_206(response, up_reader, framing, length, fault)
        else:
            await self.stream_response(response, up_reader, framing, length, fault)
        if closing:
            self.drop_upstream()
        return not closing

    async def stream_response(
        self,
        response: _Response,
        up_reader: asyncio.StreamReader,
        framing: str,
        length: int,
        fault: Fault | None,
    ) -> None:
        cut: int | None = None
        if fault is not None and fault.kind in ("reset_mid_body", "truncate_body", "stall"):
            cut = fault.after_bytes
        if framing == "none" or (framing == "length" and cut is not None and length <= cut):
            cut = None  # no body to cut short: the fault does not apply
        await self.send_head(self.rewrite(response), response.status)
        sent = 0
        async for wire, _ in self._upstream_body(up_reader, framing, length):
            if cut is None or sent + len(wire) <= cut:
                await self.send(wire)
                sent += len(wire)
                continue
            assert fault is not None
            keep, cut = cut - sent, None
            self.apply()
            if keep:
                await self.send(wire[:keep])
            if fault.kind == "reset_mid_body":
                self.drop_upstream()
                await self.reset_client()
                raise _Closed
            if fault.kind == "truncate_body":
                self.drop_upstream()
                await self.close_client()
                raise _Closed
            await self.flush()
            await asyncio.sleep(fault.seconds)  # stall mid-body, then stream the rest
            await self.send(wire[keep:])

    async def _upstream_body(
        self, reader: asyncio.StreamReader, framing: str, length: int
    ) -> AsyncIterator[tuple[bytes, bytes]]:
        iterator = _iter_body(reader, framing, length).__aiter__()
        while True:
            try:
                piece = await self._timed(iterator.__anext__(), self.proxy.upstream_timeout)
            except StopAsyncIteration:
                return
            except (OSError, asyncio.IncompleteReadError, ProtocolError, asyncio.TimeoutError):
                # The upstream broke mid-body: pass the breakage on to the client.
                self.drop_upstream()
                await self.reset_client()
                raise _Closed from None
            yield piece

    async def send_short_206(
        self,
        response: _Response,
        up_reader: asyncio.StreamReader,
        framing: str,
        length: int,
        fault: Fault,
    ) -> None:
        pieces: list[bytes] = []
        async for _, data in self._upstream_body(up_reader, framing, length):
            pieces.append(data)
        payload = b"".join(pieces)
        content_range = _CONTENT_RANGE.match(response.message.get("Content-Range") or "")
        keep = fault.keep_bytes
        message = self.rewrite(response)
        if content_range is not None and keep < len(payload):
            self.apply()
            first, total = int(content_range.group(1)), content_range.group(3)
            payload = payload[:keep]
            message.set("Content-Range", f"bytes {first}-{first + keep - 1}/{total}")
        message.remove("Transfer-Encoding")
        message.set("Content-Length", str(len(payload)))
        await self.send_head(message, response.status)
        await self.send(payload)

    def rewrite(self, response: _Response) -> _Message:
        """The response head as the client should see it (Location pointed at the proxy)."""
        message = response.message
        location = message.get("Location")
        if self.proxy.rewrite_location and location is not None:
            for origin in self._upstream_origins():
                if location.startswith(origin):
                    message.set("Location", self.proxy.url + location[len(origin) :])
                    break
        return message

    def _upstream_origins(self) -> list[str]:
        port = self.proxy.upstream_port
        hosts = {self.proxy.upstream_host, "127.0.0.1", "localhost"}
        return [f"http://{host}:{port}" for host in sorted(hosts)]
