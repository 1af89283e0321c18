"""``http(s)://`` through fsspec's HTTPFileSystem: listing via fsspec, range GETs via aiohttp.

Every block is a ``Range`` GET carrying ``If-Match`` with the ETag seen first, and the ETag of
every answer is compared too (servers that ignore If-Match still cannot splice versions).
Bodies are read in pieces (:func:`~streamrec.storage.http.body.read_pieces`); fsspec's aiohttp
session allows 100 connections (aiohttp's default), which does not cap a dataset's reads.

A server that ignores ``Range`` (it answers ``200`` with the whole object, as Python's
``http.server`` does) is refused with a :class:`~streamrec.errors.StorageError` naming that
behaviour, before its body is read: reading every block as the whole object would cost
``max_concurrency`` x the object's size in memory and (size / block) x size in transfer. Objects
that fit in the first read (256 KiB) are still read, in that one answer.
"""

from __future__ import annotations

from typing import Any

from streamrec.storage.base import ObjectInfo
from streamrec.storage.fsspec_store import FsspecStore
from streamrec.storage.http.body import get_range, probe_first_bytes

__all__ = ["HTTPStore"]


class HTTPStore(FsspecStore):
    """Objects behind plain HTTP(S) URLs (servers answering Range requests)."""

    scheme = "http"

    def __init__(self, storage_options: dict[str, Any] | None = None) -> None:
        from fsspec.implementations.http import HTTPFileSystem

        options = dict(storage_options or {})
        options.setdefault("skip_instance_cache", True)
        super().__init__(HTTPFileSystem(asynchronous=True, **options))
        self._session: Any = None

    async def _get_session(self) -> Any:
        if self._session is None:
            self._session = await self.fs.set_session()
        return self._session

    async def expand(self, pattern: str) -> list[ObjectInfo]:
        await self._get_session()
        return await super().expand(pattern)

    def version_of(self, info: dict[str, Any]) -> str | None:
        etag = info.get("ETag") or info.get("etag")
        return str(etag) if etag else None

    async def _read_head(self, url: str, length: int) -> tuple[ObjectInfo, list[bytes]] | None:
        headers = {"Range": f"bytes=0-{length - 1}"}
        return await probe_first_bytes(await self._get_session(), url, url, headers, length, "ETag")

    async def _fetch_pieces(self, obj: ObjectInfo, start: int, end: int) -> list[bytes]:
        headers = {"If-Match": obj.version} if obj.version else {}
        session = await self._get_session()
        return await get_range(session, obj.url, obj, start, end, headers, "ETag")

    async def read_range(self, obj: ObjectInfo, start: int, end: int) -> bytes:
        return await self._read_joined(obj, start, end)

    async def close(self) -> None:
        self._heads.clear()
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()
