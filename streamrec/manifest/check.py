"""A manifest against the objects actually there: checked when read, removed when replaced.

Reading (:func:`manifest_shards`): the shards of a manifest, each checked against the object
that is there now; each :class:`~streamrec.storage.base.ObjectInfo` carries what the manifest
knows beyond size and version (the record count, the record index sidecar's url and size).

A manifest states every shard's size and, where the store versions objects, the version it was
committed as (S3 ETag, GCS generation). A shard rewritten since (a later writer to the same
names, killed before its own manifest) must not be read through the old manifest: its sizes
would cut the new object short without a word. So:

* a shard with a recorded version is read pinned to it (every range read carries
  ``If-Match`` / ``ifGenerationMatch``): a replaced object is an
  :class:`~streamrec.errors.ObjectChangedError` on its first read, at no extra request;
* a shard without one (local files, ``memory://``, manifests of older writers, sets moved
  since they were written) is looked up before anything is read, and a size that differs from
  the manifest's is an :class:`~streamrec.errors.ObjectChangedError` naming both.

Writing (:func:`invalidate_manifest`): a writer about to write shards beside an existing
manifest removes it first (and says so in the log), so that no reader follows it to the new
objects; the writer's own manifest appears when its last shard is committed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from streamrec._portal import run_all
from streamrec.errors import (
    FormatError,
    ObjectChangedError,
    ObjectNotFoundError,
    TransientStorageError,
)
from streamrec.format.codecs import Compression, normalize_compression
from streamrec.manifest.core import Manifest, ManifestEntry, load_manifest
from streamrec.redact import redact
from streamrec.storage.base import ObjectInfo, ObjectStore
from streamrec.storage.cache.store import ShardCache
from streamrec.storage.local.store import LocalStore
from streamrec.storage.retry import RetryPolicy

__all__ = ["checked_shards", "invalidate_manifest", "manifest_shards", "stated_compression"]

logger = logging.getLogger("streamrec")

_LOOKUPS_AT_ONCE = 16


async def manifest_shards(
    url: str,
    get_store: Callable[[str], ObjectStore],
    retry: RetryPolicy,
    *,
    allow_absolute_urls: bool = False,
    on_retry: Callable[[TransientStorageError], None] | None = None,
    cache: ShardCache | None = None,
    storage_options: dict[str, Any] | None = None,
) -> list[ObjectInfo]:
    """The shards of the manifest at ``url``, by index, as objects to read (size and version
    from the manifest); ``get_store(url)`` gives the open store of a url's scheme; ``cache``
    (with the ``storage_options`` that name its endpoint): the host's copy of a large
    manifest (:func:`~streamrec.manifest.core.load_manifest`).

    Raises ObjectChangedError when a shard is not the object the manifest describes.
    """
    manifest = await load_manifest(
        url,
        storage_options,
        retry=retry,
        store=get_store(url),
        allow_absolute_urls=allow_absolute_urls,
        cache=cache,
    )
    return await checked_shards(manifest, url, get_store, retry, on_retry=on_retry)


async def checked_shards(
    manifest: Manifest,
    url: str,
    get_store: Callable[[str], ObjectStore],
    retry: RetryPolicy,
    *,
    on_retry: Callable[[TransientStorageError], None] | None = None,
) -> list[ObjectInfo]:
    """The shards of ``manifest`` (loaded from ``url``) as :func:`manifest_shards` gives
    them: each checked against the object there, carrying what the manifest states of it."""
    compression = stated_compression(manifest, url)
    lookups = asyncio.Semaphore(_LOOKUPS_AT_ONCE)
    local = [e.url for e in manifest.shards if e.version is None]
    seen: dict[str, ObjectInfo] = {}
    if local and all(isinstance(get_store(u), LocalStore) for u in local):
        store = get_store(local[0])
        assert isinstance(store, LocalStore)
        seen = {obj.url: obj for obj in await store.look_up_all(local)}  # one thread, not N

    async def checked(entry: ManifestEntry) -> ObjectInfo:
        store = get_store(entry.url)
        async with lookups:
            found = await retry.run(
                lambda: store.expand(entry.url),
                describe=f"looking up {entry.url}",
                on_retry=on_retry,
            )
        return described(entry, found)

    def described(entry: ManifestEntry, found: list[ObjectInfo] | None) -> ObjectInfo:
        if found is not None:
            sizes = [obj.size for obj in found]
            if sizes != [entry.bytes]:
                raise ObjectChangedError(
                    f"{entry.url}: the manifest {url} lists it with {entry.bytes} bytes, the "
                    f"object there has {' + '.join(map(str, sizes))}: it was replaced after "
                    "the manifest was written (a later write to the same names?)"
                )
        return ObjectInfo(
            entry.url,
            entry.bytes,
            entry.version,
            entry.records,
            crc32c=entry.crc32c,
            compression=compression,
            # a sidecar the manifest lists is known; one added later (`streamrec index`) is
            # looked up (and checked against the shard before it is used)
            index=(
                None
                if entry.index_url is None or entry.index_bytes is None
                else ObjectInfo(entry.index_url, entry.index_bytes)
            ),
            index_known=entry.index_url is not None,
        )

    known = {
        e.url: [seen[e.url]] if e.url in seen else None
        for e in manifest.shards
        if e.version is not None or e.url in seen
    }
    if len(known) == len(manifest.shards):  # nothing to look up: no task per shard
        return [described(e, known[e.url]) for e in manifest.shards]
    return await run_all(
        checked(e) if e.url not in known else _ready(described(e, known[e.url]))
        for e in manifest.shards
    )


async def _ready(found: ObjectInfo) -> ObjectInfo:
    return found


def stated_compression(manifest: Manifest, url: str) -> Compression:
    """The codec ``manifest`` (read from ``url``) says every shard is stored with; a value
    this version does not know is a FormatError (the shards could not be read with it)."""
    stated = manifest.compression
    try:
        codec = normalize_compression(stated)
    except ValueError:
        codec = "auto"
    if codec == "auto":
        raise FormatError(
            f'not a valid streamrec manifest: "compression" is {stated!r}, not null, "gzip" '
            'or "zlib"',
            url=url,
        )
    return codec


async def invalidate_manifest(store: ObjectStore, url: str, retry: RetryPolicy) -> bool:
    """Remove the manifest at ``url`` if there is one, with a warning; True when it was."""
    try:
        await retry.run(lambda: store.expand(url), describe=f"{url}: looking it up")
    except ObjectNotFoundError:
        return False
    await retry.run(lambda: store.delete(url), describe=f"{url}: removing it")
    logger.warning(
        "%s: removed the manifest of an earlier write before writing new shards beside it "
        "(the directory has no manifest until this writer closes)",
        redact(url),
    )
    return True
