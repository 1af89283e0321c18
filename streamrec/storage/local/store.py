"""Local files (plain paths and ``file://`` urls), read and written off the event loop.

A local file has no version to pin reads to (remote stores pin each read to the ETag or
generation listed), so a reader *pins* the file instead (:meth:`LocalStore.pin`): its reads all
go through one descriptor, opened by the first, so a file replaced meanwhile (an atomic rename
by a writer or a reshard) is read to its end as it was, never spliced with its successor; a
file changed in place (written, truncated: its size or mtime differ from when it was first
read) is an :class:`~streamrec.errors.ObjectChangedError`, as a replaced remote object is.
Random access pins every shard of its table (thousands): at most :data:`MAX_OPEN_PINS`
descriptors stay open, the least recently read closed first, and a file opened again must be
the one first seen (device, inode, size, mtime), else ObjectChangedError. What was first seen
may be shared beyond the store (:data:`FileVersions`: a dataset's, for every epoch, ``get()``
and DataLoader worker) and noted before any read (:func:`note_versions`).
"""

from __future__ import annotations

import asyncio
import glob
import os
import sys
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from streamrec.errors import ObjectChangedError, ObjectNotFoundError, StorageError
from streamrec.format.accel import load_accelerator
from streamrec.storage.base import Leftover, ObjectInfo, ObjectStore, has_glob
from streamrec.storage.sink_base import TEMP_NAME, AtomicLocalSink, SinkContext
from streamrec.storage.translate import translate

__all__ = ["MAX_OPEN_PINS", "FileVersions", "LocalFile", "LocalStore", "note_versions"]

MAX_OPEN_PINS = 64
"""Most descriptors of pinned files a store keeps open (see the module docstring)."""

_CREAD: list[Any] = []  # the C extension (or None), loaded by the first read: it imports
# the format package's CRC, which is not importable while streamrec itself is being imported


def _receiver(length: int) -> Any:
    """A C ``Receiver`` of ``length`` bytes (a fresh ``bytes`` behind a writable buffer), or
    a ``bytearray`` without the C extension."""
    if not _CREAD:
        _CREAD.append(load_accelerator("_cread", "streamrec.storage"))
    return bytearray(length) if _CREAD[0] is None else _CREAD[0].Receiver(length)


class LocalStore(ObjectStore):
    """Local files. Range reads are ``os.pread`` calls in worker threads: the GIL is released
    while the kernel copies, so reads overlap decoding."""

    scheme = "file"
    concurrency_limit = 4  # preads in threads: more in flight only holds more memory

    def __init__(self) -> None:
        self._pins: dict[tuple[str, int], _Pinned] = {}  # (url, size) -> its pinned file
        self._open = _OpenPins(MAX_OPEN_PINS)

    @staticmethod
    def path(url: str) -> str:
        """The filesystem path of a local url."""
        return url[len("file://") :] if url.startswith("file://") else url

    async def expand(self, pattern: str) -> list[ObjectInfo]:
        path = self.path(pattern)
        if not has_glob(pattern):
            return [await asyncio.to_thread(self._info, pattern)]
        files = [m for m in sorted(glob.glob(path, recursive=True)) if os.path.isfile(m)]
        if not files:
            raise ObjectNotFoundError(f"{pattern}: the glob matched no file")
        prefix = "file://" if pattern.startswith("file://") else ""
        return [ObjectInfo(prefix + m, os.path.getsize(m)) for m in files]

    async def look_up_all(self, urls: Sequence[str]) -> list[ObjectInfo]:
        """Each of ``urls`` as :meth:`expand` finds it, looked up in one worker thread:
        thousands of files without a thread hop each."""
        return await asyncio.to_thread(lambda: [self._info(url) for url in urls])

    def _info(self, url: str) -> ObjectInfo:
        path = self.path(url)
        try:
            size = os.stat(path).st_size
        except OSError as exc:
            raise translate(exc, url, "stat") from exc
        if not os.path.isfile(path):
            raise StorageError(f"{url}: not a regular file")
        return ObjectInfo(url, size)

    async def read_range(self, obj: ObjectInfo, start: int, end: int) -> bytes:
        if not _allocator_settled:
            _settle_allocator()
        pinned = self._pins.get((obj.url, obj.size))
        # the bytes are allocated here, in the loop's thread, and filled in a worker thread:
        # glibc gives each thread its own arena and keeps freed memory in it, so buffers
        # allocated by whichever worker ran the read left a freed read's worth of resident
        # memory in every worker's arena (+18 MiB at 4 MiB reads, bench_hostile's skewed case;
        # without the C extension a bytearray, copied into bytes here: +15 MiB)
        receiver = _receiver(end - start)
        try:
            if pinned is not None:
                data = await asyncio.to_thread(_pread_pinned, pinned, start, end, receiver)
            else:
                data = await asyncio.to_thread(_pread, self.path(obj.url), start, end, receiver)
            if isinstance(data, bytearray):
                data = bytes(data)
        except StorageError:
            raise
        except OSError as exc:
            raise translate(exc, obj.url, f"reading bytes {start}-{end - 1}") from exc
        return data

    def pin(self, obj: ObjectInfo, versions: FileVersions | None = None) -> None:
        """Read ``obj`` from one descriptor until :meth:`unpin` (see the module docstring).

        Pins of the same url and size share the descriptor; it is opened by the first read
        and closed by the last unpin (a read still running keeps its own duplicate).
        ``versions``: the files as first seen, shared with other pins (a new pin's own by
        default); the first pin of ``obj`` decides."""
        key = (obj.url, obj.size)
        pinned = self._pins.get(key)
        if pinned is None:
            path = self.path(obj.url)
            pinned = _Pinned(
                obj.url, path, obj.size, self._open, {} if versions is None else versions
            )
            self._pins[key] = pinned
        pinned.pins += 1

    def unpin(self, obj: ObjectInfo) -> None:
        """Undo one :meth:`pin`; the last closes the descriptor."""
        key = (obj.url, obj.size)
        pinned = self._pins.get(key)
        if pinned is None:
            return
        pinned.pins -= 1
        if pinned.pins <= 0:
            del self._pins[key]
            pinned.close()

    async def close(self) -> None:
        pins, self._pins = self._pins, {}
        for pinned in pins.values():
            pinned.close()

    direct_reads = True
    """Records can be read straight into their final objects (:meth:`open_file`, used by
    :mod:`streamrec.pipeline.stream.direct` in worker threads) instead of through blocks."""

    def open_file(self, obj: ObjectInfo) -> LocalFile:
        """``obj`` opened for positional reads into the caller's buffers (blocking: call it
        from a worker thread, like :meth:`LocalFile.read_into`)."""
        if not _allocator_settled:
            _settle_allocator()
        return LocalFile(obj.url, self.path(obj.url), self._pins.get((obj.url, obj.size)))

    async def delete(self, url: str) -> None:
        try:
            await asyncio.to_thread(os.remove, self.path(url))
        except FileNotFoundError:
            return
        except OSError as exc:
            raise translate(exc, url, "removing it") from exc

    async def unfinished_writes(self, prefix: str) -> list[Leftover]:
        """The hidden temporary files of local sinks (:data:`~streamrec.storage.sink_base.
        TEMP_NAME` only) under ``prefix``, a directory or a path prefix."""
        return await asyncio.to_thread(_local_temp_files, prefix)

    async def abort_unfinished(self, leftover: Leftover) -> None:
        try:
            await asyncio.to_thread(os.remove, leftover.handle)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise translate(exc, leftover.url, "removing its temporary file") from exc

    def open_sink(self, url: str, context: SinkContext | None = None) -> AtomicLocalSink:
        """A temporary file beside ``url``, fsynced and renamed into place on commit."""
        return AtomicLocalSink(self.path(url), url=url, context=context)


_allocator_settled = False
# glibc's largest dynamic mmap threshold (4 Mi x sizeof(long)); a freed chunk at most this big
# raises the threshold to its size (and the trim threshold to twice that).
_GLIBC_MMAP_THRESHOLD_MAX = 32 << 20


def _settle_allocator() -> None:
    """Let glibc keep the memory of freed blocks and records for the next ones.

    At start glibc serves every allocation over 128 KiB (each block read, each record over
    128 KiB) with a fresh ``mmap`` and hands freed heap memory back above 128 KiB: every page
    of every block and record is then faulted in and zeroed by the kernel before the data is
    copied into it, which cost more than the copy itself (~200 page faults per MiB read,
    profiled with ``perf``; reads at ~0.3x of the ``tfrecord`` package, which reuses one
    buffer). glibc raises both thresholds by itself when a large mmapped chunk is freed; one
    such free, of a chunk at glibc's maximum, does it at once instead of after some churn.
    The process then keeps up to 64 MiB of freed memory per malloc arena for reuse. Once per
    process, Linux only (elsewhere a no-op: other allocators differ)."""
    global _allocator_settled
    _allocator_settled = True
    if sys.platform.startswith("linux"):
        # bytes(n) is calloc'd, here by mmap (never touched: no page is faulted in; a
        # bytearray would be zeroed by memset), then unmapped
        chunk = bytes(_GLIBC_MMAP_THRESHOLD_MAX - (64 << 10))
        del chunk


class LocalFile:
    """One local file open for positional reads straight into the caller's buffers.

    Blocking: every method runs in a worker thread. ``os.preadv`` releases the GIL while the
    kernel copies out of the page cache, and positional reads share no file offset, so one
    file object may be read by several threads at once. Close it once no read is running.
    A file ``pinned`` by a reader is the pinned one (a duplicate of its descriptor); call
    :meth:`check` after reading to know that what was read is what was pinned.
    """

    def __init__(self, url: str, path: str, pinned: _Pinned | None = None) -> None:
        self.url = url
        self._pinned = pinned
        if pinned is not None:
            self._fd = pinned.open()
            return
        try:
            self._fd = os.open(path, os.O_RDONLY)
        except OSError as exc:
            raise translate(exc, url, "opening it") from exc

    def check(self) -> None:
        """Raise ObjectChangedError if the pinned file was changed in place since it was
        pinned (the bytes read may be spliced); nothing to check for a file not pinned."""
        if self._pinned is not None and self._fd >= 0:
            self._pinned.check(self._fd)

    def read_into(self, buffers: list[memoryview], offset: int) -> int:
        """Fill ``buffers`` in order from byte ``offset``; how many bytes were read (fewer
        only at the end of the file)."""
        want = sum(buffer.nbytes for buffer in buffers)
        done = 0
        try:
            while done < want:
                got = _preadv(self._fd, _after(buffers, done), offset + done)
                if got <= 0:
                    break
                done += got
        except OSError as exc:
            raise translate(exc, self.url, f"reading bytes {offset}-{offset + want - 1}") from exc
        return done

    @property
    def fd(self) -> int:
        """The open file descriptor (for the C reads of :mod:`streamrec.storage.local.records`)."""
        return self._fd

    def close(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def __enter__(self) -> LocalFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _after(buffers: list[memoryview], skip: int) -> list[memoryview]:
    """``buffers`` without their first ``skip`` bytes (a short read's remainder)."""
    if not skip:
        return buffers
    rest = []
    for buffer in buffers:
        if skip >= buffer.nbytes:
            skip -= buffer.nbytes
            continue
        rest.append(buffer[skip:] if skip else buffer)
        skip = 0
    return rest


def _preadv_copy(fd: int, buffers: list[memoryview], offset: int) -> int:
    """``os.preadv`` where the platform lacks it: one read, copied into the buffers."""
    data = os.pread(fd, sum(buffer.nbytes for buffer in buffers), offset)
    at = 0
    for buffer in buffers:
        piece = data[at : at + buffer.nbytes]
        buffer[: len(piece)] = piece
        at += len(piece)
    return len(data)


_preadv = getattr(os, "preadv", _preadv_copy)


def _pread_fd(fd: int, start: int, end: int, receiver: Any) -> bytes | bytearray:
    """Bytes ``start:end`` of ``fd`` (fewer at its end), into ``receiver`` (a C ``Receiver``
    or a ``bytearray`` of ``end - start`` bytes) when given."""
    if receiver is None:
        return os.pread(fd, end - start, start)
    view = memoryview(receiver)
    try:
        got = _preadv(fd, [view], start)
    finally:
        view.release()
    if isinstance(receiver, bytearray):  # (pure Python: copied into bytes by the loop)
        del receiver[got:]
        return receiver
    data: bytes = receiver.payload
    return data if got == len(data) else data[:got]


def _pread(path: str, start: int, end: int, receiver: Any = None) -> bytes | bytearray:
    fd = os.open(path, os.O_RDONLY)
    try:
        return _pread_fd(fd, start, end, receiver)
    finally:
        os.close(fd)


def _pread_pinned(pinned: _Pinned, start: int, end: int, receiver: Any = None) -> bytes | bytearray:
    """(Worker thread.) Bytes ``start:end`` of the pinned file, checked unchanged after."""
    fd = pinned.open()
    try:
        data = _pread_fd(fd, start, end, receiver)
        pinned.check(fd)
        return data
    finally:
        os.close(fd)


class _Pinned:
    """One local file held open for its readers (:meth:`LocalStore.pin`).

    ``pins`` is counted on the event loop's thread; :meth:`open` (worker threads) opens the
    file at the first read and hands every read a duplicate of the descriptor, so
    :meth:`close` never pulls one from under a read still running in a thread (a cancelled
    read's thread runs to its end). The descriptor may be closed between reads to keep few
    open (:class:`_OpenPins`); opened again, it must be the same file, unchanged."""

    def __init__(
        self, url: str, path: str, size: int, open_pins: _OpenPins, versions: FileVersions
    ) -> None:
        self.url = url
        self.path = path
        self.size = size  # as listed
        self.pins = 0
        self._open_pins = open_pins
        self._versions = versions  # the file as first seen (by url)
        self._lock = threading.Lock()
        self._fd = -1
        self._closed = False
        self._seen: _Identity = (0, 0, 0, 0)  # (device, inode, size, mtime in ns) when opened

    def open(self) -> int:
        """(Worker thread.) A new descriptor of the pinned file: the caller closes it."""
        with self._lock:
            if self._closed:
                raise StorageError(f"{self.url}: read after its reader was closed")
            if self._fd < 0:
                try:
                    fd = os.open(self.path, os.O_RDONLY)
                except OSError as exc:
                    raise translate(exc, self.url, "opening it") from exc
                try:
                    seen = _identity(fd)
                except OSError as exc:
                    os.close(fd)
                    raise translate(exc, self.url, "opening it") from exc
                if seen[2] < self.size:
                    os.close(fd)
                    raise ObjectChangedError(
                        f"{self.url}: the file has {seen[2]} bytes, fewer than the "
                        f"{self.size} it had when listed: it changed since"
                    )
                first = self._versions.setdefault(self.url, seen)
                if seen != first:
                    os.close(fd)
                    raise ObjectChangedError(
                        f"{self.url}: the file was replaced or changed since it was first seen "
                        f"({first[2]} bytes then, {seen[2]} now): records are never read from "
                        "two versions"
                    )
                self._fd, self._seen = fd, seen
                reopened = True
            else:
                reopened = False
            fd = os.dup(self._fd)
        if reopened:  # (outside the lock: closing others takes theirs)
            self._open_pins.opened(self)
        return fd

    def check(self, fd: int) -> None:
        """Raise ObjectChangedError if the file behind ``fd`` (a duplicate of the pinned
        descriptor) was written or truncated since it was opened."""
        try:
            now = _identity(fd)
        except OSError as exc:
            raise translate(exc, self.url, "checking it") from exc
        if now != self._seen:
            raise ObjectChangedError(
                f"{self.url}: the file changed while it was being read (written or truncated "
                f"in place: {self._seen[2]} bytes when the read began, {now[2]} now)"
            )

    def shut(self) -> None:
        """Close the descriptor, not the pin (the next read opens the file again)."""
        with self._lock:
            fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            fd, self._fd = self._fd, -1
        self._open_pins.forget(self)
        if fd >= 0:
            os.close(fd)


class _OpenPins:
    """The pinned files of a store whose descriptors are open, least recently opened first:
    past ``limit``, the oldest are closed (worker threads: locked)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._open: OrderedDict[int, _Pinned] = OrderedDict()

    def opened(self, pinned: _Pinned) -> None:
        with self._lock:
            self._open[id(pinned)] = pinned
            victims = []
            while len(self._open) > self.limit:
                victims.append(self._open.popitem(last=False)[1])
        for victim in victims:
            victim.shut()

    def forget(self, pinned: _Pinned) -> None:
        with self._lock:
            self._open.pop(id(pinned), None)


_Identity = tuple[int, int, int, int]
FileVersions = dict[str, _Identity]
"""Local files as first seen, by url: (device, inode, size, mtime in ns)."""


def note_versions(objs: Sequence[ObjectInfo], versions: FileVersions) -> None:
    """(Blocking: a worker thread.) Note the local files ``objs`` as they are now in
    ``versions``, where not noted yet (a file that cannot be looked up is left to its read to
    say why)."""
    for obj in objs:
        if obj.url in versions:
            continue
        try:
            stat = os.stat(LocalStore.path(obj.url))
        except OSError:
            continue
        versions.setdefault(obj.url, (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns))


def _identity(fd: int) -> _Identity:
    """What tells a replaced or changed file: its device, inode, size and mtime (ns)."""
    stat = os.fstat(fd)
    return stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns


def _local_temp_files(prefix: str) -> list[Leftover]:
    """Temporary files of local sinks under ``prefix`` (a directory, or a path prefix)."""
    path = LocalStore.path(prefix)
    scheme = "file://" if prefix.startswith("file://") else ""
    root = path if os.path.isdir(path) else os.path.dirname(path) or "."
    found = []
    for directory, _, names in os.walk(root):
        for name in names:
            match = TEMP_NAME.fullmatch(name)
            if match is None:
                continue
            temp = os.path.join(directory, name)
            target = os.path.join(directory, match["name"])
            if not (os.path.isdir(path) or target.startswith(path)):
                continue
            try:
                started = os.stat(temp).st_mtime
            except FileNotFoundError:  # committed or aborted meanwhile
                continue
            found.append(Leftover(scheme + target, "temporary file", started, temp))
    return found
