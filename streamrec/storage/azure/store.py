"""``az://`` and ``abfs://``: globs listed a page at a time and range GETs through the SDK.

A glob (its wildcards below the container) is listed a page at a time through the SDK's
pager (:meth:`AzureStore.glob_pages`, :mod:`streamrec.storage.azure.listing`: each page under
streamrec's retry policy); other globs and lookups through adlfs. adlfs lists and globs blobs
with an ``azure.storage.blob.aio`` ``BlobServiceClient``, which
the store makes again from the public properties of adlfs's (its url, credential and hosts)
with the SDK's retries off (``retry_total=0``; 10 attempts with exponential backoff by
default), so that streamrec's :class:`~streamrec.storage.retry.RetryPolicy` is the only one
for every request of the store and its sink, listing included. Range reads are one ``Get
Blob`` request per call, with ``If-Match`` pinned to the listed ETag (and the ETag of every
answer compared), so a replaced blob raises :class:`~streamrec.errors.ObjectChangedError`.
They are sent by the public ``download_blob``, whose own reading of the body is not used (it
would read the answer into one ``bytes`` whatever its size, and ask again by itself when a
body is short): the SDK's documented ``raw_response_hook`` hands the streamed answer over
before the SDK reads it (:class:`_Answer`), and the body is read off aiohttp's stream in
pieces (:func:`~streamrec.storage.http.body.read_pieces`), no more than the range asked for.

Credentials are adlfs's ``storage_options`` (see the README): ``connection_string``;
``account_name`` with ``account_key``, ``sas_token`` or ``credential``; or
``anon=False`` for ``DefaultAzureCredential``. Against the Azurite emulator only a
connection string works (adlfs turns ``account_host`` into https).
"""

from __future__ import annotations

import dataclasses
import logging
import time
import weakref
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

from streamrec.errors import (
    ObjectChangedError,
    ObjectNotFoundError,
    StorageError,
    TransientStorageError,
)
from streamrec.storage import timing
from streamrec.storage.azure.listing import capped_transport, list_page, refuse_hostile_page
from streamrec.storage.azure.sink import AzureBlockSink
from streamrec.storage.base import Leftover, ObjectInfo, first_bytes, split_scheme
from streamrec.storage.fsspec_store import FsspecStore
from streamrec.storage.http.body import (
    parse_content_range,
    probed_size,
    ranges_ignored,
    read_pieces,
    read_pieces_within,
)
from streamrec.storage.pages import Listed, follow_pages, glob_prefix
from streamrec.storage.translate import translate

if TYPE_CHECKING:
    from streamrec.storage.retry import RetryPolicy
    from streamrec.storage.sink_base import SinkContext

__all__ = ["AzureStore"]

logger = logging.getLogger("streamrec")

NO_RETRIES: dict[str, Any] = {"retry_total": 0}
"""Per-request option that turns the Azure SDK's own retries off (ours decide)."""
ONE_REQUEST = 1 << 62
"""``max_single_get_size`` of the store's client: a range read is one request, whatever its
length (the SDK's default, 32 MiB, would ask for the first 32 MiB only)."""


class _Answer(Exception):
    """Raised by the ``raw_response_hook`` of a range read to take the answer (its body not
    read yet) out of the SDK."""

    def __init__(self, response: Any) -> None:
        super().__init__("the answer of a range read")
        self.response = response


def _take_answer(pipeline_response: Any) -> None:
    """``raw_response_hook``: a success's answer is handed over unread; an error's goes on to
    the SDK, which raises its exception for it."""
    response = pipeline_response.http_response
    if 200 <= response.status_code < 300:
        raise _Answer(response)


class AzureStore(FsspecStore):
    """Blobs in Azure Blob Storage (or Azurite), by ``az://container/path`` or ``abfs://``."""

    scheme = "az"

    def __init__(self, storage_options: dict[str, Any] | None = None) -> None:
        import adlfs

        options = dict(storage_options or {})
        options.setdefault("skip_instance_cache", True)
        try:
            fs = adlfs.AzureBlobFileSystem(asynchronous=True, **options)
        except ValueError as exc:  # adlfs: no or unusable credentials
            raise StorageError(f"az://: cannot set up the Azure client: {exc}") from exc
        super().__init__(fs)
        _detach_finalizers(fs)
        # Listing through adlfs too: one attempt per request (every container and blob client
        # made from this service client shares its configuration).
        fs.service_client = _without_retries(fs.service_client)
        self._blobs: dict[tuple[str, str], Any] = {}

    # ------------------------------------------------------------------ clients

    def blob_client(self, url: str) -> Any:
        """The SDK's ``BlobClient`` of the blob ``url`` (kept per blob), for the sink and
        tools that send their own requests."""
        container, blob = container_and_blob(self.fs, url)
        client = self._blobs.get((container, blob))
        if client is None:
            if len(self._blobs) >= 4096:  # a long run over many blobs: keep the newest
                self._blobs.clear()
            client = self.fs.service_client.get_blob_client(container=container, blob=blob)
            self._blobs[(container, blob)] = client
        return client

    def url_of(self, name: str) -> str:
        return name if "://" in name else f"{self.scheme}://{name}"

    def version_of(self, info: dict[str, Any]) -> str | None:
        etag = info.get("etag") or info.get("ETag")
        return str(etag) if etag else None

    async def expand(self, pattern: str) -> list[ObjectInfo]:
        objects = await super().expand(pattern)
        scheme = split_scheme(pattern)[0]
        if scheme == self.scheme:
            return objects
        # the user's scheme (abfs://) kept on what a glob found
        return [
            dataclasses.replace(o, url=f"{scheme}://{split_scheme(o.url)[1]}")
            if split_scheme(o.url)[0] != scheme
            else o
            for o in objects
        ]

    list_page_keys = 1000
    """Blobs per listing page (as S3's; tests make it small). A page lists each blob's
    metadata (directories are marked there), up to ~256 elements per blob: a page of 1,000
    keeps the elements a hostile page may hold before it is refused
    (:func:`~streamrec.storage.azure.listing.refuse_hostile_page`) to ~320k, where the
    service's most, 5,000, would let a page of 1.6M parse (~150 MB)."""

    def glob_pages(
        self,
        pattern: str,
        retry: RetryPolicy | None = None,
        on_retry: Callable[[TransientStorageError], None] | None = None,
        *,
        warm: bool = True,
    ) -> AsyncGenerator[list[ObjectInfo], None] | None:
        """A glob listed as adlfs's glob lists it (the prefix up to the first wildcard,
        fsspec's pattern on the names: :func:`~streamrec.storage.pages.glob_prefix`) but a
        page at a time through the SDK's pager (:mod:`streamrec.storage.azure.listing`; one
        level, ``/`` as delimiter, for a wildcard in the last component only, every blob
        below the prefix for ``**`` or a wildcard above the last level): each page checked
        against the ones before (every blob below the prefix: in name order or depth first) and,
        with ``retry``, timed and retried alone, from its own marker. The urls keep the
        pattern's scheme (``abfs://``). Globs with a wildcard in the container: None (adlfs
        lists them)."""
        glob = glob_prefix(self.path_of(pattern))
        if glob is None or not glob.bucket:
            return None
        scheme = split_scheme(pattern)[0]
        container = self.fs.service_client.get_container_client(glob.bucket)
        keys = self.list_page_keys

        def one_page(token: str | None, before: int) -> Awaitable[tuple[list[Listed], str | None]]:
            return list_page(
                container, pattern, glob.prefix, token, before, keys, NO_RETRIES, glob.delimiter
            )

        def url_of(name: str) -> str:
            return f"{scheme}://{name}"

        # a flat listing of a hierarchical namespace comes depth first, not in name order
        deep = not glob.delimiter
        return follow_pages(pattern, glob, one_page, url_of, retry, on_retry, depth_first=deep)

    # ------------------------------------------------------------------ reads

    async def _get(self, url: str, start: int, end: int, etag: str | None) -> Any:
        """One ``Get Blob`` of bytes ``start:end`` (pinned to ``etag``): the raw response,
        its body not read yet. HTTP errors raise the SDK's exceptions (the caller
        translates)."""
        from azure.core import MatchConditions

        pinned: dict[str, Any] = (
            {"etag": etag, "match_condition": MatchConditions.IfNotModified} if etag else {}
        )
        try:
            await self.blob_client(url).download_blob(
                offset=start,
                length=end - start,
                max_concurrency=1,
                raw_response_hook=_take_answer,
                **pinned,
                **NO_RETRIES,
            )
        except _Answer as answer:
            return answer.response
        raise StorageError(f"{url}: the Azure SDK read the answer itself")  # (never: the hook)

    async def _read_head(self, url: str, length: int) -> tuple[ObjectInfo, list[bytes]] | None:
        if "?" in url or "#" in url:
            return None
        action = "reading its first bytes"
        try:
            response = await self._get(url, 0, length, None)
            try:
                status = response.status_code
                headers = response.headers
                size = probed_size(
                    status, headers.get("Content-Range"), _content_length(headers), length
                )
                if size is None:
                    return None  # ranges ignored on a big blob: look it up instead
                pieces = await read_pieces_within(response.internal_response.content, length)
            finally:
                response.internal_response.close()
        except Exception as exc:
            if getattr(exc, "status_code", None) == 416:
                return None  # an empty blob: no byte to ask for; look it up instead
            raise translate(exc, url, action) from exc
        if pieces is None:
            return None  # more than was asked: look the blob up instead
        etag = headers.get("ETag")
        return ObjectInfo(url, size, str(etag) if etag else None), first_bytes(pieces, length)

    async def _fetch_pieces(self, obj: ObjectInfo, start: int, end: int) -> list[bytes]:
        action = f"reading bytes {start}-{end - 1}"
        try:
            asked = time.perf_counter()
            response = await self._get(obj.url, start, end, obj.version)
            timing.first_byte(time.perf_counter() - asked)  # (the SDK returns at the headers)
            try:
                headers = response.headers
                etag = headers.get("ETag")
                # Not every server honours If-Match: compare the ETag served too.
                if obj.version and etag and etag != obj.version:
                    raise ObjectChangedError(
                        f"{obj.url}: the object changed while it was being read"
                    )
                if response.status_code == 200 and (start, end) != (0, obj.size):
                    raise ranges_ignored(obj, start, end)
                answered = parse_content_range(headers.get("Content-Range"))
                if answered is not None and answered[0] != start:
                    raise StorageError(
                        f"{obj.url}: asked for bytes {start}-{end - 1}, the server answered "
                        f"bytes {answered[0]}-{answered[1]}"
                    )
                return await read_pieces(
                    response.internal_response.content,
                    limit=end - start,
                    what=f"{obj.url}: {action}",
                )
            finally:
                response.internal_response.close()
        except StorageError:
            raise
        except Exception as exc:
            raise translate(exc, obj.url, action) from exc

    async def read_range(self, obj: ObjectInfo, start: int, end: int) -> bytes:
        return await self._read_joined(obj, start, end)

    # ------------------------------------------------------------------ writes

    def open_sink(self, url: str, context: SinkContext | None = None) -> AzureBlockSink:
        """Blocks staged while bytes arrive, committed in one ``Put Block List``: the blob
        appears on commit only."""
        container, blob = container_and_blob(self.fs, url)
        return AzureBlockSink(self.blob_client, url, container, blob, context)

    async def delete(self, url: str) -> None:
        try:
            await self.blob_client(url).delete_blob(**NO_RETRIES)
        except Exception as exc:
            error = translate(exc, url, "removing it")
            if not isinstance(error, ObjectNotFoundError):
                raise error from exc

    async def unfinished_writes(self, prefix: str) -> list[Leftover]:
        """Blobs under ``prefix`` that have staged (uncommitted) blocks and no committed
        content: what a killed writer leaves. They are invisible to readers and listings, and
        the service discards them 7 days after their last block was staged."""
        scheme = split_scheme(prefix)[0]
        container, blob_prefix = container_and_blob(self.fs, prefix, key_required=False)
        client = self.fs.service_client.get_container_client(container)
        committed: set[str] = set()
        staged: dict[str, float] = {}
        try:
            async for blob in client.list_blobs(name_starts_with=blob_prefix, **NO_RETRIES):
                committed.add(blob.name)
            async for blob in client.list_blobs(
                name_starts_with=blob_prefix, include=["uncommittedblobs"], **NO_RETRIES
            ):
                if blob.name not in committed:
                    modified = blob.last_modified or blob.creation_time
                    staged[blob.name] = modified.timestamp() if modified else 0.0
        except Exception as exc:
            raise translate(exc, prefix, "listing uncommitted blobs") from exc
        return [
            Leftover(f"{scheme}://{container}/{name}", "uncommitted blocks", started, name)
            for name, started in sorted(staged.items())
        ]

    async def abort_unfinished(self, leftover: Leftover) -> None:
        """Discard a blob's uncommitted blocks by deleting the blob (Azure has no call that
        drops staged blocks alone). A service that answers 404 (nothing committed to delete)
        keeps them until it discards them itself, 7 days after the last was staged: that is
        logged, not raised. A blob committed meanwhile is deleted only if it is still the
        listed leftover: the delete is not sent when the blob has committed content now."""
        action = "discarding its uncommitted blocks"
        client = self.blob_client(leftover.url)
        try:
            await client.get_blob_properties(**NO_RETRIES)
        except Exception as exc:
            if not isinstance(translate(exc, leftover.url, action), ObjectNotFoundError):
                raise translate(exc, leftover.url, action) from exc
        else:
            return  # committed since it was listed: a writer finished it; leave it
        try:
            await client.delete_blob(**NO_RETRIES)
        except Exception as exc:
            error = translate(exc, leftover.url, action)
            if not isinstance(error, ObjectNotFoundError):
                raise error from exc
            logger.info(
                "%s: the service will not delete a blob with only uncommitted blocks; it "
                "discards them 7 days after the last was staged",
                leftover.url,
            )

    async def close(self) -> None:
        self._heads.clear()
        self._blobs.clear()
        fs, client = self.fs, getattr(self.fs, "service_client", None)
        if client is not None:
            await client.close()
        credential = getattr(fs, "credential", None)
        if credential is not None and hasattr(credential, "close"):
            await credential.close()


def _detach_finalizers(fs: Any) -> None:
    """Drop the finalizers adlfs registers to close its clients on ``fs``'s loop when ``fs`` is
    collected: they fail (and print a traceback at exit) once that loop is gone, they keep
    ``fs`` alive until then (they hold it), and the store closes the clients itself
    (:meth:`AzureStore.close`), inside its loop. A ``weakref.finalize`` is the callback of a
    weak reference to its object: found through ``weakref.getweakrefs``."""
    for ref in weakref.getweakrefs(fs):
        finalizer = ref.__callback__
        if isinstance(finalizer, weakref.finalize):
            finalizer.detach()


def _without_retries(client: Any) -> Any:
    """adlfs's ``BlobServiceClient`` made again from its public properties (url with any SAS,
    credential, hosts, location mode, adlfs's User-Agent), with the SDK's retries off, range
    reads of any length in one request (:data:`ONE_REQUEST`), answers read whole within
    bounds and listing pages looked at before the SDK parses them
    (:mod:`streamrec.storage.azure.listing`). No connection is open yet: the old one is
    dropped."""
    from adlfs import __version__
    from azure.storage.blob.aio import BlobServiceClient

    made = BlobServiceClient(
        account_url=client.primary_endpoint,
        credential=client.credential,
        secondary_hostname=client.secondary_hostname,
        max_single_get_size=ONE_REQUEST,
        user_agent=f"adlfs/{__version__}",
        transport=capped_transport(),
        raw_response_hook=refuse_hostile_page,  # (a range read passes its own: _take_answer)
        **NO_RETRIES,
    )
    if made.location_mode != client.location_mode:
        made.location_mode = client.location_mode
    return made


def container_and_blob(fs: Any, url: str, *, key_required: bool = True) -> tuple[str, str]:
    """``(container, blob name)`` of an ``az://`` / ``abfs://`` url, split by adlfs."""
    container, blob, _ = fs.split_path(url)
    if not container or (key_required and not blob):
        raise StorageError(f"{url}: an Azure blob url needs a container and a blob name")
    return container, blob


def _content_length(headers: Any) -> int | None:
    value = headers.get("Content-Length")
    return int(value) if value and str(value).isdigit() else None
