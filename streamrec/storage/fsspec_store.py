"""The part every fsspec-backed store shares: listing and globbing through an async filesystem.

Filesystems are created with ``asynchronous=True`` inside the running loop, one per store and
never from fsspec's instance cache (``skip_instance_cache=True``): a cached instance is bound to
the loop and the process that made it, which breaks in forked or spawned DataLoader workers.

A single object (a url without glob characters) is not looked up with a HEAD or metadata
request before it is read: stores that can (:meth:`FsspecStore._read_head`) ask for its first
bytes straight away and learn its size and version from that answer (``Content-Range``, ETag,
generation). The bytes are kept (up to :attr:`FsspecStore.head_cache_bytes` per store) and
serve the object's first range reads, so the first record costs one round trip, not two.

The filesystem's coroutines are called by their underscore names (``_glob``, ``_info``,
``_rm_file``): that is fsspec's documented async API (the ``async def`` versions of the
``AbstractFileSystem`` methods, https://filesystem-spec.readthedocs.io/en/latest/async.html),
not a private attribute.
"""

from __future__ import annotations

import abc
from typing import Any

from streamrec._portal import run_all
from streamrec.errors import ObjectNotFoundError, StorageError
from streamrec.storage import timing
from streamrec.storage.base import ObjectInfo, ObjectStore, has_glob
from streamrec.storage.translate import translate

__all__ = ["HEAD_BYTES", "FsspecStore"]

HEAD_BYTES = 256 << 10
"""How much of a single object the size lookup reads (the reader's first block)."""


class FsspecStore(ObjectStore):
    """A store over one fsspec async filesystem (``self.fs``), for one url scheme."""

    scheme: str
    head_cache_bytes = 4 << 20
    """Most bytes of first-read answers kept for later range reads, per store."""

    def __init__(self, fs: Any) -> None:
        self.fs = fs
        self._heads: dict[tuple[str, str | None], list[bytes]] = {}
        self._head_bytes = 0

    def url_of(self, name: str) -> str:
        """The url of a path as fsspec names it (``bucket/key`` -> ``s3://bucket/key``)."""
        return name if "://" in name else f"{self.scheme}://{name}"

    def path_of(self, url: str) -> str:
        """``url`` as the filesystem names it (``gs://bucket/key`` -> ``bucket/key``), by
        fsspec's public ``strip_protocol`` (the rule of the filesystem class registered for
        the url's scheme)."""
        from fsspec.core import strip_protocol

        path: str = strip_protocol(url)
        return path

    @abc.abstractmethod
    def version_of(self, info: dict[str, Any]) -> str | None:
        """The version token (ETag, generation) in an fsspec info dict."""

    async def _glob(self, path: str) -> dict[str, dict[str, Any]]:
        found: dict[str, dict[str, Any]] = await self.fs._glob(path, detail=True)
        return found

    async def _info(self, path: str) -> dict[str, Any]:
        info: dict[str, Any] = await self.fs._info(path)
        return info

    async def _read_head(self, url: str, length: int) -> tuple[ObjectInfo, list[bytes]] | None:
        """One range GET of bytes ``0:length`` of ``url``: the object (size and version from
        the answer) and the bytes received. None when this store cannot (the caller then
        looks the object up the usual way). Raises translated errors (a missing object)."""
        return None

    async def expand(self, pattern: str) -> list[ObjectInfo]:
        if not has_glob(pattern) and self.lookup_reads_first_bytes:
            room = self.head_cache_bytes - self._head_bytes
            head = await self._read_head(pattern, max(1, min(HEAD_BYTES, room)))
            if head is not None:
                obj, pieces = head
                self._keep_head(obj, pieces, room)
                return [obj]
        path = pattern if self.scheme == "http" else self.path_of(pattern)
        try:
            if has_glob(pattern):
                found = await self._glob(path)
                # the filesystem's own pages are not seen here: its listing counts as one
                timing.listed_page()
                infos = [i for i in found.values() if i.get("type", "file") == "file"]
                if not infos:
                    raise ObjectNotFoundError(f"{pattern}: the glob matched no object")
            else:
                info = await self._info(path)
                if info.get("type", "file") != "file":
                    raise StorageError(f"{pattern}: not an object (a directory or prefix)")
                infos = [info]
            # Some listings (HTML indexes over HTTP) carry no sizes: ask each object.
            missing = [i for i in infos if i.get("size") is None]
            if missing:
                filled = await run_all(timing.metadata_read(self._info(i["name"])) for i in missing)
                infos = [i for i in infos if i.get("size") is not None] + list(filled)
        except Exception as exc:
            raise translate(exc, pattern, "listing") from exc
        objects = [
            ObjectInfo(self.url_of(i["name"]), int(i["size"]), self.version_of(i)) for i in infos
        ]
        if not has_glob(pattern):
            objects = [ObjectInfo(pattern, objects[0].size, objects[0].version)]
        return sorted(objects, key=lambda o: o.url)

    async def _connect(self) -> None:
        """Set up the filesystem's client session (stores whose fsspec needs one)."""

    async def delete(self, url: str) -> None:
        if self.scheme == "http":
            await super().delete(url)  # read-only
        await self._connect()
        path = self.path_of(url)
        try:
            if getattr(self.fs, "async_impl", False):
                await self.fs._rm_file(path)
            else:
                self.fs.rm_file(path)
        except FileNotFoundError:
            return
        except Exception as exc:
            raise translate(exc, url, "removing it") from exc

    # ------------------------------------------------------------------ the head cache

    def _keep_head(self, obj: ObjectInfo, pieces: list[bytes], room: int) -> None:
        size = sum(map(len, pieces))
        key = (obj.url, obj.version)
        self._drop_head(key)
        if size and size <= room:
            self._heads[key] = pieces
            self._head_bytes += size

    def _drop_head(self, key: tuple[str, str | None]) -> None:
        dropped = self._heads.pop(key, None)
        if dropped is not None:
            self._head_bytes -= sum(map(len, dropped))

    def _from_head(self, obj: ObjectInfo, start: int, end: int) -> tuple[list[bytes], int]:
        """The pieces of bytes ``start:min(end, head)`` kept from the first read, and where
        they stop (``start`` when nothing is kept there). A read that reaches the end of
        the kept bytes uses them up."""
        key = (obj.url, obj.version)
        pieces = self._heads.get(key)
        if pieces is None:
            return [], start
        held = sum(map(len, pieces))
        if start >= held:
            self._drop_head(key)  # the reader has moved past them
            return [], start
        stop = min(end, held)
        out = pieces if start == 0 and stop == held else _cut(pieces, start, stop)
        if stop == held:
            self._drop_head(key)
        return out, stop

    def read_range_cached(self, obj: ObjectInfo, start: int, end: int) -> list[bytes] | None:
        pieces = self._heads.get((obj.url, obj.version))
        if pieces is None or sum(map(len, pieces)) < end:
            return None
        return self._from_head(obj, start, end)[0]

    async def read_range_pieces(self, obj: ObjectInfo, start: int, end: int) -> list[bytes]:
        kept, start = self._from_head(obj, start, end) if self._heads else ([], start)
        if start >= end:
            return kept
        return kept + await self._fetch_pieces(obj, start, end)

    async def _fetch_pieces(self, obj: ObjectInfo, start: int, end: int) -> list[bytes]:
        """Bytes ``start:end`` from the server, as pieces (network stores override this)."""
        return [await self.read_range(obj, start, end)]

    async def _read_joined(self, obj: ObjectInfo, start: int, end: int) -> bytes:
        """:meth:`read_range` for stores whose reads are :meth:`read_range_pieces`."""
        pieces = await self.read_range_pieces(obj, start, end)
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)


def _cut(pieces: list[bytes], start: int, stop: int) -> list[bytes]:
    """Bytes ``start:stop`` of the concatenation of ``pieces``, as pieces."""
    out: list[bytes] = []
    position = 0
    for piece in pieces:
        end = position + len(piece)
        if end > start and position < stop:
            out.append(piece[max(start - position, 0) : min(stop, end) - position])
        position = end
    return out
