"""The one blocking facade: plain-code twins of the async API, over :mod:`streamrec._portal`.

Datasets iterate with plain ``for`` by themselves (see :class:`~streamrec.Dataset`); this
module holds what needs an object of its own: :func:`open_writer`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from types import TracebackType
from typing import Any

from streamrec._portal import EventLoopThread
from streamrec.format.crc import BytesLike
from streamrec.manifest.core import ManifestEntry
from streamrec.write.tune import UploadSettings
from streamrec.write.writer import open_writer as open_async_writer

__all__ = ["BlockingShardWriter", "open_writer"]


def open_writer(url: str | os.PathLike[str], **options: Any) -> BlockingShardWriter:
    """Blocking twin of :func:`streamrec.open_writer`.

    ``with streamrec.sync.open_writer(path) as w: w.write(payload)``
    """
    return BlockingShardWriter(url, **options)


class BlockingShardWriter:
    """Blocking twin of :class:`ShardWriter`: ``with streamrec.sync.open_writer(...) as w``.

    Records are framed, compressed and routed to shards here, in the caller's thread; only
    blocks (``flush_bytes``) and shard ends cross into the background event loop.
    """

    def __init__(self, template: str | os.PathLike[str], **options: Any) -> None:
        self._writer = open_async_writer(template, **options)  # bad options fail before any thread
        self._portal = EventLoopThread(name="streamrec-writer")
        self.url = self._writer.template

    @property
    def records(self) -> int:
        """Records written so far."""
        return self._writer.records

    @property
    def shards(self) -> list[ManifestEntry]:
        """The shards committed so far, by index (all of them after ``close()``)."""
        return self._writer.shards

    @property
    def stats(self) -> UploadSettings:
        """The upload settings as they stand (see :attr:`ShardWriter.stats`)."""
        return self._writer.stats

    @property
    def manifest_url(self) -> str | None:
        """Where the manifest is written (None: no manifest)."""
        return self._writer.manifest_url

    def write(self, payload: BytesLike) -> None:
        """Append one record."""
        # Encode here, in the caller's thread; cross into the loop only per block.
        if self._writer.encode(payload):
            self._portal.call(self._writer.send())

    def write_many(self, payloads: Iterable[BytesLike]) -> None:
        """Append many records at once."""
        if self._writer.encode_many(payloads):
            self._portal.call(self._writer.send())

    def close(self) -> None:
        """Finish every shard and write the manifest. Idempotent."""
        try:
            if not self._portal.closed:
                self._portal.call(self._close())
        finally:
            self._portal.close()

    async def _close(self) -> None:
        await self._writer.close()  # (called in the loop's thread: the writer checks)

    def abort(self) -> None:
        """Drop every shard not yet committed. Idempotent."""
        try:
            if not self._portal.closed:
                self._portal.call(self._writer.abort())
        finally:
            self._portal.close()

    def __enter__(self) -> BlockingShardWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()
