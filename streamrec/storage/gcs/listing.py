"""A listing page of GCS, asked for and parsed by streamrec: one JSON API ``objects.list``
request on the store's own session, its answer read and parsed within bounds.

gcsfs lists a prefix by following ``nextPageToken`` itself, every page inside one call: a
token that comes again is followed until the attempt's time runs out, and a listing of many
pages must fit in one attempt. A glob's listing (:func:`~streamrec.storage.pages.glob_prefix`)
is therefore asked for here a page at a time (:func:`list_page`), each page one attempt that
:func:`~streamrec.storage.pages.follow_pages` times, retries from its own token and checks
against the pages before it.

A glob with ``**`` or a wildcard above the last level lists every object below its prefix (no
delimiter), as gcsfs's glob does.

A page is used only when it is a well-formed page of the prefix asked for: a JSON object of at
most :data:`PAGE_BYTES` bytes whose ``items`` (at most the ``maxResults`` asked for) each have
a name under the prefix (one level down, with a delimiter), a decimal ``size`` and a
``generation``, and whose ``nextPageToken``, if any, is a string. Anything else is a
:class:`~streamrec.errors.StorageError` naming the url and the page.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

from streamrec.errors import StorageError
from streamrec.storage.http.body import error_detail, read_pieces_within
from streamrec.storage.pages import Listed
from streamrec.storage.translate import from_status, translate

if TYPE_CHECKING:
    from streamrec.storage.gcs.store import GCSStore

__all__ = ["PAGE_BYTES", "list_page"]

PAGE_BYTES = 16 << 20
"""Most bytes of a page's body (1,000 objects of a 1,024-byte name and every metadata field
(where the server ignores ``fields``), custom metadata of up to 8 KiB each: ~10 MB)."""
_FIELDS = "items(name,size,generation),prefixes,nextPageToken"
"""The fields asked for (a partial response: a page of 1,000 names is ~100 KB, not ~2 MB)."""


async def list_page(
    store: GCSStore,
    pattern: str,
    bucket: str,
    prefix: str,
    token: str | None,
    before: int,
    max_results: int,
    delimiter: str = "/",
) -> tuple[list[Listed], str | None]:
    """One page of the objects of ``bucket`` under ``prefix`` (``delimiter`` ``""``: at any
    depth below it), after ``before`` pages (``token``: the previous page's
    ``nextPageToken``): its objects in the order listed and the next page's token (None: the
    last page). One attempt; errors translated, ``pattern`` named in them."""
    action = f"listing (page {before + 1})"
    query = {"prefix": prefix, "maxResults": str(max_results), "fields": _FIELDS}
    if delimiter:
        query["delimiter"] = delimiter
    if token is not None:
        query["pageToken"] = token
    try:
        session = await store.session(pattern)
        location = await store.location(pattern)
        url = f"{location}/storage/v1/b/{quote(bucket, safe='')}/o?{urlencode(query)}"
        headers = store.headers({"Accept": "application/json"})
        async with session.get(store.billed(url), headers=headers) as response:
            if response.status != 200:
                detail = await error_detail(response.content)
                raise from_status(response.status, pattern, action, detail)
            pieces = await read_pieces_within(response.content, PAGE_BYTES)
    except StorageError:
        raise
    except Exception as exc:
        raise translate(exc, pattern, action) from exc
    if pieces is None:
        raise StorageError(
            f"{pattern}: listing page {before + 1} refused: longer than {PAGE_BYTES:,} bytes"
        )
    page = _parse(b"".join(pieces), prefix, max_results, bool(delimiter))
    if isinstance(page, str):
        raise StorageError(f"{pattern}: listing page {before + 1} refused: {page}")
    return page


def _parse(
    body: bytes, prefix: str, max_results: int, one_level: bool
) -> tuple[list[Listed], str | None] | str:
    """The objects and next token of a page's ``body`` (``one_level``: a listing with a
    delimiter, its names one level below ``prefix``), or what is wrong with it."""
    try:
        page: Any = json.loads(body)
    except (ValueError, RecursionError):
        return "not a JSON document"
    if not isinstance(page, dict):
        return "not a JSON object"
    items, token = page.get("items", []), page.get("nextPageToken")
    if not isinstance(items, list) or len(items) > max_results:
        return f"its items are not a list of at most {max_results} objects"
    if token is not None and not isinstance(token, str):
        return "its nextPageToken is not a string"
    listed: list[Listed] = []
    for item in items:
        found = _object(item, prefix, one_level)
        if isinstance(found, str):
            return found
        listed.append(found)
    return listed, token or None


def _object(item: Any, prefix: str, one_level: bool) -> Listed | str:
    """The object an item of a page describes, or what is wrong with it."""
    if not isinstance(item, dict):
        return "an item that is not a JSON object"
    name, size, generation = item.get("name"), item.get("size"), item.get("generation")
    if (
        not isinstance(name, str)
        or not name.startswith(prefix)
        or (one_level and "/" in name[len(prefix) : -1])
    ):
        return f"an object name outside the prefix {prefix!r} asked for ({str(name)[:200]!r})"
    if not isinstance(size, str) or not (size.isascii() and size.isdigit()) or len(size) > 19:
        return f"object {name!r}: a size that is not a decimal number ({str(size)[:40]!r})"
    if generation is not None and not isinstance(generation, (str, int)):
        return f"object {name!r}: a generation that is not a number"
    return Listed(name, int(size), str(generation) if generation else None)
