"""``az://`` and ``abfs://``: adlfs for listing, the Azure SDK's public calls for the rest.

* ``store.py``: listing via adlfs; range reads through ``download_blob`` (the SDK's retries
  off: streamrec's policy decides), their streamed answer read within bounds;
* ``sink.py``: a block blob staged while the bytes arrive and committed in one step, given a
  blob-client getter, not its store.
"""
