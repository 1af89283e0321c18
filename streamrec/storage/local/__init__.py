"""Local files and ``memory://``.

* ``store.py``: plain paths and ``file://`` urls, read and written off the event loop
  (aiofiles), writes published by an atomic rename;
* ``records.py``: large records of a local file read straight into their final ``bytes``;
* ``memory.py``: fsspec's process-global MemoryFileSystem, for tests and examples.
"""
