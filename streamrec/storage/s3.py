"""``s3://`` through s3fs (aiobotocore): listing via s3fs, range GETs on its client directly.

Range reads are sent by us, with ``If-Match`` pinned to the listed ETag and botocore's own
retries off, so that streamrec's retry policy is the only one (s3fs and botocore would
otherwise retry for ~10 s underneath, and pass short bodies on): signed with SigV4 headers
on the object's url resolved once, through the client's HTTP session
(:mod:`streamrec.storage.s3_get`: a fraction of ``get_object``'s CPU per request), else with
the client's ``get_object``. Either way a body longer than the range asked for is an error
before the extra bytes are kept.
Bodies are read off aiohttp's stream in pieces (:func:`~streamrec.storage.body.read_pieces`),
never gathered and joined into a second copy.

Client set-up, sized for streaming unless ``storage_options`` say otherwise:

* botocore's connection pool (``max_pool_connections``, default 10) would cap the range GETs
  in flight across all shards; it is sized from ``max_connections`` (what the dataset may have
  in flight), through ``config_kwargs``.
* botocore's data loader (the parsed service model, endpoint rules and partitions, ~50-100 ms
  of JSON per client) is shared by every client of the process, so the second and later
  iterations (epochs, DataLoader workers forked after a first read) create theirs quickly.
  It parses into plain dicts (ordered since Python 3.7; botocore's ``OrderedDict`` hook makes
  the 1.2 MB endpoints file ~3x slower to parse), and checks that ``s3`` exists by looking
  at its own directory, not by listing all ~400 services' (botocore does, per model type): a
  fresh process (a spawned DataLoader worker, a Dask task) creates its first client in about
  half the time (~45 ms instead of ~90 ms here).
* the TLS context (loading the CA bundle, ~30-40 ms of CPU that aiobotocore spends before the
  first request) is built in a worker thread while the client is being created, which takes
  the same time on the event loop's thread (the bundle is parsed without holding the GIL).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, overload

from streamrec.errors import ObjectNotFoundError, StorageError
from streamrec.storage.base import Leftover, ObjectInfo, first_bytes, split_scheme
from streamrec.storage.body import parse_content_range, read_pieces
from streamrec.storage.fsspec_store import FsspecStore
from streamrec.storage.s3_get import RangeGetter, UseGetObject
from streamrec.storage.translate import translate

if TYPE_CHECKING:
    from streamrec.storage.s3_sink import S3MultipartSink
    from streamrec.storage.sinks import SinkContext

__all__ = ["DEFAULT_MAX_CONNECTIONS", "S3Store"]

DEFAULT_MAX_CONNECTIONS = 64
"""botocore's pool size when neither the caller nor ``config_kwargs`` says (botocore's own
default, 10, caps a dataset's range GETs in flight)."""

_shared_loader: Any = None  # botocore's data loader, shared by every client of the process


class S3Store(FsspecStore):
    """Objects in S3 or an S3-compatible server (``endpoint_url`` in ``client_kwargs``).

    ``max_connections``: the most requests the caller will have in flight at once (the pool
    is sized to it, at least 10); ``config_kwargs={"max_pool_connections": n}`` wins over it.
    """

    scheme = "s3"

    def __init__(
        self, storage_options: dict[str, Any] | None = None, *, max_connections: int | None = None
    ) -> None:
        import s3fs

        options = dict(storage_options or {})
        config = dict(options.pop("config_kwargs", None) or {})
        # botocore: total_max_attempts counts the first try (its max_attempts counts retries)
        config.setdefault("retries", {"total_max_attempts": 1, "mode": "standard"})
        pool = DEFAULT_MAX_CONNECTIONS if max_connections is None else max(10, max_connections)
        config.setdefault("max_pool_connections", pool)
        options.setdefault("skip_instance_cache", True)
        fs = s3fs.S3FileSystem(asynchronous=True, config_kwargs=config, **options)
        fs.retries = 1  # listing too: the retry policy is ours
        super().__init__(fs)
        self._session_ready = False
        self._getter = RangeGetter()  # signed range GETs (storage/s3_get.py)

    async def client(self) -> Any:
        """The aiobotocore S3 client (its session set up on first use), for sinks and tools
        that send their own requests: they get the client, not the store's internals."""
        if not self._session_ready:
            _share_loader(self.fs)
            tls = _start_tls_context(self.fs)
            await self.fs.set_session()
            if tls is not None:
                await _use_tls_context(self.fs._s3, *tls)
            self._session_ready = True
        return self.fs._s3

    async def _connect(self) -> None:
        await self.client()

    async def expand(self, pattern: str) -> list[ObjectInfo]:
        await self.client()
        return await super().expand(pattern)

    def version_of(self, info: dict[str, Any]) -> str | None:
        etag = info.get("ETag") or info.get("etag")
        return str(etag) if etag else None

    async def _read_head(self, url: str, length: int) -> tuple[ObjectInfo, list[bytes]] | None:
        bucket, key, version_id = self.fs.split_path(url)
        if not key or version_id:
            return None
        client = await self.client()
        try:
            response = await client.get_object(
                Bucket=bucket, Key=key, Range=f"bytes=0-{length - 1}"
            )
            pieces = await _body_pieces(response["Body"])
        except Exception as exc:
            if _error_code(exc) in ("InvalidRange", "416"):
                return None  # an empty object: no byte to ask for; look it up instead
            raise translate(exc, url, "reading its first bytes") from exc
        etag = response.get("ETag")
        content_range = parse_content_range(response.get("ContentRange"))
        if content_range is not None and content_range[2] is not None:
            size = content_range[2]
        elif content_range is None:  # the whole object, the range ignored
            size = sum(map(len, pieces))
        else:
            return None
        return ObjectInfo(url, size, str(etag) if etag else None), first_bytes(pieces, length)

    async def _fetch_pieces(self, obj: ObjectInfo, start: int, end: int) -> list[bytes]:
        client = await self.client()
        bucket, key, _ = self.fs.split_path(obj.url)
        action = f"reading bytes {start}-{end - 1}"
        if self._getter.serves(client, bucket):  # a fraction of get_object's CPU
            try:
                return await self._getter.get(client, bucket, key, start, end, obj.version, obj.url)
            except UseGetObject:
                pass  # the bucket is elsewhere: get_object's region redirector follows it
            except Exception as exc:
                raise translate(exc, obj.url, action) from exc
        extra = {"IfMatch": obj.version} if obj.version else {}
        try:
            response = await client.get_object(
                Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}", **extra
            )
            return await _body_pieces(response["Body"], end - start, f"{obj.url}: {action}")
        except Exception as exc:
            raise translate(exc, obj.url, action) from exc

    async def read_range(self, obj: ObjectInfo, start: int, end: int) -> bytes:
        return await self._read_joined(obj, start, end)

    def open_sink(self, url: str, context: SinkContext | None = None) -> S3MultipartSink:
        """A multipart upload that runs while bytes arrive; the object appears on commit."""
        from streamrec.storage.s3_sink import S3MultipartSink

        return S3MultipartSink(self, url, context)

    async def unfinished_writes(self, prefix: str) -> list[Leftover]:
        """The open multipart uploads under ``prefix`` (invisible, but billed)."""
        scheme = split_scheme(prefix)[0]
        bucket, key_prefix = _bucket_key(prefix)
        client = await self.client()
        found: list[Leftover] = []
        markers: dict[str, str] = {}
        while True:
            try:
                page = await client.list_multipart_uploads(
                    Bucket=bucket, Prefix=key_prefix, **markers
                )
            except Exception as exc:
                raise translate(exc, prefix, "listing open multipart uploads") from exc
            for upload in page.get("Uploads", []):
                found.append(
                    Leftover(
                        f"{scheme}://{bucket}/{upload['Key']}",
                        "multipart upload",
                        upload["Initiated"].timestamp(),
                        upload["UploadId"],
                    )
                )
            if not page.get("IsTruncated"):
                return found
            markers = {
                "KeyMarker": page["NextKeyMarker"],
                "UploadIdMarker": page["NextUploadIdMarker"],
            }

    async def abort_unfinished(self, leftover: Leftover) -> None:
        client = await self.client()
        bucket, key = _bucket_key(leftover.url)
        try:
            await client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=leftover.handle)
        except Exception as exc:
            error = translate(exc, leftover.url, "aborting a multipart upload")
            if not isinstance(error, ObjectNotFoundError):  # gone meanwhile: the goal holds
                raise error from exc

    async def close(self) -> None:
        self._heads.clear()
        if self._session_ready:
            self._session_ready = False
            client = self.fs._s3
            if client is not None:
                await client.__aexit__(None, None, None)


async def _body_pieces(body: Any, limit: int | None = None, what: str = "") -> list[bytes]:
    """A get_object body as pieces: straight off aiohttp's stream when it is a plain body
    (not one that verifies a checksum as it is read), else through ``read()``; with
    ``limit``, more bytes than that is an error (:func:`read_pieces`)."""
    from aiobotocore.response import AioStreamingBody  # type: ignore[import-untyped]

    try:
        content = getattr(body.raw_stream, "content", None)
        if type(body) is AioStreamingBody and hasattr(content, "readany"):
            return await read_pieces(content, limit=limit, what=what)
        data: bytes = await body.read()
        if limit is not None and len(data) > limit:
            raise StorageError(f"{what}: the server sent more than the {limit} bytes asked for")
        return [data] if data else []
    finally:
        body.close()


def _error_code(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return ""
    code = str(response.get("Error", {}).get("Code", ""))
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return code or str(status or "")


class _ServiceNames(Sequence[str]):
    """What botocore's ``Loader.list_available_services`` returns, computed only as far as it
    is asked: ``name in names`` looks into that service's directories alone (botocore's loader
    checks a service exists by listing all ~400 of them, ~15 ms per model type); anything
    else lists them all, as botocore would."""

    def __init__(self, loader: Any, type_name: str, list_all: Callable[[], list[str]]) -> None:
        self._loader, self._type_name, self._list_all = loader, type_name, list_all
        self._all: list[str] | None = None

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str) or os.sep in name or name.startswith("."):
            return False
        for location in self._loader._potential_locations():
            directory = os.path.join(location, name)
            if os.path.isdir(directory) and any(
                self._loader.file_loader.exists(os.path.join(directory, v, self._type_name))
                for v in os.listdir(directory)
            ):
                return True
        return False

    def _names(self) -> list[str]:
        if self._all is None:
            self._all = self._list_all()
        return self._all

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[str]: ...
    def __getitem__(self, index: int | slice) -> str | Sequence[str]:
        return self._names()[index]

    def __len__(self) -> int:
        return len(self._names())


def _fast_loader(default: Any) -> Any:
    """A botocore data loader with ``default``'s search paths that parses JSON into plain
    dicts and checks that a service exists without listing every service."""
    import json

    import botocore.loaders

    class PlainJSONFileLoader(botocore.loaders.JSONFileLoader):  # type: ignore[misc]
        def _load_file(self, full_path: str, open_method: Any) -> Any:
            if not os.path.isfile(full_path):
                return None
            with open_method(full_path, "rb") as fp:
                return json.loads(fp.read().decode("utf-8"))

    class Loader(botocore.loaders.Loader):  # type: ignore[misc]
        def list_available_services(self, type_name: str) -> Sequence[str]:
            parent = super().list_available_services
            return _ServiceNames(self, type_name, lambda: parent(type_name))

    return Loader(
        extra_search_paths=list(default.search_paths),
        file_loader=PlainJSONFileLoader(),
        include_default_search_paths=False,
    )


def _share_loader(fs: Any) -> None:
    """Give ``fs`` a botocore session whose data loader is the process-wide one (unless the
    user passed a session of their own)."""
    global _shared_loader
    if getattr(fs, "session", None) is not None:
        return
    try:
        import aiobotocore.session  # type: ignore[import-untyped]

        session = aiobotocore.session.AioSession(**getattr(fs, "kwargs", {}))
        if _shared_loader is None:
            _shared_loader = _fast_loader(session.get_component("data_loader"))
        session.register_component("data_loader", _shared_loader)
    except Exception:  # an optimisation only: s3fs then makes its own session
        return
    fs.session = session
    if hasattr(fs, "_session_is_owned"):
        fs._session_is_owned = True


def _start_tls_context(fs: Any) -> tuple[Any, asyncio.Future[Any]] | None:
    """Start building, in a worker thread, the TLS context aiobotocore will want for the
    client ``fs`` is about to create: ``(verify, future)``, or None when it cannot tell."""
    try:
        from aiobotocore.httpsession import AIOHTTPSession  # type: ignore[import-untyped]

        verify = (fs.client_kwargs or {}).get("verify")
        if verify is None and fs.session is not None:
            verify = fs.session.get_config_variable("ca_bundle")
        if verify is None:
            verify = os.environ.get("REQUESTS_CA_BUNDLE", True)
        if not verify:
            return None  # nothing slow to build
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(
            None, lambda: AIOHTTPSession(verify=verify)._build_ssl_contexts(None)[0]
        )
    except Exception:  # an optimisation only
        return None
    future.add_done_callback(lambda done: done.cancelled() or done.exception())
    return verify, future


async def _use_tls_context(client: Any, verify: Any, future: asyncio.Future[Any]) -> None:
    """Hand the context built by :func:`_start_tls_context` to the client's HTTP session, if
    the client resolved the same ``verify`` and needs nothing else (client certificate)."""
    try:
        context = await future
        http = client._endpoint.http_session
        original = http._build_ssl_contexts
        if http._verify != verify or getattr(http, "_cert_file", None):
            return
    except Exception:  # an optimisation only: aiobotocore builds its own
        return

    def prebuilt(proxy_url: str | None) -> tuple[Any, Any]:
        if proxy_url is None:
            return context, None
        return original(proxy_url)  # type: ignore[no-any-return]

    http._build_ssl_contexts = prebuilt


def _bucket_key(url: str) -> tuple[str, str]:
    _, rest = split_scheme(url)
    bucket, _, key = rest.partition("/")
    return bucket, key
