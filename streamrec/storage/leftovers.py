"""What killed writers leave behind: found by url prefix and removed.

A writer that is SIGKILLed (or whose machine disappears) cannot clean up, although nothing it
left is visible as an object:

* **S3**: multipart uploads stay open, invisible but billed, until aborted or a lifecycle rule
  removes them. They are listed with ``ListMultipartUploads`` under the prefix.
* **local files**: the hidden temporary files local sinks write under
  (:data:`~streamrec.storage.sinks.TEMP_NAME`: ``.NAME.<12 hex>.tmp`` beside ``NAME``). Only
  names of that exact shape are ever considered.
* **GCS**: resumable upload sessions cannot be listed by anyone; they are never visible and the
  service discards them after a week, so there is nothing to find.

Used by ``streamrec cleanup`` and by ``reshard``, which aborts the open uploads of the shards
a rerun is about to write.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from streamrec.errors import ObjectNotFoundError
from streamrec.storage.base import ObjectStore, split_scheme
from streamrec.storage.local import LocalStore
from streamrec.storage.sinks import TEMP_NAME
from streamrec.storage.translate import translate

if TYPE_CHECKING:
    from streamrec.storage.s3 import S3Store

__all__ = ["Leftover", "find_leftovers", "remove_leftover"]


@dataclass(frozen=True)
class Leftover:
    """One unfinished write: what it would have become, what it is, and since when."""

    url: str
    """The object the write would have committed."""
    kind: str
    """``"multipart upload"`` (S3) or ``"temporary file"`` (local)."""
    started: float
    """When the write began (Unix time: the upload's initiation, the file's mtime)."""
    handle: str
    """The S3 upload id, or the temporary file's path."""

    def age_s(self, now: float | None = None) -> float:
        """Seconds since the write began."""
        return (time.time() if now is None else now) - self.started


async def find_leftovers(
    store: ObjectStore, prefix: str, *, older_than_s: float = 0.0
) -> list[Leftover]:
    """Unfinished writes under the url ``prefix`` begun more than ``older_than_s`` ago,
    sorted by url. Stores without such leftovers (or that cannot list them) give []."""
    cutoff = time.time() - older_than_s
    if isinstance(store, LocalStore):
        found = await asyncio.to_thread(_local_temp_files, prefix)
    elif getattr(store, "scheme", None) == "s3":
        found = await _open_multipart_uploads(store, prefix)  # type: ignore[arg-type]
    else:
        found = []
    return sorted((f for f in found if f.started <= cutoff), key=lambda f: (f.url, f.started))


async def remove_leftover(store: ObjectStore, leftover: Leftover) -> None:
    """Abort the upload or delete the temporary file (already gone: nothing to do)."""
    if leftover.kind == "temporary file":
        try:
            await asyncio.to_thread(os.remove, leftover.handle)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise translate(exc, leftover.url, "removing its temporary file") from exc
        return
    s3: Any = store
    client = await s3.client()
    bucket, key = _bucket_key(leftover.url)
    try:
        await client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=leftover.handle)
    except Exception as exc:
        error = translate(exc, leftover.url, "aborting a multipart upload")
        if not isinstance(error, ObjectNotFoundError):  # gone meanwhile: the goal holds
            raise error from exc


def _local_temp_files(prefix: str) -> list[Leftover]:
    """Temporary files of local sinks under ``prefix`` (a directory, or a path prefix)."""
    path = LocalStore.path(prefix)
    scheme = "file://" if prefix.startswith("file://") else ""
    root = path if os.path.isdir(path) else os.path.dirname(path) or "."
    found = []
    for directory, _, names in os.walk(root):
        for name in names:
            match = TEMP_NAME.fullmatch(name)
            if match is None:
                continue
            temp = os.path.join(directory, name)
            target = os.path.join(directory, match["name"])
            if not (os.path.isdir(path) or target.startswith(path)):
                continue
            try:
                started = os.stat(temp).st_mtime
            except FileNotFoundError:  # committed or aborted meanwhile
                continue
            found.append(Leftover(scheme + target, "temporary file", started, temp))
    return found


def _bucket_key(url: str) -> tuple[str, str]:
    _, rest = split_scheme(url)
    bucket, _, key = rest.partition("/")
    return bucket, key


async def _open_multipart_uploads(store: S3Store, prefix: str) -> list[Leftover]:
    scheme = split_scheme(prefix)[0]
    bucket, key_prefix = _bucket_key(prefix)
    client = await store.client()
    found: list[Leftover] = []
    markers: dict[str, str] = {}
    while True:
        try:
            page = await client.list_multipart_uploads(Bucket=bucket, Prefix=key_prefix, **markers)
        except Exception as exc:
            raise translate(exc, prefix, "listing open multipart uploads") from exc
        for upload in page.get("Uploads", []):
            found.append(
                Leftover(
                    f"{scheme}://{bucket}/{upload['Key']}",
                    "multipart upload",
                    upload["Initiated"].timestamp(),
                    upload["UploadId"],
                )
            )
        if not page.get("IsTruncated"):
            return found
        markers = {
            "KeyMarker": page["NextKeyMarker"],
            "UploadIdMarker": page["NextUploadIdMarker"],
        }
