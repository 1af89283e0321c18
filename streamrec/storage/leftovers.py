"""What killed writers leave behind: found by url prefix and removed.

A writer that is SIGKILLed (or whose machine disappears) cannot clean up, although nothing it
left is visible as an object:

* **S3**: multipart uploads stay open, invisible but billed, until aborted or a lifecycle rule
  removes them. They are listed with ``ListMultipartUploads`` under the prefix.
* **local files**: the hidden temporary files local sinks write under
  (:data:`~streamrec.storage.sink_base.TEMP_NAME`: ``.NAME.<12 hex>.tmp`` beside ``NAME``). Only
  names of that exact shape are ever considered.
* **GCS**: resumable upload sessions cannot be listed by anyone; they are never visible and the
  service discards them after a week, so there is nothing to find.
* **Azure**: staged, uncommitted blocks (invisible; the service discards them 7 days after the
  last one was staged). Blobs that have only those are listed (``include=uncommittedblobs``)
  and discarded by deleting them; a blob committed since it was listed is left alone (see
  :meth:`~streamrec.storage.azure.store.AzureStore.abort_unfinished`).

Used by ``streamrec cleanup`` and by ``reshard``, which aborts the open uploads of the shards
a rerun is about to write.
"""

from __future__ import annotations

import time

from streamrec.storage.base import Leftover, ObjectStore

__all__ = ["Leftover", "find_leftovers", "remove_leftover"]


async def find_leftovers(
    store: ObjectStore, prefix: str, *, older_than_s: float = 0.0
) -> list[Leftover]:
    """Unfinished writes under the url ``prefix`` begun more than ``older_than_s`` ago,
    sorted by url (see :meth:`~streamrec.storage.base.ObjectStore.unfinished_writes`)."""
    cutoff = time.time() - older_than_s
    found = await store.unfinished_writes(prefix)
    return sorted((f for f in found if f.started <= cutoff), key=lambda f: (f.url, f.started))


async def remove_leftover(store: ObjectStore, leftover: Leftover) -> None:
    """Abort the upload or delete the temporary file (already gone: nothing to do)."""
    await store.abort_unfinished(leftover)
