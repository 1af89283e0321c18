"""``az://`` and ``abfs://``: the Azure SDK's public calls; adlfs for the lookups it still makes.

* ``store.py``: globs and directories listed a page at a time (``glob_pages``; ``**`` and
  wildcards above the last level too, every blob below the prefix), globs with a wildcard in
  the container by adlfs; range reads through ``download_blob``
  (the SDK's retries off: streamrec's policy decides), their streamed answer read within
  bounds;
* ``listing.py``: one ``List Blobs`` page through the SDK's pager (each page one request
  under the retry policy, resumed from its own marker, checked by
  :class:`~streamrec.storage.pages.PageTrail`); every answer read whole within bounds and
  every listing page counted (elements, depth) before the SDK parses it;
* ``sink.py``: a block blob staged while the bytes arrive and committed in one step, given a
  blob-client getter, not its store.
"""
