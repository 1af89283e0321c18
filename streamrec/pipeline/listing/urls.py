"""What the urls a user gives stand for: the one listing rule of ``open_dataset`` and every CLI
command.

Each url is, in this order of checks:

* a **manifest** (a url ending in ``.json``): the shards it lists, in index order, with the
  sizes it records;
* a **glob** (``*``, ``?``, ``[``; ``**`` matches any depth): the matching objects sorted by
  name, except names starting with ``_`` or ``.`` in the part the glob matched (the
  Hadoop/Spark convention: a writer's ``_manifest.json``, ``_reshard/`` scratch, dot files)
  and record index sidecars (names ending in ``.idx``, :mod:`streamrec.format.index.core`) where
  the glob matched the name; such a name can still be read by naming it explicitly, or by a
  glob whose literal part names it;
* an **object**: itself;
* a **directory or prefix** (a local directory, an S3/GCS prefix): its ``_manifest.json`` when
  it has one, else the visible objects directly in it (no ``_``/``.`` names, no ``.idx``
  sidecars, no directory markers ending in ``/``), sorted by name. The manifest is read
  first (one GET where it is small, nothing listed); the directory is listed, page by page,
  only when there is none (not found, or not readable: then the listing decides). A url
  ending in ``/`` is always one, whatever a lookup of its name would answer (some stores
  answer a HEAD of ``prefix/`` with an empty object); a directory in which no shard is found
  is an error, never an empty dataset.

Index sidecars a listing returns anyway are not thrown away: each shard's
:class:`~streamrec.storage.base.ObjectInfo` carries its sidecar (``index``, url and size) and
whether the listing would have seen one (``index_known``), so a reader learns which shards have
an index without a lookup per shard. A directory listing sees every sidecar beside its shards;
a glob sees them when it also matches ``<name>.idx`` (``data/*`` does, ``data/*.tfrecord``
does not). A manifest (a directory's or one named by its url) gives the sidecars it names
(``record_index``: known, no lookup) and leaves the others unknown (found by
:func:`~streamrec.pipeline.listing.sidecars.find_indexes`: one listing of the directory's
sidecars); an object named explicitly leaves ``index_known`` False. A manifest also states
every shard's codec (``ObjectInfo.compression``), so ``.tfrecord`` shards need no read of
their first bytes to learn it.
"""

from __future__ import annotations

import fnmatch
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from streamrec.errors import (
    ObjectNotFoundError,
    PermissionDeniedError,
    StorageError,
    TransientStorageError,
)
from streamrec.format.index.core import INDEX_SUFFIX, index_url
from streamrec.manifest.check import checked_shards, manifest_shards
from streamrec.manifest.core import MANIFEST_NAME, is_manifest_url, load_manifest
from streamrec.pipeline.listing.dataset_index import host_cache
from streamrec.storage.base import GLOB_CHARS, ObjectInfo, ObjectStore, has_glob
from streamrec.storage.cache.store import ShardCache
from streamrec.storage.pages import list_glob
from streamrec.storage.retry import RetryPolicy

if TYPE_CHECKING:
    from streamrec.pipeline.options import ReadOptions
    from streamrec.pipeline.stats import Stats

__all__ = [
    "HIDDEN_PREFIXES",
    "HIDDEN_SUFFIXES",
    "MetadataCache",
    "is_hidden",
    "list_shards",
    "list_sources",
]

HIDDEN_PREFIXES = ("_", ".")
"""Names starting with these are skipped by globs and directory listings."""
HIDDEN_SUFFIXES = (INDEX_SUFFIX,)
"""Object names ending with these (record index sidecars) are skipped by globs that match the
name and by directory listings."""

OnRetry = Callable[[TransientStorageError], None]
OnFirst = Callable[[ObjectInfo], None]
"""Told the first shard of a listing as soon as it is certain (see :func:`list_sources`)."""


@dataclass(frozen=True)
class MetadataCache:
    """The host's cache of the dataset's metadata, and the options naming its endpoints."""

    cache: ShardCache
    storage_options: dict[str, Any] | None


def is_hidden(url: str, pattern: str) -> bool:
    """True when a part of ``url`` that a glob component of ``pattern`` matched is hidden: a
    name starting with ``_`` or ``.``, or an object name ending in ``.idx`` that the glob's
    last component matched; and a name ending in ``/``, a directory marker (an empty object
    some stores list, and answer for, as ``prefix/``), never a shard."""
    if url.endswith("/"):
        return True
    parts = pattern.split("/")
    first = next((i for i, part in enumerate(parts) if not GLOB_CHARS.isdisjoint(part)), None)
    if first is None:
        return False
    names = url.split("/")
    if any(name.startswith(HIDDEN_PREFIXES) for name in _globbed(parts, names, first)):
        return True
    return names[-1].endswith(HIDDEN_SUFFIXES) and not GLOB_CHARS.isdisjoint(parts[-1])


def _globbed(parts: list[str], names: list[str], first: int) -> list[str]:
    """The names of ``names`` (a match's components) that a glob component of ``parts`` (the
    pattern's) matched, a literal one (``_meta`` in ``*/_meta/*``: named, so not hidden)
    left out; everything from the ``first`` glob component on where they cannot be paired
    (more than one ``**``, or a match of another depth)."""
    if parts.count("**") == 1:
        at = parts.index("**")
        after = len(parts) - at - 1
        if len(names) < len(parts) - 1:
            return names[first:]
        head = zip(parts[:at], names[:at], strict=True)
        tail = zip(parts[at + 1 :], names[len(names) - after :], strict=True)
        pairs = [*head, *tail]
        middle = names[at : len(names) - after]  # what ** matched: any depth
        return middle + [name for part, name in pairs if not GLOB_CHARS.isdisjoint(part)]
    if "**" in parts or len(parts) != len(names):
        return names[first:]
    aligned = zip(parts, names, strict=True)
    return [name for part, name in aligned if not GLOB_CHARS.isdisjoint(part)]


def _with_sidecars(
    shards: list[ObjectInfo], listed: list[ObjectInfo], sees: Callable[[str], bool]
) -> list[ObjectInfo]:
    """``shards`` with the index sidecars among ``listed`` (what one listing returned);
    ``sees(url)``: that listing would have returned ``url``'s sidecar had there been one.
    Shards the listing did not return themselves are left as they are."""
    by_url = {obj.url: obj for obj in listed}
    found: list[ObjectInfo] = []
    for shard in shards:
        if shard.url in by_url:
            sidecar = by_url.get(index_url(shard.url))
            if sidecar is not None or sees(shard.url):
                shard = replace(shard, index=sidecar, index_known=True)
        found.append(shard)
    return found


async def _list_glob(
    store: ObjectStore,
    pattern: str,
    retry: RetryPolicy,
    on_retry: OnRetry | None,
    on_first: OnFirst | None = None,
) -> list[ObjectInfo]:
    """The objects the glob ``pattern`` matches (:func:`~streamrec.storage.pages.list_glob`:
    a page at a time where the store lists so), telling ``on_first`` the first shard (a
    visible match) as soon as a page holds one."""
    told = on_first is None

    def on_page(page: list[ObjectInfo]) -> None:
        nonlocal told
        visible = [obj for obj in page if not is_hidden(obj.url, pattern)]
        if visible and not told:
            told = True
            assert on_first is not None
            on_first(min(visible, key=lambda obj: obj.url))

    return await list_glob(store, pattern, retry, on_retry, on_page, warm=not told)


def _glob_sees(pattern: str) -> Callable[[str], bool]:
    """Whether the glob ``pattern`` also matches a match's sidecar: a sidecar lives beside its
    shard, so it does when the last component matches the name with ``.idx`` appended."""
    last = pattern.rsplit("/", 1)[-1]
    return lambda url: fnmatch.fnmatchcase(index_url(url.rsplit("/", 1)[-1]), last)


async def list_shards(
    urls: Sequence[str],
    options: ReadOptions,
    store_of: Callable[[str], ObjectStore],
    stats: Stats,
    on_first: OnFirst | None = None,
) -> list[ObjectInfo]:
    """Every shard a dataset of ``urls`` read with ``options`` reads, in reading order, with
    its size and version: :func:`list_sources` with the options' retry policy and
    ``allow_absolute_urls``, retries counted in ``stats`` (``on_first``: see there). The one
    listing of the streaming and the indexed engine, ``len()`` and ``get()``."""

    def count_retry(_: Exception) -> None:
        stats.retries += 1

    started = time.perf_counter()
    try:
        return await list_sources(
            urls,
            store_of,
            options.retry,
            allow_absolute_urls=options.allow_absolute_urls,
            on_retry=count_retry,
            on_first=on_first,
            cache=MetadataCache(host_cache(options), options.storage_options),
        )
    finally:
        stats.listing_s += time.perf_counter() - started


async def list_sources(
    urls: Sequence[str],
    store_of: Callable[[str], ObjectStore],
    retry: RetryPolicy,
    *,
    allow_absolute_urls: bool = False,
    on_retry: OnRetry | None = None,
    on_first: OnFirst | None = None,
    cache: MetadataCache | None = None,
) -> list[ObjectInfo]:
    """Every shard the urls stand for (see the module docstring), in the order given.
    ``cache``: where a large remote manifest is kept for the host's other consumers
    (:func:`~streamrec.manifest.core.load_manifest`; :func:`list_shards` gives the dataset's).

    Shards of a manifest are checked against it (see
    :func:`~streamrec.manifest.check.manifest_shards`); ``allow_absolute_urls`` trusts its
    names beyond its own directory.

    Globs and directories a store lists page by page
    (:meth:`~streamrec.storage.base.ObjectStore.glob_pages`) are listed so, each page timed
    and retried alone. ``on_first(shard)``: when the first url is such a glob, called with
    the first shard as soon as a page shows it, while the rest is listed (at most once).
    The result is the same either way."""
    found: list[ObjectInfo] = []
    for i, url in enumerate(urls):
        first = on_first if i == 0 else None
        found += await _one(url, store_of, retry, allow_absolute_urls, on_retry, first, cache)
    return found


async def _directory_manifest(
    url: str,
    store_of: Callable[[str], ObjectStore],
    retry: RetryPolicy,
    on_retry: OnRetry | None,
    allow_absolute_urls: bool = False,
    cache: MetadataCache | None = None,
) -> list[ObjectInfo] | None:
    """The shards of a directory's manifest at ``url``, read before anything is listed (one
    GET where it is small); None when there is none (or it may not be read: the listing then
    decides, as it did before). Errors of the manifest's contents and of its shards raise."""
    try:
        loaded = await load_manifest(
            url,
            None if cache is None else cache.storage_options,
            retry=retry,
            store=store_of(url),
            allow_absolute_urls=allow_absolute_urls,
            cache=None if cache is None else cache.cache,
        )
    except (ObjectNotFoundError, PermissionDeniedError):
        return None
    return await checked_shards(loaded, url, store_of, retry, on_retry=on_retry)


async def _one(
    url: str,
    store_of: Callable[[str], ObjectStore],
    retry: RetryPolicy,
    allow_absolute_urls: bool,
    on_retry: OnRetry | None,
    on_first: OnFirst | None = None,
    cache: MetadataCache | None = None,
) -> list[ObjectInfo]:
    store = store_of(url)

    async def expand(pattern: str) -> list[ObjectInfo]:
        return await retry.run(
            lambda: store.expand(pattern), describe=f"listing {pattern}", on_retry=on_retry
        )

    async def manifest(at: str) -> list[ObjectInfo]:
        return await manifest_shards(
            at,
            store_of,
            retry,
            allow_absolute_urls=allow_absolute_urls,
            on_retry=on_retry,
            cache=None if cache is None else cache.cache,
            storage_options=None if cache is None else cache.storage_options,
        )

    if is_manifest_url(url):
        return await manifest(url)
    if has_glob(url):
        matches = await _list_glob(store, url, retry, on_retry, on_first)
        shards = [obj for obj in matches if not is_hidden(obj.url, url)]
        if not shards:
            raise ObjectNotFoundError(
                f"{url}: the glob matched only names starting with '_' or '.' or ending in "
                "'.idx' (skipped: name such a file explicitly to read it)"
            )
        return _with_sidecars(shards, matches, _glob_sees(url))
    not_object: StorageError | None = None
    if not url.endswith("/"):  # (a url ending in / names a directory: no object lookup)
        try:
            return await expand(url)
        except ObjectNotFoundError as missing:
            not_object = missing
        except StorageError as exc:  # a local directory ("not a regular file")
            if type(exc) is not StorageError:
                raise
            not_object = exc
    directory = url.rstrip("/")
    listed = await _directory_manifest(
        f"{directory}/{MANIFEST_NAME}", store_of, retry, on_retry, allow_absolute_urls, cache
    )
    if listed is not None:
        return listed
    try:
        children = await _list_glob(store, directory + "/*", retry, on_retry)
    except ObjectNotFoundError:
        children = []
    if any(obj.url.rsplit("/", 1)[-1] == MANIFEST_NAME for obj in children):
        # there after all (written between the lookup and the listing, or unreadable then):
        # read as any manifest, its errors raised
        listed = await manifest(f"{directory}/{MANIFEST_NAME}")
        return _with_sidecars(listed, children, lambda _: True)
    shards = [obj for obj in children if not is_hidden(obj.url, directory + "/*")]
    if shards:
        return _with_sidecars(shards, children, lambda _: True)
    if children or (not_object is not None and type(not_object) is StorageError):
        raise ObjectNotFoundError(f"{url}: the directory holds no shard files") from not_object
    if not_object is None:
        raise ObjectNotFoundError(
            f"{url}: no shard found: no object directly under this directory or prefix"
        )
    raise not_object
