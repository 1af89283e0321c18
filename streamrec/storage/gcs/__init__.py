"""``gs://`` and ``gcs://``: gcsfs for listing, the store's own aiohttp session for the rest.

* ``store.py``: listing via gcsfs (pinned to each object's generation), range GETs and first
  bytes on the store's own session, with gcsfs's public credentials;
* ``client.py``: the gcsfs filesystem, made off the event loop and failing fast (a refused
  connection is reported as refused; no credentials found is said within a second);
* ``sink.py``: resumable uploads that run while the bytes arrive, given what they use
  (session, location, headers), not their store.
"""
