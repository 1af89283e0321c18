"""The part every fsspec-backed store shares: listing and globbing through an async filesystem.

Filesystems are created with ``asynchronous=True`` inside the running loop, one per store and
never from fsspec's instance cache (``skip_instance_cache=True``): a cached instance is bound to
the loop and the process that made it, which breaks in forked or spawned DataLoader workers.
"""

from __future__ import annotations

import abc
import asyncio
from typing import Any

from streamrec.errors import ObjectNotFoundError, StorageError
from streamrec.storage.base import ObjectInfo, ObjectStore, has_glob
from streamrec.storage.translate import translate

__all__ = ["FsspecStore"]


class FsspecStore(ObjectStore):
    """A store over one fsspec async filesystem (``self.fs``), for one url scheme."""

    scheme: str

    def __init__(self, fs: Any) -> None:
        self.fs = fs

    def url_of(self, name: str) -> str:
        """The url of a path as fsspec names it (``bucket/key`` -> ``s3://bucket/key``)."""
        return name if "://" in name else f"{self.scheme}://{name}"

    @abc.abstractmethod
    def version_of(self, info: dict[str, Any]) -> str | None:
        """The version token (ETag, generation) in an fsspec info dict."""

    async def _glob(self, path: str) -> dict[str, dict[str, Any]]:
        found: dict[str, dict[str, Any]] = await self.fs._glob(path, detail=True)
        return found

    async def _info(self, path: str) -> dict[str, Any]:
        info: dict[str, Any] = await self.fs._info(path)
        return info

    async def expand(self, pattern: str) -> list[ObjectInfo]:
        path = pattern if self.scheme == "http" else self.fs._strip_protocol(pattern)
        try:
            if has_glob(pattern):
                found = await self._glob(path)
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
                filled = await asyncio.gather(*(self._info(i["name"]) for i in missing))
                infos = [i for i in infos if i.get("size") is not None] + list(filled)
        except Exception as exc:
            raise translate(exc, pattern, "listing") from exc
        objects = [
            ObjectInfo(self.url_of(i["name"]), int(i["size"]), self.version_of(i)) for i in infos
        ]
        if not has_glob(pattern):
            objects = [ObjectInfo(pattern, objects[0].size, objects[0].version)]
        return sorted(objects, key=lambda o: o.url)
