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
"""

from __future__ import annotations

from typing import Any

from streamrec.errors import StorageError
from streamrec.storage.pages import Listed
from streamrec.storage.translate import translate

__all__ = ["list_page"]

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
