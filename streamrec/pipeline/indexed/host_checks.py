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

import contextlib
import hashlib
import logging
import os
import stat
import tempfile
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from streamrec.errors import StorageError
from streamrec.format.index.check_record import (
    HEADER_BYTES,
    SLOT_BYTES,
    decode_header,
    decode_slot,
    encode_header,
    encode_slot,
    key_digest,
)
from streamrec.storage.base import ObjectInfo
from streamrec.storage.cache.files import FILE_MODE, UntrustedCache, check_private
from streamrec.storage.registry import store_key

if TYPE_CHECKING:
    from streamrec.pipeline.indexed.trust import ShardKey

__all__ = ["HostChecks", "default_root", "pins_versions"]

logger = logging.getLogger("streamrec")

_DIRECTORY_MODE = 0o700


def default_root() -> str:
    """The per-user directory host records live under when a dataset has no ``cache_dir``."""
    return os.path.join(tempfile.gettempdir(), f"streamrec-{os.getuid()}")


def _private_directory(path: str, *, ours: bool) -> None:
    """``path`` as a directory this user alone may write (UntrustedCache, an OSError, if not):
    made 0700 when missing; ``ours`` (streamrec's own per-user directory, made under whatever
    umask): made 0700 when this user's own but writable by others too. A symlink is refused
    (another user may plant one in a shared temp directory)."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, _DIRECTORY_MODE)
    found = os.lstat(path)
    if stat.S_ISLNK(found.st_mode) or not stat.S_ISDIR(found.st_mode):
        raise UntrustedCache(f"{path} is not a directory (a symlink?)")
    if ours and found.st_uid == os.getuid() and found.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        os.chmod(path, _DIRECTORY_MODE)
        found = os.lstat(path)
    check_private(found, path)


def pins_versions(url: str) -> bool:
    """Whether ``url``'s store reads exactly the version a listing or manifest named (remote
    stores send it with every read; a local file's stated version is never checked)."""
    try:
        return store_key(url) not in ("local", "memory")
    except StorageError:
        return False


class HostChecks:
    """One dataset's record of checks on this host: slot ``k`` for its ``k``-th shard, used
    for the shards whose reads are pinned to a version only (``pinned``)."""

    def __init__(self, path: str, pinned: Sequence[bool]) -> None:
        self.path = path
        self.pinned = list(pinned)
        self.shards = len(self.pinned)
        self._fd: int | None = None
        self._usable = True

    @classmethod
    def for_dataset(cls, root: str | None, shards: Sequence[ObjectInfo]) -> HostChecks | None:
        """The record of the dataset of ``shards`` (in order) under ``root`` (None: the
        per-user default); None when no shard is pinned to a version or ``root`` cannot hold
        a record this user alone may write."""
        pinned = [shard.version is not None and pins_versions(shard.url) for shard in shards]
        if not any(pinned):
            return None
        try:
            ours = root is None
            root = default_root() if root is None else root
            directory = os.path.join(root, "checks")
            if not ours:
                os.makedirs(root, mode=_DIRECTORY_MODE, exist_ok=True)
            _private_directory(root, ours=ours)
            _private_directory(directory, ours=False)  # others could have written it: never
            urls = "\n".join(shard.url for shard in shards).encode("utf-8", "surrogatepass")
        except (OSError, ValueError) as exc:
            logger.debug("no host record of index checks: %s", exc)
            return None
        name = hashlib.sha256(urls).hexdigest()[:40]
        return cls(os.path.join(directory, f"{name}.checks"), pinned)

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "pinned": self.pinned}  # a copy opens its own

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"], state["pinned"])  # type: ignore[misc]

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

    def known(self, slot: int, key: ShardKey) -> int:
        """Leading entries of shard ``slot`` (``key``: as its checks are kept) verified on
        this host; 0 when none are recorded or the record cannot be read."""
        fd = self._file() if 0 <= slot < self.shards and self.pinned[slot] else None
        if fd is None:
            return 0
        try:
            data = os.pread(fd, SLOT_BYTES, HEADER_BYTES + slot * SLOT_BYTES)
            return decode_slot(data, key_digest(*key))
        except (OSError, ValueError) as exc:
            logger.debug("host record of index checks %s not read: %s", self.path, exc)
            return 0

    def record(self, slot: int, key: ShardKey, entries: int) -> None:
        """The first ``entries`` entries of shard ``slot`` are verified (kept if more than the
        record says; any value a process leaves was verified)."""
        fd = self._file() if 0 <= slot < self.shards and self.pinned[slot] else None
        if fd is None or entries <= self.known(slot, key):
            return
        try:
            data = encode_slot(key_digest(*key), entries)
            os.pwrite(fd, data, HEADER_BYTES + slot * SLOT_BYTES)
        except (OSError, ValueError) as exc:
            logger.debug("host record of index checks %s not written: %s", self.path, exc)
