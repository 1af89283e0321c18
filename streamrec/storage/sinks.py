"""Sinks: where a writer's bytes go. An object appears only once it is complete.

:class:`AtomicLocalSink` writes a temporary file in the destination's directory, fsyncs it and
renames it over the final path on ``commit()``; ``abort()`` (on any error or cancellation)
removes the temporary file, so a reader never sees a half-written shard.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from typing import BinaryIO

from streamrec.errors import StorageError

__all__ = ["AtomicLocalSink"]


class AtomicLocalSink:
    """A local file written under a temporary name, renamed into place on commit.

    Writes run in a worker thread (they never block the event loop); ``abort()`` is
    synchronous inside, so it completes even when the calling task is being cancelled.
    """

    def __init__(self, path: str, *, url: str | None = None) -> None:
        self.path = path
        self.url = url or path
        directory, name = os.path.split(os.path.abspath(path))
        self.temp_path = os.path.join(directory, f".{name}.{uuid.uuid4().hex[:12]}.tmp")
        self._file: BinaryIO | None = None
        self.bytes_written = 0

    def _open(self) -> BinaryIO:
        if self._file is None:
            try:
                os.makedirs(os.path.dirname(self.temp_path), exist_ok=True)
                self._file = open(self.temp_path, "wb")  # noqa: SIM115 - closed by commit/abort
            except OSError as exc:
                raise StorageError(f"{self.url}: cannot create {self.temp_path}: {exc}") from exc
        return self._file

    async def write(self, data: bytes) -> None:
        """Append bytes."""
        file = self._open()
        try:
            await asyncio.to_thread(file.write, data)
        except OSError as exc:
            raise StorageError(f"{self.url}: write failed: {exc}") from exc
        self.bytes_written += len(data)

    async def commit(self) -> None:
        """Flush, fsync and rename into place: the file appears complete or not at all."""
        file = self._open()
        try:
            await asyncio.to_thread(_flush_and_sync, file)
            file.close()
            self._file = None
            os.replace(self.temp_path, self.path)
        except OSError as exc:
            await self.abort()
            raise StorageError(f"{self.url}: commit failed: {exc}") from exc

    async def abort(self) -> None:
        """Drop everything written; the destination is left as it was."""
        file, self._file = self._file, None
        try:
            if file is not None:
                file.close()
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.temp_path)


def _flush_and_sync(file: BinaryIO) -> None:
    file.flush()
    os.fsync(file.fileno())
