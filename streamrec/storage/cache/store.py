"""A bounded local cache of remote shards, shared by every process of one host.

:class:`ShardCache` is a directory of complete copies of remote objects, each keyed by a hash
of the object's url, version (ETag / generation), size and endpoint, so that two objects never
share an entry (a name collision, webdataset#238) and a replaced object is never served stale.
The directory::

    streamrec-cache.lock   the directory lock (flock): held while space is reserved or freed
                           and while an entry is published (a scan must see every file)
    <key>.shard            a complete copy, published by an atomic rename; its mtime is when
                           it was last used (eviction is least recently used)
    <key>.lock             held (flock) by the one process downloading <key> (removed after)
    <key>.part             that download in progress, reserved at its full size up front

Every byte the directory holds is counted against ``capacity_bytes`` *before* it is written:
the space of a download is reserved (the ``.part`` file allocated at the object's size) under
the directory lock, after evicting the least recently used entries as needed, so the
directory never holds more, downloads in progress included (webdataset#117). An object larger
than the whole capacity, or one that does not fit beside the downloads in progress, is simply
not cached.

A reader asks :meth:`ShardCache.open` for its object and gets one of:

- a :class:`CacheHit`: the entry, opened (eviction may unlink it meanwhile: POSIX keeps an
  open file readable), read through :attr:`CacheHit.store` like any local file;
- a :class:`CacheFill`: this reader downloads the object and writes what it fetches at its
  offsets (:meth:`CacheFill.write`); :meth:`CacheFill.publish` (fsync, rename) once every byte
  was written and checked, :meth:`CacheFill.abort` otherwise (no entry, no ``.part`` left);
- ``None``: read the remote object without caching (no version, too large, no room; another
  process's download that stopped making progress).

Another process downloading the same object holds its ``.lock``: the reader waits (polling,
never blocking the event loop) until that entry is published, and reads it; if the holder
dies, the kernel releases its lock and the reader takes over. ``.part`` files of dead
processes (their lock free) are removed whenever space is reserved.

A cache directory is storage like any other: entries are checked against the object's size
when opened, and the reader checks every record's CRCs as for a remote read. It is also
private: this process makes it (and every file in it) readable by its user only (0700 /
0600: the copies are of private buckets), and uses a directory or an entry only if it
belongs to this user and nobody else may write it (a planted copy with valid CRCs would
otherwise be served as the object); else it warns once and reads without the cache. Every
wait is bounded: a directory lock held past ``stall_s``, or another process's download that
stalls or crawls, makes this run give the cache up (one warning, no waiting per shard).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import stat
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar, cast

from streamrec._portal import settle_all
from streamrec.errors import StorageError
from streamrec.storage.base import ObjectInfo, ObjectStore
from streamrec.storage.cache.files import (
    DIR_LOCK,
    ENTRY,
    FILE_MODE,
    LOCK,
    PART,
    POLL_FIRST_S,
    POLL_MAX_S,
    DirectoryLockStalled,
    UntrustedCache,
    allocate,
    check_private,
    directory_lock,
    file_crc32c,
    mtime_ns,
    publish,
    pwrite_all,
    remove_if_dead,
    remove_lock_file,
    try_lock,
    unlink_if_same,
    unlock,
)
from streamrec.storage.registry import options_for, store_key
from streamrec.storage.translate import translate

__all__ = ["CacheFill", "CacheHit", "ShardCache", "cache_namespace", "is_cacheable"]

T = TypeVar("T")
logger = logging.getLogger("streamrec")

_SLOWEST_FILL_BYTES_PER_S = 1 << 20  # another process's download slower than this (on
# average, after stall_s) is not waited for: a holder that only touches its .part would
# otherwise keep a reader waiting without end
DIRECTORY_MODE = 0o700
_filling: set[str] = set()  # entry paths this process is downloading (see ShardCache.open)


def is_cacheable(url: str) -> bool:
    """True for objects worth a local copy: remote ones (never local files or memory://)."""
    return store_key(url) not in ("local", "memory")


def cache_namespace(url: str, storage_options: Mapping[str, Any] | None) -> str:
    """What, beyond the url, tells ``url``'s objects apart: the endpoint its store talks to
    (two S3-compatible servers may both have ``s3://data/shard-0``; on Azure, the account:
    its blob endpoint or name, never its key)."""
    options = options_for(url, storage_options) or {}
    client = options.get("client_kwargs")
    endpoint = options.get("endpoint_url") or (
        client.get("endpoint_url") if isinstance(client, Mapping) else None
    )
    connection = options.get("connection_string")
    if not endpoint and isinstance(connection, str):
        fields = dict(f.split("=", 1) for f in connection.split(";") if "=" in f)
        endpoint = fields.get("BlobEndpoint") or fields.get("AccountName")
    return str(endpoint or options.get("account_host") or options.get("account_name") or "")


def _inode_of(fd: int) -> int:
    return os.fstat(fd).st_ino


class _Handle:
    """A file descriptor used from worker threads: closed only once the last operation on it
    has returned (a cancelled task's thread still runs; closing under it could hand the number
    to another file)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._pending: set[asyncio.Future[Any]] = set()
        self._closed = False

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        if self._closed:
            raise StorageError("the cache file is closed")
        future = asyncio.get_running_loop().run_in_executor(None, fn, self.fd, *args)
        self._pending.add(future)
        future.add_done_callback(self._pending.discard)
        return await asyncio.shield(future)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if not self._pending:
            os.close(self.fd)
            return
        ended = settle_all(self._pending)
        ended.add_done_callback(lambda _: os.close(self.fd))  # even if this close is cancelled
        await asyncio.shield(ended)


class _EntryStore(ObjectStore):
    """Reads one open cache entry (``os.pread`` in worker threads, as LocalStore)."""

    concurrency_limit = 4

    def __init__(self, handle: _Handle) -> None:
        self._handle = handle

    async def expand(self, pattern: str) -> list[ObjectInfo]:
        raise StorageError(f"{pattern}: a cache entry cannot be listed")

    async def read_range(self, obj: ObjectInfo, start: int, end: int) -> bytes:
        try:
            return await self._handle.run(os.pread, end - start, start)
        except OSError as exc:
            raise translate(exc, obj.url, f"reading bytes {start}-{end - 1}") from exc


@dataclass
class CacheHit:
    """A published entry, open for reading (see the module docstring)."""

    concurrency_limit: ClassVar[int] = _EntryStore.concurrency_limit
    """Reads of one entry worth having in flight (as for any local file)."""
    path: str
    """The entry's file (errors about its contents name it)."""
    obj: ObjectInfo
    """The entry as an object: its path and size (read it through :attr:`store`)."""
    store: ObjectStore
    _handle: _Handle

    async def close(self) -> None:
        """Close the entry (reads in flight end first)."""
        await self._handle.close()

    async def inode(self) -> int:
        """The entry's inode (what a later removal by path compares, see HostCopy)."""
        return await self._handle.run(_inode_of)

    async def discard(self) -> None:
        """Remove the entry (its contents turned out damaged): the next read downloads the
        object again. A newer entry under the same name (another process's) is kept."""
        with contextlib.suppress(OSError):  # best effort: the caller raises what it found
            await self._handle.run(unlink_if_same, self.path)


class CacheFill:
    """This reader's download of one object into the cache (see the module docstring)."""

    def __init__(
        self,
        path: str,
        size: int,
        part: _Handle,
        lock: int,
        stall_s: float,
        give_up: Callable[[str], None],
    ) -> None:
        self.path = path
        self._give_up = give_up
        self._stall_s = stall_s
        self.size = size
        self._part = part
        self._lock: int | None = lock
        self._written = 0

    @property
    def part_path(self) -> str:
        """Where the download is written until it is published."""
        return self.path[: -len(ENTRY)] + PART

    async def write(self, offset: int, pieces: list[bytes]) -> None:
        """Write ``pieces`` (consecutive) at ``offset`` of the copy; in any order."""
        if offset < 0 or offset + sum(map(len, pieces)) > self.size:
            raise ValueError(f"{self.path}: a write beyond the object's {self.size} bytes")
        try:
            written = await self._part.run(pwrite_all, pieces, offset)
        except OSError:  # a cache that cannot be written is no reason to fail the read
            written = -1 - self.size  # never complete: publish aborts
        self._written += written  # (after the await: writes run concurrently)

    async def publish(self) -> bool:
        """Make the copy an entry (fsync, atomic rename) if every byte was written, else
        abort. True when it was published."""
        if self._lock is None:
            return False
        if self._written != self.size:  # each byte is written once: a gap means a partial read
            await self.abort()
            return False
        try:
            await self._part.run(publish, self.part_path, self.path, self._stall_s)
        except DirectoryLockStalled as exc:
            self._give_up(str(exc))
            await self.abort()
            return False
        except OSError as exc:  # a cache that cannot be written is no reason to fail the read
            logger.warning("not caching %s: %s", self.path, exc)
            await self.abort()
            return False
        except BaseException:
            await self.abort()
            raise
        await self._part.close()
        self._release_lock()
        return True

    async def abort(self) -> None:
        """Give the download up: no entry, no ``.part`` file. Idempotent."""
        if self._lock is None:
            return
        try:
            await self._part.close()  # writes in flight end first
        finally:  # (cancelled meanwhile: the fd closes when they end; the rest goes now)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.part_path)
            self._release_lock()

    def _release_lock(self) -> None:
        lock, self._lock = self._lock, None
        if lock is not None:
            _filling.discard(self.path)
            unlock(lock, self.path[: -len(ENTRY)] + LOCK)


_BUSY = object()  # another process holds the object's lock
_STALLED = object()  # the directory lock stayed held past stall_s


class ShardCache:
    """The cache directory ``directory``, holding at most ``capacity_bytes`` (see the module
    docstring). ``stall_s``: how long a reader waits for another process's download that
    makes no progress (the holder is alive but not reading) before reading without the
    cache."""

    def __init__(self, directory: str, capacity_bytes: int, *, stall_s: float = 30.0) -> None:
        if capacity_bytes <= 0:
            raise ValueError(f"cache_bytes must be positive, not {capacity_bytes}")
        self.directory = os.path.abspath(directory)
        self.capacity_bytes = capacity_bytes
        self.stall_s = stall_s
        self.given_up: str | None = None
        """Why this run reads without the cache from now on (None: it uses the cache)."""

    def give_up(self, why: str) -> None:
        """Read without the cache for the rest of this run (warned once)."""
        if self.given_up is None:
            self.given_up = why
            logger.warning("not using the cache %s for this run: %s", self.directory, why)

    def entry_path(self, obj: ObjectInfo, namespace: str = "") -> str:
        """The entry of ``obj``: the hash of everything that identifies its bytes (the full
        url, never its base name; version; size; the store's endpoint)."""
        identity = "\0".join((namespace, obj.url, obj.version or "", str(obj.size)))
        key = hashlib.sha256(identity.encode()).hexdigest()
        return os.path.join(self.directory, key + ENTRY)

    async def open(
        self, obj: ObjectInfo, namespace: str = "", *, fill: bool = True, wait: bool = True
    ) -> CacheHit | CacheFill | None:
        """The entry of ``obj`` if there is one; else (``fill``: the reader reads the whole
        object) a :class:`CacheFill` once this process may download it, waiting while
        another one does (``wait``; else reading without the cache meanwhile); else None
        (read without the cache)."""
        if obj.version is None or obj.size > self.capacity_bytes or obj.size == 0:
            return None  # no version: a replaced object could not be told from the copy
        if self.given_up is not None:
            return None
        path = self.entry_path(obj, namespace)
        # claimed before anything: another reader of this process (a list naming the shard
        # twice, read side by side) must not wait for a download its own consumer paces
        claimed = fill and path not in _filling
        if claimed:
            _filling.add(path)
        found: object = None
        try:
            found = await self._open(path, obj, claimed, wait)
            return cast("CacheHit | CacheFill | None", found)
        finally:
            if claimed and not isinstance(found, CacheFill):
                _filling.discard(path)

    async def _open(self, path: str, obj: ObjectInfo, fill: bool, wait: bool) -> object:
        delay, progress, since = POLL_FIRST_S, None, time.monotonic()
        deadline = since + self.stall_s + obj.size / _SLOWEST_FILL_BYTES_PER_S
        while True:
            try:
                found = await _off_loop(self._try_open, path, obj, fill)
            except UntrustedCache as exc:
                self.give_up(str(exc))
                return None
            except OSError as exc:  # a full or read-only disk must not stop the training
                logger.warning("not using the cache %s for %s: %s", self.directory, obj.url, exc)
                return None
            if found is _STALLED:
                self.give_up(f"{DIR_LOCK} stays locked for more than {self.stall_s:g} s")
                return None
            if found is not _BUSY:
                return found
            if not wait:
                return None
            now = time.monotonic()
            seen = mtime_ns(path[: -len(ENTRY)] + PART)
            if seen != progress:
                progress, since = seen, now
            if now - since > self.stall_s or now > deadline:
                # the holder is alive but stopped, or crawls: read without the cache
                self.give_up(f"another process's download of {obj.url} stalls")
                return None
            await asyncio.sleep(delay)
            delay = min(delay * 2, POLL_MAX_S)

    def _try_open(self, path: str, obj: ObjectInfo, fill: bool) -> object:
        size = obj.size
        self._check_directory(create=fill)
        hit = self._open_entry(path, obj)
        if hit is not None or not fill:
            return hit
        lock_path = path[: -len(ENTRY)] + LOCK
        lock = try_lock(lock_path)
        if lock is None:
            return _BUSY
        try:
            hit = self._open_entry(path, obj)  # published while we took the lock
            if hit is not None:
                unlock(lock, lock_path)
                return hit
            part = path[: -len(ENTRY)] + PART
            with contextlib.suppress(FileNotFoundError):
                os.unlink(part)  # a dead holder's (we hold the lock: nobody else writes it)
            fd = self._reserve(part, size)
        except BaseException:
            unlock(lock, lock_path)
            raise
        if fd is None or fd is _STALLED:
            unlock(lock, lock_path)
            return fd
        assert isinstance(fd, int)
        return CacheFill(path, size, _Handle(fd), lock, self.stall_s, self.give_up)

    def _check_directory(self, create: bool) -> None:
        """Make the directory (0700) if ``create``; raise UntrustedCache if it is not this
        user's own or others may write it (its entries could be planted)."""
        if create:
            os.makedirs(self.directory, mode=DIRECTORY_MODE, exist_ok=True)
        try:
            found = os.stat(self.directory)
        except FileNotFoundError:
            return  # nothing cached yet (and nothing to fill: not made)
        if not stat.S_ISDIR(found.st_mode):
            raise UntrustedCache(f"{self.directory} is not a directory")
        check_private(found, self.directory)

    def _open_entry(self, path: str, obj: ObjectInfo) -> CacheHit | None:
        try:  # (O_NONBLOCK: a FIFO planted under the name must not wait for a writer)
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            return None
        try:
            found = os.fstat(fd)
            check_private(found, path)
            usable = stat.S_ISREG(found.st_mode) and found.st_size == obj.size
            if usable and obj.crc32c is not None:  # (a planted copy may have valid CRCs)
                usable = file_crc32c(fd, obj.size) == obj.crc32c
        except BaseException:
            os.close(fd)
            raise
        if not usable:
            if stat.S_ISREG(found.st_mode) and found.st_size == obj.size:
                logger.warning(
                    "the cached copy %s of %s does not match the CRC-32C its manifest lists: "
                    "removed, the shard is read again",
                    path,
                    obj.url,
                )
            with contextlib.suppress(OSError):  # not what a publish leaves: drop it
                unlink_if_same(fd, path)
            os.close(fd)
            return None
        now = time.time_ns()  # (not the kernel's coarse clock: uses a few ms apart still order)
        with contextlib.suppress(OSError):
            os.utime(path, ns=(now, now))  # used now (eviction is least recently used)
        handle = _Handle(fd)
        return CacheHit(path, ObjectInfo(path, obj.size), _EntryStore(handle), handle)

    def _reserve(self, part: str, size: int) -> int | object | None:
        """Under the directory lock: free room for ``size`` bytes (dead downloads, then the
        least recently used entries) and allocate ``part`` at that size; None if it cannot
        fit beside the downloads in progress."""
        with directory_lock(self.directory, self.stall_s) as locked:
            if not locked:
                return _STALLED
            used, entries = self._scan()
            free = self.capacity_bytes - used
            for _, entry, entry_size in sorted(entries):
                if free >= size:
                    break
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry)
                    free += entry_size
                remove_lock_file(entry[: -len(ENTRY)] + LOCK)
            if free < size:
                return None
            # (the stale one removed: a name planted meanwhile, a link especially, is not ours)
            fd = os.open(part, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
            try:
                allocate(fd, size)
            except OSError:  # the disk is full: no copy, read on
                os.close(fd)
                os.unlink(part)
                return None
            return fd

    def _scan(self) -> tuple[int, list[tuple[int, str, int]]]:
        """Bytes the directory holds (every regular file counts, also foreign ones) after
        removing the ``.part`` files of dead processes, and the entries ``(last used, path,
        size)``."""
        used = 0
        entries = []
        with os.scandir(self.directory) as found:
            for item in found:
                try:
                    if not item.is_file(follow_symlinks=False):
                        continue
                    info = item.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if item.name.endswith(PART) and remove_if_dead(item.path):
                    continue
                used += info.st_size
                if item.name.endswith(ENTRY):
                    entries.append((info.st_mtime_ns, item.path, info.st_size))
        return used, entries


async def _off_loop(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a worker thread. Cancelled, it still waits for the thread (a few file
    operations; it cannot be stopped) and closes what it opened: nothing outlives the call."""
    future = asyncio.get_running_loop().run_in_executor(None, fn, *args)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        while not future.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait([future])
        if not future.cancelled() and future.exception() is None:
            _release(future.result())
        raise


def _release(found: object) -> None:
    if isinstance(found, CacheHit):
        os.close(found._handle.fd)
    elif isinstance(found, CacheFill):
        os.close(found._part.fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(found.part_path)
        found._release_lock()
