"""The streaming engine: one epoch's shards read front to back, interleaved and shuffled.

* ``engine.py``: one iteration: list, plan, open, read, interleave, shuffle, hand over;
* ``opener.py``: a reader per shard, from its start or from a saved position;
* ``ahead.py``: the next shards of a sequential read opened ahead of their turn (their first
  blocks, within a part of the budget);
* ``prefetch.py``: the :class:`~streamrec.pipeline.stream.prefetch.ObjectReader` of one object
  (concurrent block reads in order, inside the budget) and ``read_exact``;
* ``read.py``: one shard's blocks through the format core, chunk by chunk;
* ``direct.py``: large records of a local uncompressed shard read straight into ``bytes``;
* ``interleave.py``: tf.data's deterministic interleave, or first-ready;
* ``shuffle.py``: the seeded record shuffle buffer (tf.data's semantics);
* ``views.py``: ``record_views()``, payloads as memoryviews into their pieces, held in the budget;
* ``scan.py``: whole shards read for the command line's tools with these same parts (the
  records located by shard and offset, dropped damage, lengths only).

Rules: bytes read ahead are reserved in the dataset's ``ByteBudget``; readers hand on pieces
with their events (position/) and never track the consumer themselves.
"""
