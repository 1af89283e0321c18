"""A listing page of Azure Blob Storage, asked for by streamrec: one ``List Blobs`` request
through the SDK's public paging API, one page per call.

adlfs lists a prefix by iterating the SDK's pager to its end, every page inside one call: a
``NextMarker`` that comes again is followed until the attempt's time runs out, and a listing
of many pages must fit in one attempt. A glob's listing
(:func:`~streamrec.storage.pages.glob_prefix`) is therefore asked for here a page at a time
(:func:`list_page`: ``ContainerClient.walk_blobs(...).by_page(continuation_token=...)``, its
first page taken, then its ``continuation_token``), each page one attempt that
:func:`~streamrec.storage.pages.follow_pages` times, retries from its own marker and checks
against the pages before it. ``walk_blobs`` lists one level (``/`` the delimiter), so a page's
blob names are in name order even where a hierarchical namespace lists a whole tree depth
first; the prefixes it also lists are not objects and are skipped. A glob with ``**`` or a
wildcard above the last level lists every blob below its prefix (``list_blobs``, flat, as
adlfs's glob lists every glob): in name order on a flat namespace, depth first (``a/b``
before ``a-c``) on a hierarchical one, so such a listing's keys are checked to increase in
one of the two orders (:class:`~streamrec.storage.pages.PageTrail`'s ``depth_first``).

A blob whose metadata marks it a directory (``is_directory`` or ``hdi_isfolder`` ``true``:
adlfs's ``mkdir``, a hierarchical namespace's directories) is no object, as adlfs sees it.

The SDK reads a listing page whole and parses it into a tree before it hands anything on
(azure-core's ``ContentDecodePolicy``): a 16 MiB page of empty or nested elements would cost
hundreds of MB of element objects first, and a body of any length would be read. The store's
client therefore reads every answer it takes whole to at most :data:`ANSWER_BYTES`
(:func:`capped_transport`: its aiohttp session's ``response_class``; range reads stream and
are not touched), and looks at each listing answer before the SDK parses it
(:func:`refuse_hostile_page`, the client's documented ``raw_response_hook``, which runs
inside the pipeline's decoding): counted a piece at a time, without building a tree, a page
nested deeper than :data:`PAGE_DEPTH` or of more elements than :data:`ELEMENTS_PER_BLOB` per
blob asked for is :class:`HostilePage`. Either is a
:class:`~streamrec.errors.StorageError` naming the url and the page, not asked for again.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, urlsplit
from xml.etree import ElementTree

from streamrec.errors import StorageError
from streamrec.redact import redact
from streamrec.storage.http.body import AnswerTooLong, capped_answers
from streamrec.storage.pages import Listed
from streamrec.storage.translate import translate

__all__ = [
    "ANSWER_BYTES",
    "ELEMENTS_PER_BLOB",
    "PAGE_DEPTH",
    "HostilePage",
    "capped_transport",
    "list_page",
    "refuse_hostile_page",
]

ANSWER_BYTES = 32 << 20
"""Most bytes of an answer the client reads whole: a page of 5,000 blobs whose names are
1,024 characters of 3-byte UTF-8, with their properties, is ~25 MB."""
PAGE_DEPTH = 8
"""Deepest nesting of a listing page's elements (``EnumerationResults`` > ``Blobs`` > ``Blob``
> ``Tags`` > ``TagSet`` > ``Tag`` > ``Key`` is 7)."""
ELEMENTS_PER_BLOB = 64
"""Most elements a page may hold per blob asked for (a ``Blob`` entry is ~35: its name and
~30 properties), and as many again for the page's own fields."""
METADATA_ELEMENTS_PER_BLOB = 256
"""More elements per blob where the listing asks for metadata (one per entry)."""
MOST_PER_PAGE = 5000
"""The most blobs a page holds (``maxresults``' most and its default)."""
_FEED_BYTES = 64 << 10  # a page is counted this much at a time
_QUOTE = '"'


async def list_page(
    container: Any,
    pattern: str,
    prefix: str,
    token: str | None,
    before: int,
    per_page: int,
    options: dict[str, Any],
    delimiter: str = "/",
) -> tuple[list[Listed], str | None]:
    """One page of the blobs of the SDK's ``container`` client under ``prefix`` (``delimiter``
    ``""``: at any depth below it), after ``before`` pages (``token``: the previous page's
    marker): its blobs in the order listed and the next page's marker (None: the last
    page). ``options``: keyword arguments of every request (the SDK's retries off). One
    attempt; errors translated, ``pattern`` named in them."""
    from azure.storage.blob import BlobProperties

    action = f"listing (page {before + 1})"
    try:
        asked = {"name_starts_with": prefix, "include": ["metadata"], **options}
        if delimiter:
            blobs = container.walk_blobs(delimiter=delimiter, results_per_page=per_page, **asked)
        else:
            blobs = container.list_blobs(results_per_page=per_page, **asked)
        pager = blobs.by_page(continuation_token=token)
        items = [item async for item in await anext(pager)]
        following = pager.continuation_token
    except StopAsyncIteration:  # (the SDK's pager ends only after a page)
        items, following = [], None
    except (HostilePage, AnswerTooLong) as exc:
        raise StorageError(f"{pattern}: listing page {before + 1} refused: {exc}") from None
    except Exception as exc:
        raise translate(exc, pattern, action) from exc
    listed: list[Listed] = []
    for item in items:
        if not isinstance(item, BlobProperties) or _directory(item.metadata):
            continue  # a prefix one level down, a directory's blob
        name, size = item.name, item.size
        if not isinstance(name, str) or not name.startswith(prefix):
            raise StorageError(
                f"{pattern}: listing page {before + 1} refused: a blob name outside the "
                f"prefix {prefix!r} asked for ({str(name)[:200]!r})"
            )
        if not isinstance(size, int) or size < 0:
            raise StorageError(
                f"{pattern}: listing page {before + 1} refused: blob {name!r} has no size"
            )
        # quoted, as an answer's ETag header is (what a range read compares it with)
        etag = f'"{str(item.etag).strip(_QUOTE)}"' if item.etag else None
        listed.append(Listed(name, size, etag))
    if following is not None and not isinstance(following, str):
        raise StorageError(f"{pattern}: listing page {before + 1} refused: a marker not a string")
    return listed, following or None


def _directory(metadata: Any) -> bool:
    """Whether a blob's metadata marks it a directory (as adlfs reads it)."""
    if not isinstance(metadata, dict):
        return False
    flag = metadata.get("is_directory")
    if flag in ("true", "false"):
        return bool(flag == "true")
    return "true" in (metadata.get("hdi_isfolder"), metadata.get("Hdi_isfolder"))


class HostilePage(ValueError):
    """A listing page past the bounds of any page of the blobs asked for (see the module
    docstring)."""


def refuse_hostile_page(pipeline_response: Any) -> None:
    """The client's ``raw_response_hook``: raises :class:`HostilePage` for a listing
    answer (``comp=list``) past the bounds of a page of the blobs it asked for, before the
    SDK parses it. Other answers, and a body that is not XML (left to the SDK), pass."""
    request, response = pipeline_response.http_request, pipeline_response.http_response
    if request.method != "GET" or not 200 <= response.status_code < 300:
        return
    query = parse_qs(urlsplit(request.url).query)
    if query.get("comp") != ["list"]:
        return
    asked = query.get("maxresults", [""])[0]
    blobs = min(int(asked), MOST_PER_PAGE) if asked.isdigit() else MOST_PER_PAGE
    per_blob = ELEMENTS_PER_BLOB
    if "metadata" in query.get("include", [""])[0].split(","):
        per_blob += METADATA_ELEMENTS_PER_BLOB
    refused = _count_bounded(response.body(), per_blob * (blobs + 1))
    if refused is not None:
        raise HostilePage(f"{request.method} {redact(request.url)}: a listing page of {refused}")


def _count_bounded(body: bytes, max_elements: int) -> str | None:
    """What puts ``body`` past a page's bounds (more than ``max_elements`` elements, nested
    deeper than :data:`PAGE_DEPTH`, a document type), counted a piece at a time without a
    tree; None within them (or not well-formed XML: left to the SDK's parser)."""
    counter = _Counter(max_elements)
    parser = ElementTree.XMLParser(target=counter)
    view = memoryview(body)
    try:
        for start in range(0, len(body), _FEED_BYTES):
            parser.feed(view[start : start + _FEED_BYTES])
        parser.close()
    except (ElementTree.ParseError, _Refused):
        pass  # (raised inside the parser: it may report another error than the refusal)
    return counter.refused


class _Refused(Exception):
    """Stops a parse at the first bound passed (what passed it: ``_Counter.refused``)."""


class _Counter:
    """A parser target that keeps nothing: counts elements and depth, and stops the parse
    past ``max_elements`` elements, :data:`PAGE_DEPTH` levels or at a document type."""

    def __init__(self, max_elements: int) -> None:
        self._left = max_elements
        self._depth = 0
        self.refused: str | None = None

    def start(self, tag: str, attrs: dict[str, str]) -> None:
        self._left -= 1
        self._depth += 1
        if self._left < 0:
            self._refuse("more elements than a page of the blobs asked for holds")
        if self._depth > PAGE_DEPTH:
            self._refuse(f"elements nested more than {PAGE_DEPTH} deep")

    def end(self, tag: str) -> None:
        self._depth -= 1

    def doctype(self, name: str, pubid: str, system: str) -> None:
        self._refuse(f"a document type ({name})")

    def close(self) -> None:
        return None

    def _refuse(self, why: str) -> None:
        self.refused = why
        raise _Refused(why)


def capped_transport() -> Any:
    """azure-core's aiohttp transport on a session whose answers read whole are read to at
    most :data:`ANSWER_BYTES` (:func:`~streamrec.storage.http.body.capped_answers`), made as
    the SDK makes its own (its timeouts and block size, proxies from the environment, no
    cookies, bodies as sent); the session is made when the transport first opens, inside the
    store's loop, and closed with the client (opening it again after that is azure-core's
    ``ValueError``, as for the SDK's own transport)."""
    import aiohttp
    from azure.core.pipeline.transport import AioHttpTransport

    class CappedTransport(AioHttpTransport):  # type: ignore[misc]
        session: aiohttp.ClientSession | None
        made_session = False

        async def open(self) -> None:
            # Once: after close() the SDK's own open() says the transport is closed (a
            # session made again here would be one nobody closes).
            if self.session is None and not self.made_session:
                self.made_session = True
                self.session = aiohttp.ClientSession(
                    trust_env=True,
                    cookie_jar=aiohttp.DummyCookieJar(),
                    auto_decompress=False,
                    response_class=capped_answers(ANSWER_BYTES),
                )
            await super().open()

    # (azure-storage-blob's own values for the transport it would make)
    return CappedTransport(
        connection_timeout=20, read_timeout=60, connection_data_block_size=256 << 10
    )
