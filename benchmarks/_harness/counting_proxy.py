"""A counting HTTP/1.1 proxy: every request that passes is counted by kind and by object.

``CountingProxy(host, port)`` listens on a free loopback port and forwards each client
connection to one connection of its own to ``host:port`` (connections stay one to one, so the
link behind it sees what the client opened). Only the client's side is parsed: each request's
head (method, target), then its body (``Content-Length`` or chunked) is passed on as it is;
answers are copied back byte for byte. Clients do not pipeline, so each head is one request.

Kinds, for S3's path-style requests (``/bucket/key?query``): ``HEAD``; ``LIST`` (a GET of
the bucket, ``list-type=`` or no key); ``GET`` (an object); ``other`` (PUT, POST, DELETE...).
Objects: ``manifest`` (``_manifest.json``), ``index`` (``_dataset_index.bin``), ``sidecar``
(``*.idx``), ``shard`` (``*.tfrecord``), ``bucket`` (no key: listings), ``other`` (any other
key, e.g. a directory's name looked up as an object).

It runs its own event loop in a thread and keeps the wall-clock time each request head
arrived: :meth:`between` counts the requests of a span of time (one job at a time).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import Counter
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, urlsplit

__all__ = ["KINDS", "CountingProxy", "classify"]

KINDS = ("HEAD", "GET", "LIST", "other")
_HEAD_LIMIT = 1 << 16
_CHUNK = 1 << 16


def classify(method: str, target: str) -> tuple[str, str]:
    """(kind, object) of one S3 path-style request."""
    parts = urlsplit(target)
    _bucket, _, key = parts.path.lstrip("/").partition("/")
    query = parse_qs(parts.query, keep_blank_values=True)
    if not key:
        what = "bucket"
    elif key.endswith("_manifest.json"):
        what = "manifest"
    elif key.endswith("_dataset_index.bin"):
        what = "index"
    elif key.endswith(".idx"):
        what = "sidecar"
    elif key.endswith(".tfrecord"):
        what = "shard"
    else:
        what = "other"
    if method == "HEAD":
        return "HEAD", what
    if method == "GET":
        return ("LIST", what) if (not key or "list-type" in query) else ("GET", what)
    return "other", what


class CountingProxy:
    """See the module docstring. Use as a context manager; ``url`` is where clients connect."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self._seen: list[tuple[float, tuple[str, str]]] = []  # (arrival, (kind, object))
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self.port = 0
        self.errors: list[str] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def between(self, start: float, end: float) -> Counter[tuple[str, str]]:
        """The requests whose heads arrived in [``start``, ``end``] (``time.time()``), by
        (kind, object)."""
        with self._lock:
            return Counter(what for at, what in self._seen if start <= at <= end)

    def forget(self) -> None:
        """Drop the requests seen so far (their times are kept until then)."""
        with self._lock:
            self._seen.clear()

    def __enter__(self) -> CountingProxy:
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._start(), self._loop)
        future.result(timeout=10)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            up_r, up_w = await asyncio.open_connection(*self.upstream)
        except OSError as exc:
            self.errors.append(f"connect: {exc}")
            client_w.close()
            self._tasks.discard(task)
            return
        try:
            requests = asyncio.ensure_future(self._requests(client_r, up_w))
            answers = asyncio.ensure_future(self._copy(up_r, client_w))
            await asyncio.wait({requests, answers}, return_when=asyncio.FIRST_COMPLETED)
            for side in (requests, answers):
                side.cancel()
            await asyncio.gather(requests, answers, return_exceptions=True)
        finally:
            for writer in (up_w, client_w):
                with contextlib.suppress(Exception):
                    writer.close()
            self._tasks.discard(task)

    async def _copy(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()

    async def _requests(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Each request: its head counted and passed on, then its body as it is."""
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                return  # the client closed
            except asyncio.LimitOverrunError:
                self.errors.append("a request head over the limit")
                return
            lines = head.decode("latin-1").split("\r\n")
            method, target = [*lines[0].split(" "), "", ""][:2]
            headers = {}
            for line in lines[1:]:
                name, sep, value = line.partition(":")
                if sep:
                    headers[name.strip().lower()] = value.strip()
            with self._lock:
                self._seen.append((time.time(), classify(method, target)))
            writer.write(head)
            if "chunked" in headers.get("transfer-encoding", "").lower():
                await self._chunked(reader, writer)
            else:
                left = int(headers.get("content-length", "0") or 0)
                while left:
                    data = await reader.read(min(left, _CHUNK))
                    if not data:
                        return
                    writer.write(data)
                    left -= len(data)
            await writer.drain()

    async def _chunked(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            size_line = await reader.readuntil(b"\r\n")
            writer.write(size_line)
            size = int(size_line.split(b";")[0].strip(), 16)
            if size == 0:  # trailers, then the blank line
                while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
                    writer.write(line)
                writer.write(line)
                return
            writer.write(await reader.readexactly(size + 2))
