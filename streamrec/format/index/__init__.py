"""Record index sidecars (``<shard>.idx``), sans-I/O.

* ``core.py``: the formats (plain ``"<offset> <length>"`` lines, as DALI and the ``tfrecord``
  package write them; the extended four-column one of compressed shards), parsed within
  bounds and written;
* ``check.py``: whether an index's records are the shard's records (each entry checked against
  the shard's own length fields, from byte 0 on);
* ``text.py``: an index's text made from its columns without a Python step per number;
* ``dataset.py``: the dataset index (every shard's index in one object);
* ``check_record.py``: a host's record of which shards' indexes were checked.

Rules: an index is untrusted input: parsing accepts nothing a valid index of that shard could
not hold, and a record is read only from a verified boundary.
"""
