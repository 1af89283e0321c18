"""URL -> store. Each store is created inside the event loop that uses it and closed with it."""

from __future__ import annotations

from typing import Any

from streamrec.errors import StorageError
from streamrec.storage.base import ObjectInfo, ObjectStore, split_scheme
from streamrec.storage.local import LocalStore

__all__ = ["ObjectInfo", "ObjectStore", "open_store", "split_scheme", "store_key"]

_SCHEMES = {
    "file": "local",
    "s3": "s3",
    "s3a": "s3",
    "gs": "gcs",
    "gcs": "gcs",
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


def open_store(
    url: str, storage_options: dict[str, Any] | None = None, *, max_connections: int | None = None
) -> ObjectStore:
    """A new store for ``url``'s scheme; ``storage_options`` go to the fsspec filesystem.

    ``max_connections``: the most requests the caller may have in flight at once; stores whose
    client caps its connection pool below that (botocore: 10) are sized to it. Default: a pool
    large enough for any dataset with default settings (see ``S3Store``).
    """
    kind = store_key(url)
    if kind == "local":
        return LocalStore()
    if kind == "s3":
        from streamrec.storage.s3 import S3Store

        return S3Store(storage_options, max_connections=max_connections)
    if kind == "gcs":
        from streamrec.storage.gcs import GCSStore

        return GCSStore(storage_options)
    if kind == "http":
        from streamrec.storage.http import HTTPStore

        return HTTPStore(storage_options)
    from streamrec.storage.memory import MemoryStore

    return MemoryStore(storage_options)
