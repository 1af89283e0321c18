"""Sinks: where a writer's bytes go. An object appears only once it is complete.

Every sink has the same life cycle::

    sink = store.open_sink(url, context)
    await sink.write(block)      # any number of times; may wait for upload capacity
    await sink.seal()            # optional: hand the last buffered bytes to the uploads
    entry = await sink.commit()  # the object appears, complete; -> CommittedObject
    await sink.abort()           # instead of commit, or after any failure: nothing appears

- :class:`AtomicLocalSink` writes a temporary file in the destination's directory, fsyncs it
  and renames it over the final path on commit.
- :class:`MemorySink` (``memory://``) keeps the bytes and stores them in one call on commit.
- :class:`~streamrec.storage.s3.sink.S3MultipartSink` and
  :class:`~streamrec.storage.gcs.sink.GCSResumableSink` upload while bytes arrive.

Every sink counts the bytes it is given and their CRC32C as they pass (``bytes_written``,
``crc32c``), so the manifest describes exactly what was stored. Sinks of one writer share a
:class:`SinkContext`: the part size (each sink takes the context's when it opens and keeps it:
a writer's tuner may change it for shards not yet opened), the retry policy, the upload window
(:class:`UploadWindow`: the bytes of the requests carrying data in flight, at most
``room_bytes``, which bounds memory, and at most ``max_concurrency`` of them), what each upload
measured (``on_upload``, ``on_control``: for a tuner) and the first upload failure, which the
writer raises on its next call.

``abort()`` always runs to the end, even when the task calling it is being cancelled
(:func:`run_to_completion`), so a cancelled writer still removes its temporary files and
aborts its uploads.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import io
import logging
import os
import re
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, BinaryIO, TypeVar

import crc32c as _crc32c

from streamrec.errors import StorageError
from streamrec.storage.retry import RetryPolicy
from streamrec.storage.translate import translate

__all__ = [
    "AtomicLocalSink",
    "CommittedObject",
    "MemorySink",
    "ObjectSink",
    "PartBuffer",
    "SinkContext",
    "UploadWindow",
    "run_to_completion",
]

T = TypeVar("T")
logger = logging.getLogger("streamrec")

DEFAULT_PART_BYTES = 16 << 20
DEFAULT_MAX_CONCURRENCY = 8
"""Parts in flight at once, per writer, at fixed settings. At 25 MB/s per connection (a typical
cloud link) four reached 0.84x of a 1 Gbit link; eight reach it (benchmarks/README.md,
bench_write). With ``DEFAULT_PART_BYTES``: the writer's default upload room (128 MiB)."""


class UploadWindow:
    """The data requests in flight: their bytes at most ``room_bytes``, their number at most
    ``max_requests`` (both may change while uploads run; what is in flight is never recalled).

    A request bigger than the whole room goes alone (nothing else in flight meanwhile). Waiters
    are served in order, so a large part is not starved by small ones.
    """

    def __init__(self, room_bytes: int, max_requests: int) -> None:
        self.room_bytes = room_bytes
        self.max_requests = max_requests
        self.bytes = 0  # in flight
        self.requests = 0
        self.peak_bytes = 0
        self.waited_s = 0.0  # time spent waiting for room, over all acquires
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []

    def _fits(self, nbytes: int) -> bool:
        if self.requests == 0:
            return True
        return self.requests < self.max_requests and self.bytes + nbytes <= self.room_bytes

    async def acquire(self, nbytes: int) -> None:
        """Wait until ``nbytes`` more fit, then count them as in flight."""
        if not self._waiters and self._fits(nbytes):
            self._take(nbytes)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (nbytes, future)
        self._waiters.append(entry)
        start = time.perf_counter()
        try:
            await future
        except BaseException:
            if entry in self._waiters:
                self._waiters.remove(entry)
                self.wake()  # (the waiters it held back in line may fit now)
            elif not future.cancelled():  # granted just as it was cancelled: give it back
                self.release(nbytes)
            raise
        finally:
            self.waited_s += time.perf_counter() - start

    def release(self, nbytes: int) -> None:
        """``nbytes`` (acquired earlier) are no longer in flight."""
        self.bytes -= nbytes
        self.requests -= 1
        self.wake()

    def wake(self) -> None:
        """Let in the waiters that fit now (also after the limits changed)."""
        while self._waiters and self._fits(self._waiters[0][0]):
            nbytes, future = self._waiters.pop(0)
            if future.done():
                continue
            self._take(nbytes)
            future.set_result(None)

    def _take(self, nbytes: int) -> None:
        self.bytes += nbytes
        self.requests += 1
        self.peak_bytes = max(self.peak_bytes, self.bytes)


@dataclass(frozen=True)
class CommittedObject:
    """An object a sink made appear: its url, size in bytes, CRC32C (Castagnoli, unmasked) and
    version as readers will see it (S3 ETag, GCS generation; None where the store has none)."""

    url: str
    bytes: int
    crc32c: int
    version: str | None = None


class PartBuffer:
    """The bytes of a sink waiting to become a part, kept as the blocks written.

    A growing ``bytearray`` (grown by every block, its head cut off by every part) made the
    allocator keep freed buffers of every size between one block and one part: measured, the
    writer's peak RSS grew 20-70 MiB past the bytes it held. Here each part is one allocation
    of exactly its size, filled once from the blocks; the blocks themselves are the writer's.
    """

    def __init__(self) -> None:
        self._pieces: deque[bytes] = deque()
        self.nbytes = 0

    def __len__(self) -> int:
        return self.nbytes

    def append(self, data: bytes) -> None:
        """Keep ``data`` (a copy unless it is ``bytes``, which cannot change)."""
        piece = data if type(data) is bytes else bytes(data)
        self._pieces.append(piece)
        self.nbytes += len(piece)

    def _pop(self, size: int) -> list[memoryview | bytes]:
        """The first ``size`` bytes, as pieces (the rest of a split block is kept)."""
        out: list[memoryview | bytes] = []
        while size > 0:
            piece = self._pieces.popleft()
            if len(piece) > size:
                out.append(memoryview(piece)[:size])
                self._pieces.appendleft(piece[size:])
                self.nbytes -= size
                break
            out.append(piece)
            self.nbytes -= len(piece)
            size -= len(piece)
        return out

    def take(self, size: int) -> bytes:
        """The first ``size`` bytes (at most all), as one ``bytes`` of exactly that size."""
        return b"".join(self._pop(min(size, self.nbytes)))

    def take_into(self, size: int, out: io.BytesIO) -> int:
        """Write the first ``size`` bytes (at most all) to an empty ``out``, sized first: one
        allocation of exactly that size. Returns the bytes written."""
        size = min(size, self.nbytes)
        if size:
            out.seek(size - 1)
            out.write(b"\0")  # (a BytesIO grows to exactly the size written)
            out.seek(0)
            for piece in self._pop(size):
                out.write(piece)
            out.seek(0)
        return size

    def clear(self) -> None:
        self._pieces.clear()
        self.nbytes = 0


_REQUEST_ALIGN = 256 << 10
"""GCS sends ``part_bytes`` rounded up to a multiple of this (its chunk size)."""


def _largest_request(part_bytes: int) -> int:
    """The largest data request a sink makes of ``part_bytes`` parts (GCS rounds them up)."""
    return -(-part_bytes // _REQUEST_ALIGN) * _REQUEST_ALIGN


@dataclass
class SinkContext:
    """What the sinks of one writer share.

    Attributes:
        part_bytes: bytes per S3 part / GCS chunk (GCS rounds up to a 256 KiB multiple) of
            the sinks opened from now on.
        max_concurrency: data-carrying requests in flight at once, over all sinks.
        retry: the policy every request is retried with.
        room_bytes: the most bytes of data-carrying requests in flight at once, over all
            sinks (default ``max_concurrency x part_bytes``, the part rounded up to a GCS
            chunk: 256 KiB).
        on_upload: hears ``(bytes, seconds)`` of every data request that succeeded (its
            retries included, its wait for room not).
        on_control: hears the seconds of every small request that starts an upload (S3's
            CreateMultipartUpload, GCS's session start): about one round trip.
    """

    part_bytes: int = DEFAULT_PART_BYTES
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    failure: BaseException | None = None
    room_bytes: int = 0
    on_upload: Callable[[int, float], None] | None = field(default=None, repr=False)
    on_control: Callable[[float], None] | None = field(default=None, repr=False)
    _window: UploadWindow | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.part_bytes <= 0:
            raise ValueError(f"part_bytes must be positive, not {self.part_bytes}")
        if self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, not {self.max_concurrency}")
        if self.room_bytes <= 0:  # max_concurrency of the largest request a sink sends
            self.room_bytes = self.max_concurrency * _largest_request(self.part_bytes)

    @property
    def window(self) -> UploadWindow:
        """The upload window (created on first use)."""
        if self._window is None:
            self._window = UploadWindow(self.room_bytes, self.max_concurrency)
        return self._window

    def set_upload_settings(self, part_bytes: int, max_concurrency: int) -> None:
        """Parts of ``part_bytes`` for the sinks opened from now on, at most
        ``max_concurrency`` requests in flight (from now on); the room stays as it is."""
        self.part_bytes, self.max_concurrency = part_bytes, max_concurrency
        if self._window is not None:
            self._window.max_requests = max_concurrency
            self._window.wake()

    def uploaded(self, nbytes: int, seconds: float) -> None:
        """A data request of ``nbytes`` succeeded after ``seconds``."""
        if self.on_upload is not None:
            self.on_upload(nbytes, seconds)

    def controlled(self, seconds: float) -> None:
        """A request that starts an upload took ``seconds``."""
        if self.on_control is not None:
            self.on_control(seconds)

    def fail(self, error: BaseException) -> None:
        """Record a background failure (the first one wins); the writer raises it next."""
        if self.failure is None:
            self.failure = error

    def raise_failure(self) -> None:
        """Raise the recorded background failure, if any."""
        if self.failure is not None:
            raise self.failure

    def track(self, task: asyncio.Task[Any]) -> None:
        """Record ``task``'s failure, when it fails, as the context's failure."""
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self.fail(task.exception())  # type: ignore[arg-type]


async def run_to_completion(awaitable: Awaitable[T]) -> T:
    """Await ``awaitable`` to its end even if the calling task is cancelled meanwhile.

    Cleanup (aborting uploads, removing temporary files) must not stop half-way because the
    task running it was cancelled once more. A cancellation that arrives meanwhile is raised
    again once the work is done.
    """
    task = asyncio.ensure_future(awaitable)
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(task)
            break
        except asyncio.CancelledError:
            if task.done():
                raise  # the work itself was cancelled (loop shutdown): nothing to wait for
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    return result


class ObjectSink(abc.ABC):
    """Bytes in; one complete object at ``url`` on :meth:`commit`, or nothing at all."""

    def __init__(self, url: str, context: SinkContext | None = None) -> None:
        self.url = url
        self.context = context or SinkContext()
        self.part_bytes = self.context.part_bytes  # chosen once, before any part is sent
        self.bytes_written = 0
        self.crc32c = 0
        self.version: str | None = None  # set by sinks whose store versions objects
        self.state = "open"  # open -> sealed -> committed | aborted

    async def write(self, data: bytes) -> None:
        """Append bytes; may wait until the upload window has room."""
        if self.state != "open":
            raise RuntimeError(f"{self.url}: sink is {self.state}")
        if not data:
            return
        self.bytes_written += len(data)
        self.crc32c = _crc32c.crc32c(data, self.crc32c)
        await self._write(data)

    async def seal(self) -> None:
        """No more bytes: start uploading what is buffered (waits for upload capacity)."""
        if self.state != "open":
            return
        self.state = "sealed"
        try:
            await self._seal()
        except BaseException:
            await run_to_completion(self.abort())
            raise

    async def commit(self) -> CommittedObject:
        """Make the object appear, complete. On any failure the sink aborts and re-raises."""
        if self.state == "committed":
            return CommittedObject(self.url, self.bytes_written, self.crc32c, self.version)
        if self.state not in ("open", "sealed"):
            raise RuntimeError(f"{self.url}: sink is {self.state}")
        try:
            if self.state == "open":
                self.state = "sealed"
                await self._seal()
            await self._commit()
        except BaseException:
            await run_to_completion(self.abort())
            raise
        self.state = "committed"
        return CommittedObject(self.url, self.bytes_written, self.crc32c, self.version)

    async def abort(self) -> None:
        """Drop everything: no object appears (an existing one is left as it was)."""
        if self.state in ("committed", "aborted"):
            return
        self.state = "aborted"
        await run_to_completion(self._abort())

    @abc.abstractmethod
    async def _write(self, data: bytes) -> None: ...

    async def _seal(self) -> None:  # noqa: B027 - optional hook
        """Start uploading the buffered rest."""

    @abc.abstractmethod
    async def _commit(self) -> None: ...

    @abc.abstractmethod
    async def _abort(self) -> None: ...


class AtomicLocalSink(ObjectSink):
    """A local file written under a temporary name, renamed into place on commit.

    Writes run in a worker thread (they never block the event loop); the abort is synchronous
    inside, so it completes even when the calling task is being cancelled.
    """

    def __init__(
        self, path: str, *, url: str | None = None, context: SinkContext | None = None
    ) -> None:
        super().__init__(url or path, context)
        self.path = path
        directory, name = os.path.split(os.path.abspath(path))
        self.temp_path = os.path.join(directory, temp_name(name))
        self._file: BinaryIO | None = None

    def _open(self) -> BinaryIO:
        if self._file is None:
            try:
                os.makedirs(os.path.dirname(self.temp_path), exist_ok=True)
                self._file = open(self.temp_path, "wb")  # noqa: SIM115 - closed by commit/abort
            except OSError as exc:
                raise StorageError(f"{self.url}: cannot create {self.temp_path}: {exc}") from exc
        return self._file

    async def _write(self, data: bytes) -> None:
        file = self._open()
        try:
            await asyncio.to_thread(file.write, data)
        except OSError as exc:
            raise StorageError(f"{self.url}: write failed: {exc}") from exc

    async def _commit(self) -> None:
        """Flush, fsync and rename into place: the file appears complete or not at all."""
        file = self._open()
        try:
            await asyncio.to_thread(_flush_and_sync, file)
            file.close()
            self._file = None
            os.replace(self.temp_path, self.path)
        except OSError as exc:
            raise StorageError(f"{self.url}: commit failed: {exc}") from exc
        with contextlib.suppress(OSError):  # make the rename durable too (best effort)
            await asyncio.to_thread(_sync_directory, os.path.dirname(os.path.abspath(self.path)))

    async def _abort(self) -> None:
        file, self._file = self._file, None
        try:
            if file is not None:
                file.close()
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.temp_path)


TEMP_NAME = re.compile(r"\.(?P<name>.+)\.[0-9a-f]{12}\.tmp")
"""What :func:`temp_name` makes (``name`` is the file it becomes): the only hidden files a
local writer leaves behind when it is killed, and all ``streamrec cleanup`` removes."""


def temp_name(name: str) -> str:
    """The hidden temporary name a local sink writes ``name`` under until it commits."""
    return f".{name}.{uuid.uuid4().hex[:12]}.tmp"


def bucket_and_key(fs: Any, url: str, what: str) -> tuple[str, str]:
    """``(bucket, key)`` of an object ``url`` split by the fsspec filesystem ``fs``; a url
    without both is refused (``what`` names the kind: "an S3 object url")."""
    bucket, key, _ = fs.split_path(url)
    if not bucket or not key:
        raise StorageError(f"{url}: {what} needs a bucket and a key")
    return bucket, key


def _flush_and_sync(file: BinaryIO) -> None:
    file.flush()
    os.fsync(file.fileno())


def _sync_directory(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class MemorySink(ObjectSink):
    """``memory://``: bytes are kept and stored in fsspec's MemoryFileSystem in one call."""

    def __init__(self, fs: Any, url: str, context: SinkContext | None = None) -> None:
        super().__init__(url, context)
        self._fs = fs
        self._pieces: list[bytes] = []

    async def _write(self, data: bytes) -> None:
        self._pieces.append(bytes(data))

    async def _commit(self) -> None:
        data = b"".join(self._pieces)
        self._pieces.clear()
        try:
            self._fs.pipe_file(self.url, data)
        except Exception as exc:
            raise translate(exc, self.url, "storing") from exc

    async def _abort(self) -> None:
        self._pieces.clear()
