"""``s3://`` through s3fs (aiobotocore): listing via s3fs, range GETs on its client directly.

Range reads call the aiobotocore client's ``get_object`` ourselves, with ``IfMatch`` pinned to
the listed ETag and botocore's own retries off, so that streamrec's retry policy is the only
one (s3fs and botocore would otherwise retry for ~10 s underneath, and pass short bodies on).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from streamrec.storage.base import ObjectInfo
from streamrec.storage.fsspec_store import FsspecStore
from streamrec.storage.translate import translate

if TYPE_CHECKING:
    from streamrec.storage.s3_sink import S3MultipartSink
    from streamrec.storage.sinks import SinkContext

__all__ = ["S3Store"]


class S3Store(FsspecStore):
    """Objects in S3 or an S3-compatible server (``endpoint_url`` in ``client_kwargs``)."""

    scheme = "s3"

    def __init__(self, storage_options: dict[str, Any] | None = None) -> None:
        import s3fs

        options = dict(storage_options or {})
        config = dict(options.pop("config_kwargs", None) or {})
        # botocore: total_max_attempts counts the first try (its max_attempts counts retries)
        config.setdefault("retries", {"total_max_attempts": 1, "mode": "standard"})
        options.setdefault("skip_instance_cache", True)
        fs = s3fs.S3FileSystem(asynchronous=True, config_kwargs=config, **options)
        fs.retries = 1  # listing too: the retry policy is ours
        super().__init__(fs)
        self._session_ready = False

    async def _client(self) -> Any:
        if not self._session_ready:
            await self.fs.set_session()
            self._session_ready = True
        return self.fs._s3

    async def expand(self, pattern: str) -> list[ObjectInfo]:
        await self._client()
        return await super().expand(pattern)

    def version_of(self, info: dict[str, Any]) -> str | None:
        etag = info.get("ETag") or info.get("etag")
        return str(etag) if etag else None

    async def read_range(self, obj: ObjectInfo, start: int, end: int) -> bytes:
        client = await self._client()
        bucket, key, _ = self.fs.split_path(obj.url)
        extra = {"IfMatch": obj.version} if obj.version else {}
        try:
            response = await client.get_object(
                Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}", **extra
            )
            body = response["Body"]
            try:
                data: bytes = await body.read()
            finally:
                body.close()
        except Exception as exc:
            raise translate(exc, obj.url, f"reading bytes {start}-{end - 1}") from exc
        return data

    def open_sink(self, url: str, context: SinkContext | None = None) -> S3MultipartSink:
        """A multipart upload that runs while bytes arrive; the object appears on commit."""
        from streamrec.storage.s3_sink import S3MultipartSink

        return S3MultipartSink(self, url, context)

    async def close(self) -> None:
        if self._session_ready:
            self._session_ready = False
            client = self.fs._s3
            if client is not None:
                await client.__aexit__(None, None, None)
