"""What a paged listing must be to be trusted: each page's keys after the previous page's, and
each continuation token new.

A store lists a prefix a page at a time (S3's ``ListObjectsV2``: at most 1,000 keys, then a
``NextContinuationToken`` for the next page). Its pages come from storage, so they are checked
like any other untrusted input: a key that comes twice (within a page or on two pages) would
become two shards and its records would be read twice; a token that comes again would have
the listing follow the same pages until the time runs out; a page that says it is truncated
but names no next page would silently lose the rest. Keys come in UTF-8 binary order (S3's
listing order; Python's ``str`` order is code point order, the same), so each key must be
greater than the one before it; where a store lists unsorted (S3 Express directory buckets),
each key must be new. Any of these is a broken listing: a
:class:`~streamrec.errors.StorageError` naming the url, the page and what was wrong.

:func:`list_glob` is how every glob and directory is listed: page by page where the store
lists so (:meth:`~streamrec.storage.base.ObjectStore.glob_pages`), each page a request of its
own under the retry policy (timed alone, retried from its own continuation token, so that a
listing of many pages is not bounded by one attempt's time), else one retried
:meth:`~streamrec.storage.base.ObjectStore.expand`.

:func:`glob_prefix` is what a store lists for a glob a page at a time (the prefix up to its
first wildcard: one level below it for a wildcard in the last component only, every key
below it for ``**`` or a wildcard above the last level; fsspec's pattern on the names: what
fsspec's ``glob`` returns), and :func:`follow_pages` the loop of such a listing, for the
stores whose pages are :data:`ListPage` calls (GCS, Azure).
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from contextlib import aclosing
from typing import NamedTuple, NoReturn

from streamrec._portal import owned_generator
from streamrec.errors import ObjectNotFoundError, StorageError, TransientStorageError
from streamrec.storage import timing
from streamrec.storage.base import ObjectInfo, ObjectStore, has_glob
from streamrec.storage.retry import RetryPolicy

__all__ = [
    "GlobPrefix",
    "ListPage",
    "Listed",
    "PageTrail",
    "follow_pages",
    "glob_prefix",
    "list_glob",
]


async def list_glob(
    store: ObjectStore,
    pattern: str,
    retry: RetryPolicy,
    on_retry: Callable[[TransientStorageError], None] | None = None,
    on_page: Callable[[list[ObjectInfo]], None] | None = None,
    *,
    warm: bool = False,
) -> list[ObjectInfo]:
    """:meth:`~streamrec.storage.base.ObjectStore.expand` of the glob ``pattern``, sorted by
    url: through the store's pages where it lists so (each page a request of its own under
    ``retry``; ``on_page`` told each page's matches as it comes; ``warm``: they are read
    next), else one retried ``expand``. ObjectNotFoundError when nothing matched."""
    pages = store.glob_pages(pattern, retry, on_retry, warm=warm)
    if pages is None:
        return await retry.run(
            lambda: store.expand(pattern), describe=f"listing {pattern}", on_retry=on_retry
        )
    listed: list[ObjectInfo] = []
    async with aclosing(pages) as each:
        async for page in each:
            listed += page
            if on_page is not None:
                on_page(page)
    if not listed:
        raise ObjectNotFoundError(f"{pattern}: the glob matched no object")
    return sorted(listed, key=lambda obj: obj.url)


class PageTrail:
    """The checks of one paged listing of ``url``: :meth:`take` each page in order.
    ``ordered``: the store lists keys in order (else each key is only checked to be new).
    ``depth_first``: the keys may come depth first instead (a tree listed directory by
    directory, each directory's blobs followed by its own tree: ``a``, ``a/b``, ``a-c``, as
    an Azure hierarchical namespace lists every blob below a prefix), so each key must come
    after the one before in name order throughout, or throughout in depth-first order (by
    its ``/``-separated components): either way a key never comes twice."""

    def __init__(self, url: str, *, ordered: bool = True, depth_first: bool = False) -> None:
        self.url = url
        self.pages = 0
        self._tokens: set[bytes] = set()  # digests: a token's length is the server's choice
        self._last: str | None = None
        self._seen: set[str] | None = None if ordered else set()
        self._by_name = True  # every key so far after the one before in name order
        self._by_tree = depth_first  # ... in depth-first order

    def take(self, keys: Sequence[str], truncated: bool, token: str | None) -> str | None:
        """Check one page (its keys in the order listed, whether it says more follow, its
        next token) against the pages before it; return the token of the next page, None
        when the listing is complete. Raises :class:`~streamrec.errors.StorageError` for a
        broken listing."""
        self.pages += 1
        if self._seen is not None:
            for key in keys:
                if key in self._seen:
                    self._broken(f"a key listed twice ({key!r})")
                self._seen.add(key)
            keys = ()
        for key in keys:
            last = self._last
            if last is not None:
                self._by_name = self._by_name and key > last
                self._by_tree = self._by_tree and key.split("/") > last.split("/")
                if not (self._by_name or self._by_tree):
                    what = "a key listed twice" if key == last else "keys out of order"
                    self._broken(f"{what} ({key!r} after {last!r})")
            self._last = key
        if not truncated:
            return None
        if not token:
            self._broken("it says more keys follow but names no continuation token")
        digest = hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()
        if digest in self._tokens:
            self._broken(f"a continuation token that came before ({token[:64]!r})")
        self._tokens.add(digest)
        return token

    def _broken(self, what: str) -> NoReturn:
        raise StorageError(f"{self.url}: a broken listing: page {self.pages}: {what}")


class GlobPrefix(NamedTuple):
    """What a glob lists: the keys of ``bucket`` under ``prefix`` (``delimiter`` ``/``: one
    level down; ``""``: every key below it, at any depth), those ``bucket/key`` names that
    ``matches``."""

    bucket: str
    prefix: str
    matches: Callable[[str], bool]
    delimiter: str = "/"


def glob_prefix(path: str) -> GlobPrefix | None:
    """The listing of the glob ``path`` (``bucket/dir/shard-*``, as the filesystem names it):
    the keys under the prefix up to its first wildcard, and fsspec's pattern
    (``fsspec.utils.glob_translate``, what fsspec's ``glob`` matches) for the names; a name
    ending in ``/``, a directory placeholder, never matches.

    A glob whose wildcards are all in its last component and none is ``**`` lists one level
    below the prefix (``/`` the delimiter), as fsspec's ``glob`` does. Any other glob
    (``dir/*/shard-*``, ``**/part-*``, ``20*/x/*``) lists every key below the prefix, at
    any depth (no delimiter), and keeps the names the pattern matches: what fsspec's
    ``glob`` returns, its files. That flat listing is the one gcsfs and adlfs make for every
    such glob and s3fs for ``**``; for a wildcard above the last level without ``**``
    (``dir/*/shard-*``) s3fs lists directory by directory, down to the pattern's depth only.
    The flat listing lists every key below the prefix, also those deeper than the pattern
    reaches or beside what it names: where the prefix holds large trees the pattern cannot
    match (``dir/*/shard-*`` over directories with deep trees of their own), that is many
    more keys and pages than s3fs's walk, a cost accepted for each page being a request of
    its own (elsewhere it is as many requests or fewer: a page holds many directories').

    None (the store lists it through its filesystem) for a glob with a wildcard in its
    bucket, a pattern fsspec refuses (``**`` not a whole component), or one ending in ``/``
    (it matches directories only, no object)."""
    from fsspec.utils import glob_translate

    bucket, slash, key = path.partition("/")
    if not slash or has_glob(bucket) or not has_glob(key) or key.endswith("/"):
        return None
    try:
        pattern = re.compile(glob_translate(path)).match
    except ValueError:
        return None  # (fsspec's glob raises it: left to the filesystem, as before)
    first = min(i for i in (key.find(c) for c in "*?[") if i >= 0)
    prefix, rest = key[:first], key[first:]
    deep = "/" in rest or "**" in rest

    def matches(name: str) -> bool:
        return not name.endswith("/") and pattern(name) is not None

    return GlobPrefix(bucket, prefix, matches, "" if deep else "/")


class Listed(NamedTuple):
    """One object of a listing page: its key, size and version."""

    key: str
    size: int
    version: str | None


ListPage = Callable[[str | None, int], Awaitable[tuple[list[Listed], str | None]]]
"""One attempt at one page: ``(token, pages before)`` -> its objects in the order listed and
the next page's token (None: the last page); errors translated."""


@owned_generator
async def follow_pages(
    pattern: str,
    glob: GlobPrefix,
    list_page: ListPage,
    url_of: Callable[[str], str],
    retry: RetryPolicy | None,
    on_retry: Callable[[TransientStorageError], None] | None,
    *,
    depth_first: bool = False,
) -> AsyncGenerator[list[ObjectInfo], None]:
    """The matches of the glob ``pattern`` a page at a time (see
    :meth:`~streamrec.storage.base.ObjectStore.glob_pages`): each page one ``list_page``
    call (with ``retry``, under that policy: timed and retried alone, from its own token),
    checked against the pages before it (:class:`PageTrail`; ``depth_first``: its keys may
    come depth first); ``url_of(bucket/key)``: the url of a match."""
    trail = PageTrail(pattern, depth_first=depth_first)
    token: str | None = None
    while True:
        attempt = functools.partial(list_page, token, trail.pages)
        if retry is None:
            listed, following = await attempt()
        else:
            listed, following = await retry.run(
                attempt, describe=f"listing {pattern} (page {trail.pages + 1})", on_retry=on_retry
            )
        timing.listed_page()
        keys = [item.key for item in listed]
        token = trail.take(keys, following is not None, following)
        names = (f"{glob.bucket}/{item.key}" for item in listed)
        yield [
            ObjectInfo(url_of(name), item.size, item.version)
            for name, item in zip(names, listed, strict=True)
            if glob.matches(name)
        ]
        if token is None:
            return
