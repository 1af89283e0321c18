"""The host's shard cache (``cache_dir``, ``cache_bytes``): complete copies of remote shards
shared by every process of one host.

* ``store.py``: :class:`~streamrec.storage.cache.store.ShardCache`: look-up, filling while a
  shard streams, publishing after a clean decode, eviction within ``cache_bytes``;
* ``whole.py``: a whole object (a manifest, a dataset index) fetched once per host through it;
* ``files.py``: the directory's files: locks taken without blocking, space allocated up front,
  atomic publishing, and the checks that the directory and its entries are this user's own.

Rules: an entry is untrusted (its CRC and size are checked against the object it copies); a
copy being filled is never read; the directory never holds more than ``cache_bytes``.
"""
