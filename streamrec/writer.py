"""Writing TFRecord files: ``open_writer`` (async) and its blocking twin in ``streamrec.sync``.

Records are framed and compressed in the caller (cheap, chunked) and handed to the sink in
blocks of ``flush_bytes``; the sink makes the file appear only when it is complete: a writer
that fails, is cancelled, or leaves its ``with`` block by an exception leaves nothing at the
final path.
"""

from __future__ import annotations

from collections.abc import Iterable
from types import TracebackType
from typing import Any

from streamrec.errors import StorageError
from streamrec.format.crc import BytesLike
from streamrec.format.shard import ShardEncoder
from streamrec.storage.local import LocalStore
from streamrec.storage.sinks import AtomicLocalSink
from streamrec.storage.stores import store_key
from streamrec.sync import EventLoopThread

__all__ = ["BlockingShardWriter", "ShardWriter", "open_writer"]

_FLUSH_BYTES = 1 << 20


class _Encoded:
    """Payloads -> stored bytes, buffered until a block is worth handing to the sink."""

    def __init__(self, url: str, compression: str | None, flush_bytes: int) -> None:
        self.url = url
        self.encoder = ShardEncoder(compression)
        self.flush_bytes = flush_bytes
        self._pieces: list[bytes] = []
        self._size = 0

    def add(self, payload: BytesLike) -> bool:
        """Encode one payload; True when a block is ready to flush."""
        _check_payload(payload, self.url)
        piece = self.encoder.encode_one(payload)
        if piece:
            self._pieces.append(piece)
            self._size += len(piece)
        return self._size >= self.flush_bytes

    def add_many(self, payloads: Iterable[BytesLike]) -> bool:
        """Encode a chunk of payloads; True when a block is ready to flush."""
        chunk = list(payloads)
        for payload in chunk:
            _check_payload(payload, self.url)
        piece = self.encoder.encode(chunk)
        if piece:
            self._pieces.append(piece)
            self._size += len(piece)
        return self._size >= self.flush_bytes

    def take(self, final: bool = False) -> bytes:
        """The buffered block (with the compressor's trailer when ``final``)."""
        if final:
            self._pieces.append(self.encoder.finish())
        block = b"".join(self._pieces)
        self._pieces.clear()
        self._size = 0
        return block


def _check_payload(payload: object, url: str) -> None:
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        hint = ""
        if isinstance(payload, dict):
            hint = " (encode Examples with streamrec.example.encode)"
        raise TypeError(
            f"{url}: a record must be bytes-like, not {type(payload).__name__}{hint}"
        )


class ShardWriter:
    """Writes one TFRecord file; it appears at ``url`` only after a clean ``close()``.

    Use as ``async with open_writer(url) as w: await w.write(payload)``.
    """

    def __init__(
        self, url: str, *, compression: str | None = None, flush_bytes: int = _FLUSH_BYTES
    ) -> None:
        self.url = url
        self._encoded = _Encoded(url, compression, flush_bytes)
        if store_key(url) != "local":
            raise StorageError(f"{url}: writing is supported for local paths only so far")
        self._sink: AtomicLocalSink = LocalStore().open_sink(url)
        self._state = "open"

    @property
    def records(self) -> int:
        """Records written so far."""
        return self._encoded.encoder.records

    async def write(self, payload: BytesLike) -> None:
        """Append one record (a serialized Example or any bytes)."""
        self._check_open()
        if self._encoded.add(payload):
            await self._flush()

    async def write_many(self, payloads: Iterable[BytesLike]) -> None:
        """Append many records at once (faster than ``write`` in a loop for small records)."""
        self._check_open()
        if self._encoded.add_many(payloads):
            await self._flush()

    async def close(self) -> None:
        """Finish the file and make it appear at ``url``. Idempotent."""
        if self._state != "open":
            return
        try:
            block = self._encoded.take(final=True)
            if block:
                await self._sink.write(block)
            await self._sink.commit()
            self._state = "closed"
        except BaseException:
            await self.abort()
            raise

    async def abort(self) -> None:
        """Drop the file: nothing appears at ``url``. Idempotent."""
        if self._state == "aborted":
            return
        self._state = "aborted"
        await self._sink.abort()

    async def _flush(self) -> None:
        try:
            await self._sink.write(self._encoded.take())
        except BaseException:
            await self.abort()
            raise

    def _check_open(self) -> None:
        if self._state != "open":
            raise RuntimeError(f"{self.url}: writer is {self._state}")

    async def __aenter__(self) -> ShardWriter:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            await self.close()
        else:
            await self.abort()


def open_writer(url: str, *, compression: str | None = None, **options: Any) -> ShardWriter:
    """Open a TFRecord file for writing (async).

    ``compression`` is ``None``, ``"gzip"`` or ``"zlib"``. The file is written under a temporary
    name in the same directory and renamed into place by a clean ``close()``.
    """
    return ShardWriter(url, compression=compression, **options)


class BlockingShardWriter:
    """Blocking twin of :class:`ShardWriter`: ``with streamrec.sync.open_writer(url) as w``."""

    def __init__(self, url: str, **options: Any) -> None:
        self._portal = EventLoopThread(name="streamrec-writer")
        try:
            self._writer = ShardWriter(url, **options)
        except BaseException:
            self._portal.close()
            raise
        self.url = url

    @property
    def records(self) -> int:
        """Records written so far."""
        return self._writer.records

    def write(self, payload: BytesLike) -> None:
        """Append one record."""
        writer = self._writer
        writer._check_open()
        # Encode here, in the caller's thread; cross into the loop only per block.
        if writer._encoded.add(payload):
            self._portal.call(writer._flush())

    def write_many(self, payloads: Iterable[BytesLike]) -> None:
        """Append many records at once."""
        writer = self._writer
        writer._check_open()
        if writer._encoded.add_many(payloads):
            self._portal.call(writer._flush())

    def close(self) -> None:
        """Finish the file and make it appear. Idempotent."""
        try:
            self._portal.call(self._writer.close())
        finally:
            self._portal.close()

    def abort(self) -> None:
        """Drop the file. Idempotent."""
        try:
            if not self._portal._closed:
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
