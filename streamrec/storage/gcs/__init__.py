"""``gs://`` and ``gcs://``: the store's own aiohttp session for globs' listing pages, range
reads and uploads; gcsfs for credentials and the lookups it still makes.

* ``store.py``: range GETs and first bytes on the store's own session (pinned to each
  object's generation), with gcsfs's public credentials; globs and directories listed a page
  at a time (``glob_pages``; ``**`` and wildcards above the last level too, every object
  below the prefix), globs with a wildcard in the bucket by gcsfs;
* ``listing.py``: one JSON API ``objects.list`` page, asked for and parsed within bounds
  (each page one request under the retry policy, resumed from its own ``pageToken``, checked
  by :class:`~streamrec.storage.pages.PageTrail`);
* ``client.py``: the gcsfs filesystem, made off the event loop and failing fast (a refused
  connection is reported as refused; no credentials found is said within a second);
* ``sink.py``: resumable uploads that run while the bytes arrive, given what they use
  (session, location, headers), not their store.
"""
