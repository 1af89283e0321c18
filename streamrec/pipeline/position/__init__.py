"""Where the consumer is, exactly: the events the readers attach to records, and resume states.

* ``events.py``: the typed events of a piece ``(records, events)``, one per block of records;
* ``trackers.py``: the consumer's cursor and trackers, which apply the events of what it took;
* ``state.py``: the resume state as typed values, parsed and checked once (states are
  untrusted: every field is checked before use);
* ``buffer_codec.py``: the shuffle buffer's record locations in a state, one checked string;
* ``draws.py``: the shuffle buffer's random draws, counted (a state names the generator by
  the count);
* ``state_config.py``: the configuration a state records (settings at their defaults left
  out), checked against the dataset's;
* ``url_names.py``: the dataset's urls in a state (a list while short, else a digest);
* ``done.py``: first-ready reading's finished shards, as ranges of ordinals.

Rules: sans-I/O (no storage, no asyncio); the engines produce events, only trackers apply them,
so the position never comes from a reader's own variables (they run ahead of the consumer).
"""
