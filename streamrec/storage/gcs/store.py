"""``gs://``: globs' listing pages and range GETs on the store's own session, gcsfs for the
rest of the listing.

gcsfs retries every request 6 times over ~35 s, and that cannot be changed at run time, and it
follows a listing's pages inside one call; range reads and the listing pages of a glob
(:meth:`GCSStore.glob_pages`, :mod:`streamrec.storage.gcs.listing`: a page a request, each
under streamrec's retry policy) therefore go straight to the JSON API on the store's own
aiohttp session, authenticated
with gcsfs's credentials (:mod:`streamrec.storage.gcs.client`), with ``ifGenerationMatch``
pinned to the listed generation (and the ``X-Goog-Generation`` of every answer compared), so
that streamrec's retry policy is the only one on the data path. Bodies are read off aiohttp's
stream in pieces (:func:`~streamrec.storage.http.body.read_pieces`), never joined into a
second copy.
The session's connector allows 100 connections (aiohttp's default), which does not cap a
dataset's range reads.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, quote_plus

import aiohttp

from streamrec.errors import PermissionDeniedError, StorageError, TransientStorageError
from streamrec.storage.base import ObjectInfo, split_scheme
from streamrec.storage.fsspec_store import FsspecStore
from streamrec.storage.gcs.client import (
    LOOKING_FOR_CREDENTIALS,
    location_of,
    open_session,
    request_headers,
    start_filesystem,
)
from streamrec.storage.gcs.listing import list_page
from streamrec.storage.gcs.sink import GCSAccess, GCSResumableSink
from streamrec.storage.http.body import get_range, probe_first_bytes
from streamrec.storage.pages import Listed, follow_pages, glob_prefix
from streamrec.storage.retry import waiting_for
from streamrec.storage.sink_base import bucket_and_key

if TYPE_CHECKING:
    from streamrec.storage.retry import RetryPolicy
    from streamrec.storage.sink_base import SinkContext

__all__ = ["GCSStore"]


class GCSStore(FsspecStore):
    """Objects in Google Cloud Storage or an emulator (``endpoint_url`` option)."""

    scheme = "gs"

    def __init__(self, storage_options: dict[str, Any] | None = None) -> None:
        options = dict(storage_options or {})
        options.setdefault("skip_instance_cache", True)
        # The filesystem is made on first use, off the loop (it may look for credentials
        # for a minute): :mod:`streamrec.storage.gcs.client`.
        super().__init__(None)
        self._options = options
        self._making: asyncio.Future[Any] | None = None
        self._http: aiohttp.ClientSession | None = None  # (kept once closed: no second one)

    async def filesystem(self, url: str = "gs://") -> Any:
        """The gcsfs filesystem, made on first use (see :mod:`~streamrec.storage.gcs.client`);
        ``url``: what the caller is about to use it for (named in an error)."""
        if self.fs is None:
            if self._making is None:
                self._making = start_filesystem(self._options)
            # A timed-out attempt names the lookup: the note ends only when the wait does
            # (not when the timeout cancels it).
            done = waiting_for(LOOKING_FOR_CREDENTIALS)
            try:
                # shielded: an attempt that times out leaves the lookup to the next one
                fs = await asyncio.shield(self._making)
            except Exception as exc:
                done()
                # google-auth's errors: credentials asked for (a token) but not usable
                denied = type(exc).__module__.startswith("google.auth")
                kind = PermissionDeniedError if denied else StorageError
                raise kind(
                    f"{url}: could not set up the GCS client: {type(exc).__name__}: "
                    f"{self._without_token(str(exc))}"
                ) from None  # (its message may hold the token: google-auth quotes it)
            done()
            if self.fs is None:
                self.fs = fs
        return self.fs

    def _without_token(self, text: str) -> str:
        """``text`` with a ``token`` given as a string (an access token, or a file name)
        blanked out, in the forms urls carry it."""
        token = self._options.get("token")
        if isinstance(token, str) and len(token) > 3:
            for form in (token, quote(token, safe=""), quote_plus(token)):
                text = text.replace(form, "***")
        return text

    def billed(self, url: str) -> str:
        """``url`` with ``userProject`` added where gcsfs adds it to its own requests: when
        the options ask for requester pays (``requester_pays=True`` bills ``project``,
        ``requester_pays="other-project"`` that one). Call after :meth:`filesystem`."""
        requester_pays = self.fs.requester_pays
        if not requester_pays or "userProject=" in url:
            return url
        project = requester_pays if isinstance(requester_pays, str) else self.fs.project
        if not project:
            raise StorageError(
                f"{url}: requester_pays needs a project to bill: pass storage_options "
                '{"project": ...} or {"requester_pays": "project-id"}'
            )
        return f"{url}{'&' if '?' in url else '?'}userProject={quote(str(project), safe='')}"

    def split_path(self, url: str) -> tuple[str, str, None]:
        """``(bucket, key, None)`` of a ``gs://bucket/key`` url (no filesystem needed)."""
        _, path = split_scheme(url)
        bucket, _, key = path.partition("/")
        return bucket, key, None

    async def location(self, url: str = "gs://") -> str:
        """The JSON API's ``scheme://host`` (``url``: what it is for, named in an error)."""
        return location_of(await self.filesystem(url))

    def headers(self, extra: dict[str, str]) -> dict[str, str]:
        """``extra`` with the credentials' headers. Call after :meth:`filesystem`."""
        return request_headers(self.fs, extra)

    async def session(self, url: str = "gs://") -> aiohttp.ClientSession:
        """The store's own session for range reads and uploads, made on first use
        (``url``: what it is for, named in an error)."""
        location = await self.location(url)
        if self._http is None:
            http = await open_session(self._options, location)
            if self._http is None:
                self._http = http
            else:  # (another first use made one meanwhile)
                await http.close()
        return self._http

    def access(self) -> GCSAccess:
        """What a sink needs of this store to send its requests."""
        return GCSAccess(
            session=self.session, location=self.location, headers=self.headers, billed=self.billed
        )

    async def _connect(self) -> None:
        await self.filesystem()

    async def expand(self, pattern: str) -> list[ObjectInfo]:
        await self.filesystem(pattern)  # (gcsfs's listing: it makes its own session)
        return await super().expand(pattern)

    list_page_keys = 1000
    """Objects per listing page (the JSON API's most; tests make it small)."""

    def glob_pages(
        self,
        pattern: str,
        retry: RetryPolicy | None = None,
        on_retry: Callable[[TransientStorageError], None] | None = None,
        *,
        warm: bool = True,
    ) -> AsyncGenerator[list[ObjectInfo], None] | None:
        """A glob listed as gcsfs's glob lists it (the prefix up to the first wildcard,
        fsspec's pattern on the names: :func:`~streamrec.storage.pages.glob_prefix`; ``/`` as
        delimiter for a wildcard in the last component only, none, every object below the
        prefix, for ``**`` or a wildcard above the last level) but by streamrec's own JSON
        API requests, a page at a time (:mod:`streamrec.storage.gcs.listing`): each page
        checked against the ones before and, with ``retry``, timed and retried alone, from
        its own ``pageToken``. Globs with a wildcard in the bucket, and version-aware
        filesystems: None (gcsfs lists them)."""
        glob = glob_prefix(self.path_of(pattern))
        if glob is None or self._options.get("version_aware"):
            return None
        keys = self.list_page_keys

        def one_page(token: str | None, before: int) -> Awaitable[tuple[list[Listed], str | None]]:
            return list_page(
                self, pattern, glob.bucket, glob.prefix, token, before, keys, glob.delimiter
            )

        return follow_pages(pattern, glob, one_page, self.url_of, retry, on_retry)

    def version_of(self, info: dict[str, Any]) -> str | None:
        generation = info.get("generation")
        return str(generation) if generation else None

    async def _read_head(self, url: str, length: int) -> tuple[ObjectInfo, list[bytes]] | None:
        if "?" in url or "#" in url:
            return None
        session = await self.session(url)
        headers = self.headers({"Range": f"bytes=0-{length - 1}"})
        return await probe_first_bytes(
            session, self.billed(self.fs.url(url)), url, headers, length, "X-Goog-Generation"
        )

    async def _fetch_pieces(self, obj: ObjectInfo, start: int, end: int) -> list[bytes]:
        session = await self.session(obj.url)
        url = self.billed(self.fs.url(obj.url))
        if obj.version:
            url += f"&ifGenerationMatch={obj.version}"
        headers = self.headers({})
        return await get_range(session, url, obj, start, end, headers, "X-Goog-Generation")

    async def read_range(self, obj: ObjectInfo, start: int, end: int) -> bytes:
        return await self._read_joined(obj, start, end)

    def open_sink(self, url: str, context: SinkContext | None = None) -> GCSResumableSink:
        """A resumable upload that runs while bytes arrive; the object appears on commit."""
        bucket, key = bucket_and_key(self, url, "a GCS object url")
        return GCSResumableSink(self.access(), url, bucket, key, context)

    async def close(self) -> None:
        self._heads.clear()
        if self._http is not None:
            await self._http.close()
        if self.fs is not None:
            await _close_filesystem_session(self.fs)
            # a connector of the caller's session_kwargs: gcsfs's session owns it, and may
            # never have been made
            given = (self._options.get("session_kwargs") or {}).get("connector")
            if given is not None and not given.closed:
                await given.close()
        elif self._making is not None and not self._making.done():
            self._making.cancel()  # (the thread finishes on its own; its result is dropped)


async def _close_filesystem_session(fs: Any) -> None:
    """Close gcsfs's own session (its listing requests), if it made one."""
    try:
        session = fs.session
    except RuntimeError:  # gcsfs (asynchronous) says it has not made one
        return
    if session is not None:
        await session.close()
