"""What the urls a user gives stand for: the one listing rule of ``open_dataset`` and every CLI
command.

Each url is, in this order of checks:

* a **manifest** (a url ending in ``.json``): the shards it lists, in index order, with the
  sizes it records;
* a **glob** (``*``, ``?``, ``[``; ``**`` matches any depth): the matching objects sorted by
  name, except names starting with ``_`` or ``.`` in the part the glob matched (the
  Hadoop/Spark convention: a writer's ``_manifest.json``, ``_reshard/`` scratch, dot files);
  such a name can still be read by naming it explicitly, or by a glob whose literal part
  names it;
* an **object**: itself;
* a **directory or prefix** (a local directory, an S3/GCS prefix): its ``_manifest.json`` when
  it has one, else the visible objects directly in it, sorted by name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from streamrec.errors import ObjectNotFoundError, StorageError, TransientStorageError
from streamrec.manifest.check import manifest_shards
from streamrec.manifest.core import MANIFEST_NAME, is_manifest_url
from streamrec.storage.base import GLOB_CHARS, ObjectInfo, ObjectStore, has_glob
from streamrec.storage.retry import RetryPolicy

__all__ = ["HIDDEN_PREFIXES", "is_hidden", "list_sources"]

HIDDEN_PREFIXES = ("_", ".")
"""Names starting with these are skipped by globs and directory listings."""

OnRetry = Callable[[TransientStorageError], None]


def is_hidden(url: str, pattern: str) -> bool:
    """True when a part of ``url`` that a glob component of ``pattern`` matched is hidden."""
    parts = pattern.split("/")
    first = next((i for i, part in enumerate(parts) if not GLOB_CHARS.isdisjoint(part)), None)
    if first is None:
        return False
    return any(name.startswith(HIDDEN_PREFIXES) for name in url.split("/")[first:])


async def list_sources(
    urls: Sequence[str],
    store_of: Callable[[str], ObjectStore],
    retry: RetryPolicy,
    *,
    allow_absolute_urls: bool = False,
    on_retry: OnRetry | None = None,
) -> list[ObjectInfo]:
    """Every shard the urls stand for (see the module docstring), in the order given.

    Shards of a manifest are checked against it (see
    :func:`~streamrec.manifest.check.manifest_shards`); ``allow_absolute_urls`` trusts its
    names beyond its own directory."""
    found: list[ObjectInfo] = []
    for url in urls:
        found += await _one(url, store_of, retry, allow_absolute_urls, on_retry)
    return found


async def _one(
    url: str,
    store_of: Callable[[str], ObjectStore],
    retry: RetryPolicy,
    allow_absolute_urls: bool,
    on_retry: OnRetry | None,
) -> list[ObjectInfo]:
    store = store_of(url)

    async def expand(pattern: str) -> list[ObjectInfo]:
        return await retry.run(
            lambda: store.expand(pattern), describe=f"listing {pattern}", on_retry=on_retry
        )

    async def manifest(at: str) -> list[ObjectInfo]:
        return await manifest_shards(
            at, store_of, retry, allow_absolute_urls=allow_absolute_urls, on_retry=on_retry
        )

    if is_manifest_url(url):
        return await manifest(url)
    if has_glob(url):
        shards = [obj for obj in await expand(url) if not is_hidden(obj.url, url)]
        if not shards:
            raise ObjectNotFoundError(
                f"{url}: the glob matched only names starting with '_' or '.' (skipped: name "
                "such a file explicitly to read it)"
            )
        return shards
    try:
        return await expand(url)
    except ObjectNotFoundError as missing:
        not_object: StorageError = missing
    except StorageError as exc:  # a local directory ("not a regular file")
        if type(exc) is not StorageError:
            raise
        not_object = exc
    directory = url.rstrip("/")
    try:
        children = await expand(directory + "/*")
    except ObjectNotFoundError:
        children = []
    if any(obj.url.rsplit("/", 1)[-1] == MANIFEST_NAME for obj in children):
        return await manifest(f"{directory}/{MANIFEST_NAME}")
    shards = [obj for obj in children if not is_hidden(obj.url, directory + "/*")]
    if shards:
        return shards
    if children or not isinstance(not_object, ObjectNotFoundError):
        raise ObjectNotFoundError(f"{url}: the directory holds no shard files") from not_object
    raise not_object
