"""URL -> store, and what every store offers: expand globs, learn sizes, stream bytes, write.

Local paths (and ``file://`` URLs) are served by :class:`LocalStore` through aiofiles, so a read
never blocks the event loop. Cloud stores (s3://, gs://, http(s)://, memory://) arrive with the
fsspec back ends.

Every ``OSError`` is translated here into :mod:`streamrec.errors`, naming the path.
"""

from __future__ import annotations

import glob
import os
from collections.abc import AsyncGenerator
from dataclasses import dataclass

import aiofiles
import aiofiles.os

from streamrec.errors import ObjectNotFoundError, StorageError
from streamrec.storage.sinks import AtomicLocalSink

__all__ = ["LocalStore", "ObjectInfo", "open_store", "split_scheme"]

_GLOB_CHARS = frozenset("*?[")


@dataclass(frozen=True)
class ObjectInfo:
    """One object: its url as the user spelled it (scheme kept) and its size in bytes."""

    url: str
    size: int


def split_scheme(url: str) -> tuple[str, str]:
    """``("s3", "bucket/key")`` for ``s3://bucket/key``; ``("file", path)`` for local paths."""
    if "://" in url:
        scheme, rest = url.split("://", 1)
        return scheme.lower(), rest
    return "file", url


def _translate(exc: OSError, url: str, action: str) -> StorageError:
    if isinstance(exc, FileNotFoundError):
        return ObjectNotFoundError(f"{url}: no such file ({action})")
    return StorageError(f"{url}: {action} failed: {exc.strerror or exc}")


class LocalStore:
    """Local files, read and written without blocking the event loop."""

    scheme = "file"

    def __init__(self, read_bytes: int = 4 << 20) -> None:
        self.read_bytes = read_bytes

    @staticmethod
    def path(url: str) -> str:
        """The filesystem path of a local url."""
        return url[len("file://") :] if url.startswith("file://") else url

    async def expand(self, pattern: str) -> list[ObjectInfo]:
        """Objects matching ``pattern`` (a path or a glob), sorted by name, with sizes."""
        path = self.path(pattern)
        if _GLOB_CHARS.isdisjoint(path):
            return [await self.info(pattern)]
        matches = sorted(glob.glob(path))
        files = [m for m in matches if os.path.isfile(m)]
        if not files:
            raise ObjectNotFoundError(f"{pattern}: the glob matched no file")
        prefix = "file://" if pattern.startswith("file://") else ""
        return [ObjectInfo(prefix + m, os.path.getsize(m)) for m in files]

    async def info(self, url: str) -> ObjectInfo:
        """Size of one object; ObjectNotFoundError if missing, StorageError if not a file."""
        try:
            stat = await aiofiles.os.stat(self.path(url))
        except OSError as exc:
            raise _translate(exc, url, "stat") from exc
        if not os.path.isfile(self.path(url)):
            raise StorageError(f"{url}: not a regular file")
        return ObjectInfo(url, stat.st_size)

    async def stream(self, url: str, start: int = 0) -> AsyncGenerator[bytes, None]:
        """The object's bytes from ``start`` to its end, in chunks of ``read_bytes``."""
        try:
            async with aiofiles.open(self.path(url), "rb", buffering=0) as f:
                if start:
                    await f.seek(start)
                while True:
                    chunk = await f.read(self.read_bytes)
                    if not chunk:
                        return
                    yield chunk
        except OSError as exc:
            raise _translate(exc, url, "read") from exc

    def open_sink(self, url: str) -> AtomicLocalSink:
        """A sink that makes ``url`` appear only once it is complete."""
        return AtomicLocalSink(self.path(url), url=url)

    async def close(self) -> None:
        """Nothing to release for local files."""


def open_store(url: str) -> LocalStore:
    """The store that serves ``url``."""
    scheme, _ = split_scheme(url)
    if scheme == "file":
        return LocalStore()
    raise StorageError(
        f"{url}: the {scheme}:// scheme is not supported yet (local paths and file:// are)"
    )
