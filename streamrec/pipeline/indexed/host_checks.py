"""The host's record of index checks, one file per dataset (the format:
:mod:`streamrec.format.index.check_record`), so that a shard checked by one process of a host
is not read again to check it by the others.

The file lives in ``<cache_dir>/checks/`` (else ``<temp>/streamrec-<uid>/checks/``), a
directory that must be this user's own and writable by nobody else: a record there is taken on
the word of whoever could write it. A slot is bound by its CRC to the shard's url, size,
version and index, so a damaged, stale or foreign slot counts as nothing verified. Every
failure to use the file (permissions, a full disk, another user's directory) only means
checking as if it were not there: the record saves reads, it never decides what is a record.

Its reads and writes are one 16-byte ``pread``/``pwrite`` of a local file per shard and
process, made on the event loop's thread (cheaper than handing them to another thread).
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import weakref
from collections.abc import Sequence
from typing import Any

from streamrec.format.index.check_record import (
    HEADER_BYTES,
    SLOT_BYTES,
    decode_header,
    decode_slot,
    encode_header,
    encode_slot,
)
from streamrec.storage.cache.files import FILE_MODE, check_private

__all__ = ["HostChecks", "default_root"]

logger = logging.getLogger("streamrec")

_DIRECTORY_MODE = 0o700


def default_root() -> str:
    """The per-user directory host records live under when a dataset has no ``cache_dir``."""
    return os.path.join(tempfile.gettempdir(), f"streamrec-{os.getuid()}")


class HostChecks:
    """One dataset's record of checks on this host: slot ``k`` for its ``k``-th shard."""

    def __init__(self, path: str, shards: int) -> None:
        self.path = path
        self.shards = shards
        self._fd: int | None = None
        self._usable = True

    @classmethod
    def for_dataset(cls, root: str, urls: Sequence[str]) -> HostChecks | None:
        """The record of the dataset of shards ``urls`` (in order) under ``root``; None when
        ``root`` cannot hold one this user alone may write."""
        directory = os.path.join(root, "checks")
        try:
            os.makedirs(directory, mode=_DIRECTORY_MODE, exist_ok=True)
            for path in (root, directory):
                check_private(os.stat(path), path)
        except OSError as exc:
            logger.debug("no host record of index checks in %s: %s", directory, exc)
            return None
        names = hashlib.sha256("\n".join(urls).encode("utf-8", "surrogatepass")).hexdigest()
        return cls(os.path.join(directory, f"{names[:40]}.checks"), len(urls))

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "shards": self.shards}  # a copy opens its own

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"], state["shards"])  # type: ignore[misc]

    def _file(self) -> int | None:
        if self._fd is None and self._usable:
            try:
                flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
                fd = os.open(self.path, flags, FILE_MODE)
            except OSError as exc:
                logger.debug("host record of index checks %s not used: %s", self.path, exc)
                self._usable = False
                return None
            weakref.finalize(self, os.close, fd)
            try:
                check_private(os.fstat(fd), self.path)
                if decode_header(os.pread(fd, HEADER_BYTES, 0)) != self.shards:
                    # new, or damaged: its slots (bound to their shards) are safe to keep
                    os.pwrite(fd, encode_header(self.shards), 0)
            except OSError as exc:
                logger.debug("host record of index checks %s not used: %s", self.path, exc)
                self._usable = False
                return None
            self._fd = fd
        return self._fd

    def known(self, slot: int, digest: bytes) -> int:
        """Leading entries of shard ``slot`` (its key digest ``digest``) verified on this host."""
        fd = self._file() if 0 <= slot < self.shards else None
        if fd is None:
            return 0
        try:
            return decode_slot(os.pread(fd, SLOT_BYTES, HEADER_BYTES + slot * SLOT_BYTES), digest)
        except OSError:
            return 0

    def record(self, slot: int, digest: bytes, entries: int) -> None:
        """The first ``entries`` entries of shard ``slot`` are verified (kept if more than the
        record says; any value a process leaves was verified)."""
        fd = self._file() if 0 <= slot < self.shards else None
        if fd is None or entries <= self.known(slot, digest):
            return
        try:
            os.pwrite(fd, encode_slot(digest, entries), HEADER_BYTES + slot * SLOT_BYTES)
        except OSError as exc:
            logger.debug("host record of index checks %s not written: %s", self.path, exc)
