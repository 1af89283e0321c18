"""Which shards a dataset reads, and how many records they hold, before any is read.

* ``urls.py``: what the urls a user gives stand for (globs, directories, manifests) and
  :func:`~streamrec.pipeline.listing.urls.list_shards`, the one listing of every reader;
* ``plan.py``: this consumer's shards and their order (seeded shuffle, host and worker split);
* ``sidecars.py``: the shards' record index sidecars (``<shard>.idx``): found, fetched, checked;
* ``lengths.py``: ``len(ds)`` and ``ds.num_records`` from manifests and sidecars.

Rules: listing reads storage only to list, to fetch manifests and sidecars and (compression
"auto", where neither the name nor a manifest says) a shard's first 12 bytes, never its
records; it imports nothing of the pipeline above the root's options, stats and order (no
engine, no position). A listing or a sidecar is untrusted: what does not fit is a
``StreamrecError``.
"""
