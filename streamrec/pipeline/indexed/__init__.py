"""Reading by record number: the indexed engine and random access (``ds.get``).

* ``engine.py``: an indexed epoch: a fixed order of record numbers read by coalesced ranges;
* ``table.py``: the :class:`~streamrec.pipeline.indexed.table.RecordTable` (``build_table``:
  every shard's record by number, from its sidecar), span planning and ``read_records``;
* ``lookup.py``: ``ds.get(indices)`` / ``ds.aget(indices)`` on one loop thread per dataset;
* ``trust.py``: which index entries are verified against the shard's own framing;
* ``host_checks.py``: those checks recorded for the host's other processes (versioned shards).

Rules: needs every shard's index sidecar (else ``RandomAccessUnavailableError``); an index is
untrusted: a record is read only from a verified boundary; every range read is reserved in the
prefetch budget before it is sent.
"""
