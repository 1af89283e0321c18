"""Async object access: url -> store; list, size, read, write. The only layer that does I/O.

* ``base.py``: :class:`~streamrec.storage.base.ObjectStore` (the interface every scheme
  implements) and :class:`~streamrec.storage.base.ObjectInfo`;
* ``registry.py``: url -> store (one per scheme and options), and the start-up warm-up;
* ``translate.py``: foreign exceptions -> ``streamrec.errors``; ``retry.py``: the retry policy
  (retries decided by exception type); ``pages.py``: a paged listing checked page by page;
* ``sink_base.py``: the sink interface writers upload through; ``leftovers.py``: what killed
  writers left behind; ``fsspec_store.py``: listing through fsspec's async filesystems;
  ``warmup.py``: start-up work done ahead in threads; ``probe.py``: a store measured through
  its own reads and uploads (``streamrec probe``), and the settings that follow;
  ``timing.py``: requests and their first byte counted for the dataset that sent them;
* wings per scheme: ``s3/``, ``gcs/``, ``azure/``, ``http/``, ``local/``; ``cache/``.

Rules: imports nothing from ``pipeline``, ``write`` or above; every call makes one attempt;
everything a store answers is checked against what was asked.
"""
