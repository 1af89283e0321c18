"""``memory://`` through fsspec's MemoryFileSystem (process-global, for tests and examples)."""

from __future__ import annotations

from typing import Any

from streamrec.storage.base import ObjectInfo
from streamrec.storage.fsspec_store import FsspecStore
from streamrec.storage.sink_base import MemorySink, SinkContext
from streamrec.storage.translate import translate

__all__ = ["MemoryStore"]


class MemoryStore(FsspecStore):
    """fsspec's in-memory filesystem; its calls are synchronous and never block on I/O."""

    scheme = "memory"

    def __init__(self, storage_options: dict[str, Any] | None = None) -> None:
        from fsspec.implementations.memory import MemoryFileSystem

        super().__init__(MemoryFileSystem(**(storage_options or {})))

    def url_of(self, name: str) -> str:
        return f"memory://{name.lstrip('/')}"

    def version_of(self, info: dict[str, Any]) -> str | None:
        return None

    async def _glob(self, path: str) -> dict[str, dict[str, Any]]:
        found: dict[str, dict[str, Any]] = self.fs.glob(path, detail=True)
        return found

    async def _info(self, path: str) -> dict[str, Any]:
        info: dict[str, Any] = self.fs.info(path)
        return info

    async def read_range(self, obj: ObjectInfo, start: int, end: int) -> bytes:
        try:
            data: bytes = self.fs.cat_file(obj.url, start, end)
        except Exception as exc:
            raise translate(exc, obj.url, f"reading bytes {start}-{end - 1}") from exc
        return data

    def open_sink(self, url: str, context: SinkContext | None = None) -> MemorySink:
        """Bytes kept in memory and stored in one call on commit."""
        return MemorySink(self.fs, url, context)
