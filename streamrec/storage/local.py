"""Local files (plain paths and ``file://`` urls), read and written off the event loop."""

from __future__ import annotations

import asyncio
import glob
import os
import sys

from streamrec.errors import ObjectNotFoundError, StorageError
from streamrec.storage.base import Leftover, ObjectInfo, ObjectStore, has_glob
from streamrec.storage.sinks import TEMP_NAME, AtomicLocalSink, SinkContext
from streamrec.storage.translate import translate

__all__ = ["LocalFile", "LocalStore"]


class LocalStore(ObjectStore):
    """Local files. Range reads are ``os.pread`` calls in worker threads: the GIL is released
    while the kernel copies, so reads overlap decoding."""

    scheme = "file"
    concurrency_limit = 4  # preads in threads: more in flight only holds more memory

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
        try:
            return await asyncio.to_thread(_pread, self.path(obj.url), start, end)
        except OSError as exc:
            raise translate(exc, obj.url, f"reading bytes {start}-{end - 1}") from exc

    direct_reads = True
    """Records can be read straight into their final objects (:meth:`open_file`, used by
    :mod:`streamrec.pipeline.direct` in worker threads) instead of through blocks."""

    def open_file(self, obj: ObjectInfo) -> LocalFile:
        """``obj`` opened for positional reads into the caller's buffers (blocking: call it
        from a worker thread, like :meth:`LocalFile.read_into`)."""
        if not _allocator_settled:
            _settle_allocator()
        return LocalFile(obj.url, self.path(obj.url))

    async def delete(self, url: str) -> None:
        try:
            await asyncio.to_thread(os.remove, self.path(url))
        except FileNotFoundError:
            return
        except OSError as exc:
            raise translate(exc, url, "removing it") from exc

    async def unfinished_writes(self, prefix: str) -> list[Leftover]:
        """The hidden temporary files of local sinks (:data:`~streamrec.storage.sinks.
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
    """

    def __init__(self, url: str, path: str) -> None:
        self.url = url
        try:
            self._fd = os.open(path, os.O_RDONLY)
        except OSError as exc:
            raise translate(exc, url, "opening it") from exc

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
        """The open file descriptor (for the C reads of :mod:`streamrec.storage.records`)."""
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


def _pread(path: str, start: int, end: int) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.pread(fd, end - start, start)
    finally:
        os.close(fd)


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
