"""URL -> store. Each store is created inside the event loop that uses it and closed with it.

``storage_options`` are either one flat mapping, given to the filesystem of every scheme (fine
when all urls share a scheme), or a mapping per scheme, ``{"s3": {...}, "gs": {...},
"az": {...}, "https": {...}}``, of which each store gets only its own (:func:`options_for`): a
list that mixes ``s3://`` and ``https://`` urls then gives S3's credentials to S3 alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from streamrec.errors import StorageError
from streamrec.storage.base import ObjectInfo, ObjectStore, split_scheme
from streamrec.storage.local.store import LocalStore

__all__ = [
    "ObjectInfo",
    "ObjectStore",
    "StoreSet",
    "is_per_scheme",
    "open_store",
    "options_for",
    "prewarm",
    "split_scheme",
    "store_key",
]

_SCHEMES = {
    "file": "local",
    "s3": "s3",
    "s3a": "s3",
    "gs": "gcs",
    "gcs": "gcs",
    "az": "azure",
    "abfs": "azure",
    "abfss": "azure",
    "http": "http",
    "https": "http",
    "memory": "memory",
}


def store_key(url: str) -> str:
    """Which store serves ``url`` (urls with one key can share one store)."""
    scheme, _ = split_scheme(url)
    try:
        return _SCHEMES[scheme]
    except KeyError:
        known = ", ".join(sorted(f"{s}://" for s in _SCHEMES if s != "file"))
        raise StorageError(
            f"{url}: unsupported scheme {scheme}:// (use a local path, file://, {known})"
        ) from None


def is_per_scheme(storage_options: Mapping[str, Any] | None) -> bool:
    """True when ``storage_options`` map url schemes (``"s3"``, ``"gs"``, ...) to options.

    Raises ValueError for a mapping that mixes scheme keys with option keys.
    """
    if not storage_options:
        return False
    schemes = [key for key in storage_options if key in _SCHEMES]
    if not schemes:
        return False
    others = sorted(set(storage_options) - set(schemes))
    if others or not all(isinstance(v, Mapping) or v is None for v in storage_options.values()):
        raise ValueError(
            f"storage_options mix scheme keys ({', '.join(sorted(schemes))}) with other keys "
            f"({', '.join(others) or 'values that are not mappings'}): pass either one mapping "
            'of options for every scheme or one per scheme, e.g. {"s3": {...}, "gs": {...}}'
        )
    return True


def options_for(url: str, storage_options: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The options of ``url``'s store: its scheme's entry of a per-scheme mapping (an alias of
    the same store, ``https`` for ``http`` or ``gcs`` for ``gs``, when the scheme has none),
    or the flat mapping itself."""
    if not is_per_scheme(storage_options):
        return dict(storage_options) if storage_options else None
    assert storage_options is not None
    scheme, _ = split_scheme(url)
    kind = store_key(url)
    keys = [scheme, *sorted(k for k, v in _SCHEMES.items() if v == kind and k != scheme)]
    for key in keys:
        if key in storage_options:
            chosen = storage_options[key]
            return dict(chosen) if chosen else None
    return None


def open_store(
    url: str, storage_options: dict[str, Any] | None = None, *, max_connections: int | None = None
) -> ObjectStore:
    """A new store for ``url``'s scheme; ``storage_options`` (flat, or per scheme: see
    :func:`options_for`) go to the fsspec filesystem.

    ``max_connections``: the most requests the caller may have in flight at once; stores whose
    client caps its connection pool below that (botocore: 10) are sized to it. Default: a pool
    large enough for any dataset with default settings (see ``S3Store``).
    """
    kind = store_key(url)
    storage_options = options_for(url, storage_options)
    if kind == "local":
        return LocalStore()
    if kind == "s3":
        from streamrec.storage.s3.store import S3Store

        return S3Store(storage_options, max_connections=max_connections)
    if kind == "gcs":
        from streamrec.storage.gcs.store import GCSStore

        return GCSStore(storage_options)
    if kind == "azure":
        from streamrec.storage.azure.store import AzureStore

        return AzureStore(storage_options)
    if kind == "http":
        from streamrec.storage.http.store import HTTPStore

        return HTTPStore(storage_options)
    from streamrec.storage.local.memory import MemoryStore

    return MemoryStore(storage_options)


def prewarm(urls: list[str], storage_options: dict[str, Any] | None) -> None:
    """Start, in the background, the start-up work the stores of ``urls`` will need
    (:mod:`streamrec.storage.warmup`; today S3's: :func:`streamrec.storage.s3.tls.prewarm`).
    Never raises: whatever would fail fails on first use, as without it."""
    warmed: list[dict[str, Any] | None] = []
    for url in urls:
        try:
            if store_key(url) != "s3":
                continue
            options = options_for(url, storage_options)
            if options in warmed:
                continue
            warmed.append(options)
            from streamrec.storage.s3.tls import prewarm as prewarm_s3

            prewarm_s3(options)
        except Exception:  # an optimisation only
            continue


_S = TypeVar("_S", bound="StoreSet")


class StoreSet:
    """The stores one run uses, one per scheme, created on first use inside its event loop
    and closed with it (``async with StoreSet(options) as stores: stores.get(url)``).

    ``max_connections``: what the run may have in flight at once (see :func:`open_store`).
    ``lookup_reads_first_bytes``: see :attr:`ObjectStore.lookup_reads_first_bytes` (False for
    a run that reads through a local cache).
    """

    def __init__(
        self,
        storage_options: dict[str, Any] | None,
        max_connections: int | None = None,
        *,
        lookup_reads_first_bytes: bool = True,
    ) -> None:
        self.storage_options = storage_options
        self._max_connections = max_connections
        self._lookup_reads_first_bytes = lookup_reads_first_bytes
        self._stores: dict[str, ObjectStore] = {}

    def get(self, url: str) -> ObjectStore:
        """The store serving ``url`` (created on first use)."""
        key = store_key(url)
        store = self._stores.get(key)
        if store is None:
            store = self._stores[key] = open_store(
                url, self.storage_options, max_connections=self._max_connections
            )
            store.lookup_reads_first_bytes = self._lookup_reads_first_bytes
        return store

    async def __aenter__(self: _S) -> _S:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        stores, self._stores = self._stores, {}
        for store in stores.values():
            await store.close()
