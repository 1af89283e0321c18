"""A whole remote object fetched once per host: the dataset's metadata (its manifest, its
dataset index) that every consumer of a host reads in full.

:func:`fetch_whole` goes through a :class:`~streamrec.storage.cache.store.ShardCache`: the
first process of the host downloads the object into an entry keyed by its url, version
(ETag / generation), size and endpoint (so a changed object is fetched again), the others
wait on its lock and read that file. An entry is untrusted input like any object: it is
used only if it is this user's own and nobody else may write it (the cache refuses it
otherwise, and the object is read from the store), and the caller checks its contents as it
checks the object's; contents that fail (:meth:`HostCopy.discard`) are removed and fetched
again. An object without a version (an HTTP server without ETags) cannot be cached safely:
it is read into memory.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass

from streamrec.errors import StorageError
from streamrec.storage import timing
from streamrec.storage.base import ObjectInfo, ObjectStore
from streamrec.storage.cache.store import CacheFill, CacheHit, ShardCache
from streamrec.storage.retry import RetryPolicy

__all__ = ["HostCopy", "fetch_whole"]

READ_BYTES = 8 << 20
"""A whole object is fetched this many bytes a request."""


@dataclass(frozen=True)
class HostCopy:
    """Where a fetched object's bytes are: ``path`` (the host's cache entry, or the object
    itself when local) or ``data`` (read into memory: no safe cache)."""

    url: str
    path: str | None = None
    data: bytes | None = None
    hit: bool = False
    """The copy was in the cache already (not downloaded by this call)."""
    inode: int | None = None
    """The entry's inode when its bytes were read through its checked descriptor
    (:meth:`discard` removes that file only, never a newer one under the name)."""

    def read(self) -> bytes:
        """The whole copy's bytes (``data`` when held, else the file's)."""
        if self.data is not None:
            return self.data
        if self.path is None:
            raise StorageError(f"{self.url}: no copy")
        try:
            with open(self.path, "rb") as file:
                return file.read()
        except OSError as exc:
            raise StorageError(f"{self.url}: its copy {self.path} cannot be read: {exc}") from exc

    def discard(self) -> None:
        """The copy's contents failed their check: remove the cache entry (the next fetch
        downloads the object again). Best effort: the caller raises or refetches."""
        if self.path is not None:
            with contextlib.suppress(OSError):
                if self.inode is None or os.stat(self.path).st_ino == self.inode:
                    os.unlink(self.path)


async def fetch_whole(
    obj: ObjectInfo,
    store: ObjectStore,
    cache: ShardCache | None,
    namespace: str,
    retry: RetryPolicy,
    on_retry: Callable[[Exception], None] | None = None,
    *,
    keep_bytes: bool = False,
) -> HostCopy:
    """The whole object ``obj`` of ``store``: its entry in ``cache`` (downloaded by one
    process of the host), else its bytes (no cache, no version, no room: read here). Reads
    go through ``store`` (the first bytes its lookup kept are not fetched again)."""
    entry = None if cache is None else await cache.open(obj, namespace)
    if isinstance(entry, CacheHit):
        try:
            if not keep_bytes:
                return HostCopy(obj.url, path=entry.path, hit=True)
            # read through the descriptor the cache checked (owner, mode, no link), not by
            # path again: the file under the name may have changed since
            data = await entry.store.read_range(entry.obj, 0, entry.obj.size)
            if len(data) != obj.size:
                raise StorageError(
                    f"{obj.url}: its cached copy {entry.path} holds {len(data)} bytes, "
                    f"not {obj.size}"
                )
            inode = await entry.inode()
            return HostCopy(obj.url, path=entry.path, data=data, hit=True, inode=inode)
        finally:
            await entry.close()
    pieces: list[bytes] = []
    try:
        for start in range(0, obj.size, READ_BYTES):
            end = min(start + READ_BYTES, obj.size)

            async def read(start: int = start, end: int = end) -> bytes:
                return await store.read_range(obj, start, end)

            describe = f"{obj.url}: reading bytes {start}-{end}"
            data = await timing.metadata_read(retry.run(read, describe=describe, on_retry=on_retry))
            if len(data) != end - start:
                raise StorageError(f"{obj.url}: read {len(data)} of its bytes {start}-{end}")
            if isinstance(entry, CacheFill):
                await entry.write(start, [data])
            pieces.append(data)
    except BaseException:
        if isinstance(entry, CacheFill):
            await entry.abort()
        raise
    if isinstance(entry, CacheFill) and await entry.publish():
        return HostCopy(obj.url, path=entry.path, data=b"".join(pieces) if keep_bytes else None)
    return HostCopy(obj.url, data=b"".join(pieces))
