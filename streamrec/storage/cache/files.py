"""The files of the shard cache's directory (see :mod:`streamrec.storage.cache.store`): locks
taken without blocking, space allocated up front, atomic publishing, and the checks that the
directory and its entries are this user's own."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import time
from collections.abc import Iterator

import crc32c as _crc32c

__all__ = [
    "DIR_LOCK",
    "ENTRY",
    "FILE_MODE",
    "LOCK",
    "PART",
    "POLL_FIRST_S",
    "POLL_MAX_S",
    "DirectoryLockStalled",
    "UntrustedCache",
    "allocate",
    "check_private",
    "directory_lock",
    "file_crc32c",
    "mtime_ns",
    "publish",
    "pwrite_all",
    "remove_if_dead",
    "remove_lock_file",
    "try_lock",
    "unlink_if_same",
    "unlock",
]

DIR_LOCK = "streamrec-cache.lock"
ENTRY, PART, LOCK = ".shard", ".part", ".lock"
FILE_MODE = 0o600
POLL_FIRST_S = 0.005  # waiting for another process's download: first poll, doubling up to
POLL_MAX_S = 0.1  # this (a published entry is seen within 0.1 s)


class DirectoryLockStalled(OSError):
    """The directory lock stayed held past ``stall_s`` (a stopped or hostile process)."""


class UntrustedCache(OSError):
    """The cache directory or an entry is not this user's own, or others may write it."""


def check_private(found: os.stat_result, path: str) -> None:
    if found.st_uid != os.getuid():
        raise UntrustedCache(f"{path} belongs to user {found.st_uid}, not to this user")
    if found.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UntrustedCache(
            f"{path} may be written by other users (mode {stat.S_IMODE(found.st_mode):o})"
        )


def try_lock(path: str, create: bool = True) -> int | None:
    """The flock of ``path`` if free now, else None. A lock file may be removed by whoever
    holds it (see remove_lock_file): a lock taken on a file no longer at ``path`` is retried
    on the new one."""
    while True:
        try:
            flags = os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW | (os.O_CREAT if create else 0)
            fd = os.open(path, flags, FILE_MODE)
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)
        if not create:
            return None


def flock_within(fd: int, seconds: float) -> bool:
    """Take the flock of ``fd``, waiting at most ``seconds`` (polling: a blocked flock cannot
    be given up). False if it stayed held."""
    deadline = time.monotonic() + seconds
    delay = POLL_FIRST_S / 5
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(delay, left))
            delay = min(delay * 2, POLL_MAX_S)


def unlock(fd: int, path: str) -> None:
    """Remove the lock file ``path`` we hold as ``fd`` (safe while held: see try_lock), then
    release it: a waiting process goes on."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    os.close(fd)


def remove_lock_file(path: str) -> None:
    """Remove a lock file nobody holds (entries come and go; their lock files with them)."""
    fd = try_lock(path, create=False)
    if fd is not None:
        unlock(fd, path)


def remove_if_dead(part: str) -> bool:
    """Remove ``part`` if the process that wrote it is gone (its lock is free)."""
    lock_path = part[: -len(PART)] + LOCK
    fd = try_lock(lock_path, create=False)
    if fd is None and os.path.exists(lock_path):
        return False  # held: a download in progress
    with contextlib.suppress(FileNotFoundError):
        os.unlink(part)
    if fd is not None:
        unlock(fd, lock_path)
    return True


def allocate(fd: int, size: int) -> None:
    try:
        os.posix_fallocate(fd, 0, size)  # the blocks themselves: no ENOSPC half-way
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
        os.ftruncate(fd, size)  # file systems without fallocate: the size at least


def file_crc32c(fd: int, size: int, step: int = 1 << 20) -> int:
    """The CRC-32C of the first ``size`` bytes of the file ``fd`` (read a step at a time)."""
    crc, offset = 0, 0
    while offset < size:
        data = os.pread(fd, min(step, size - offset), offset)
        if not data:
            break
        crc = _crc32c.crc32c(data, crc)
        offset += len(data)
    return int(crc)


def pwrite_all(fd: int, pieces: list[bytes], offset: int) -> int:
    total = 0
    for piece in pieces:
        view = memoryview(piece)
        while view:
            written = os.pwrite(fd, view, offset + total)
            total += written
            view = view[written:]
    return total


@contextlib.contextmanager
def directory_lock(directory: str, stall_s: float) -> Iterator[bool]:
    """The directory lock, held for the block if it could be taken within ``stall_s`` (held
    for a scan: milliseconds; held longer, by a stopped or hostile process, the caller goes
    on without the cache rather than wait forever). Yields whether it is held."""
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
    fd = os.open(os.path.join(directory, DIR_LOCK), flags, FILE_MODE)
    try:
        yield flock_within(fd, stall_s)
    finally:
        os.close(fd)


def publish(fd: int, part: str, path: str, stall_s: float) -> None:
    os.fsync(fd)
    # Under the directory lock: a scan that reads the directory while an entry is renamed
    # may miss it under both names (readdir promises only entries left alone meanwhile),
    # and a reservation would then count its bytes as free.
    with directory_lock(os.path.dirname(path), stall_s) as locked:
        if not locked:
            raise DirectoryLockStalled(f"{DIR_LOCK} stays locked for more than {stall_s:g} s")
        os.rename(part, path)  # atomic: readers see the whole copy or none
    with contextlib.suppress(OSError):  # make the rename durable too (best effort)
        directory = os.open(os.path.dirname(path), os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


def unlink_if_same(fd: int, path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        if os.stat(path).st_ino == os.fstat(fd).st_ino:
            os.unlink(path)


def mtime_ns(path: str) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except FileNotFoundError:
        return None
