"""A dataset's one index (``_dataset_index.bin``): found, fetched once per host, mapped.

Readers by record number (``len()``, ``get()``, global and block shuffle, ``even``) ask
:func:`load_dataset_index` before they look for sidecars. It looks up ``_dataset_index.bin``
in the shards' directory (their common one: one request), and uses it when it describes
every shard listed, as listed (name, size, and version where both have one) and with the
codec the dataset reads them with; else the sidecars are read as before (a stale index is
said in a warning naming a shard that differs and ``streamrec index --force``).

Fetched once per host: a remote dataset index goes through a shard cache
(:mod:`streamrec.storage.cache.store`): ``cache_dir`` when the dataset has one, else a
per-user directory under the system's temp directory. The first process of the host
downloads it (the others wait on its lock), every one memory-maps the same verified file:
DataLoader workers, DDP ranks, later epochs, resumed runs. A local dataset index is mapped
where it is. A store without versions (an HTTP server without ETags) cannot be cached safely:
the index is then read into memory.

:class:`MappedIndexes` is the record table's shards' indexes: a shard's entries are checked
(:meth:`~streamrec.format.index.dataset.DatasetIndex.shard_index`) when a read first needs
them; reads and checks then decode only the entries they use (:meth:`MappedIndexes.entries`,
16 bytes a record, dropped with the read), and whole indexes asked for (compressed shards)
are kept up to :data:`KEEP_BYTES`, least recently used dropped first: a consumer's memory for
the table is O(shards) plus that, never O(records).
It pickles as where the index is (a DataLoader worker maps the same file again).
"""

from __future__ import annotations

import asyncio
import logging
import mmap
import os
import shlex
import tempfile
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, overload

import numpy as np
import numpy.typing as npt

from streamrec.errors import (
    FormatError,
    IndexMismatchError,
    ObjectNotFoundError,
    PermissionDeniedError,
    StorageError,
)
from streamrec.format.codecs import Compression, compression_known
from streamrec.format.framing import OVERHEAD_BYTES
from streamrec.format.index.core import ShardIndex
from streamrec.format.index.dataset import DATASET_INDEX_NAME, DatasetIndex
from streamrec.pipeline.options import ReadOptions
from streamrec.pipeline.stats import Stats
from streamrec.redact import redact
from streamrec.storage.base import GLOB_CHARS, ObjectInfo, ObjectStore
from streamrec.storage.cache.store import ShardCache, cache_namespace
from streamrec.storage.cache.whole import fetch_whole
from streamrec.storage.local.store import LocalStore

__all__ = [
    "KEEP_BYTES",
    "MappedIndexes",
    "TableSource",
    "dataset_index_url",
    "host_cache",
    "load_dataset_index",
]

logger = logging.getLogger("streamrec")

KEEP_BYTES = 8 << 20
"""Decoded shard entries a table keeps (8 bytes a number), least recently used dropped."""
MARK_RECORDS = 4096
"""A large shard's record offsets are summed from the one of every this many records (8 bytes
each, kept): a range's first offset costs at most this many lengths added, not its shard's."""
DEFAULT_CACHE_BYTES = 8 << 30
"""The most the per-user default cache of dataset indexes holds (``cache_dir`` unset)."""


def default_cache_dir() -> str:
    """Where dataset indexes are kept when the dataset has no ``cache_dir``: per user."""
    return os.path.join(tempfile.gettempdir(), f"streamrec-{os.getuid()}", "dataset-indexes")


def dataset_index_url(shards: Sequence[ObjectInfo]) -> str | None:
    """Where the dataset index of ``shards`` would be: in their common directory (None when
    they have none below a bucket or the file system's root)."""
    if len(shards) < 2 or any("?" in shard.url for shard in shards):
        return None  # (one shard: its sidecar costs as much; signed urls: nothing beside them)
    directories = {shard.url.rpartition("/")[0] for shard in shards}
    if directories == {""}:
        return DATASET_INDEX_NAME  # relative names in the working directory
    common: list[str] = []
    for parts in zip(*(directory.split("/") for directory in directories), strict=False):
        if len(set(parts)) != 1:
            break
        common.append(parts[0])
    prefix = "/".join(common)
    if not prefix.strip("/") or prefix.endswith((":", ":/")) or GLOB_CHARS & set(prefix):
        return None
    return f"{prefix}/{DATASET_INDEX_NAME}"


@dataclass(frozen=True)
class _Where:
    """Where a dataset index's bytes are, to map them again (in a DataLoader worker)."""

    url: str
    path: str | None = None  # a local file: the object itself, or its cache entry
    data: bytes | None = None  # read into memory (no safe cache)

    def open(self) -> DatasetIndex:
        if self.path is None:
            assert self.data is not None
            return DatasetIndex(self.data, source=self.url)
        try:
            with open(self.path, "rb") as file:
                size = os.fstat(file.fileno()).st_size
                data: bytes | mmap.mmap = (
                    mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
                )
        except OSError as exc:
            raise StorageError(
                f"{redact(self.url)}: its copy {self.path} cannot be mapped: {exc}"
            ) from exc
        return DatasetIndex(data, source=self.url)


class MappedIndexes(Sequence[ShardIndex]):
    """The indexes of a table's shards, from a dataset index (see the module docstring):
    ``rows[k]`` is table shard ``k``'s row in it; ``urls[k]`` its url (for errors)."""

    def __init__(
        self, where: _Where, index: DatasetIndex, rows: Sequence[int], urls: Sequence[str]
    ):
        self._where = where
        self._index: DatasetIndex | None = index
        self._rows = list(rows)
        self._urls = list(urls)
        self._kept: OrderedDict[int, ShardIndex] = OrderedDict()
        self._kept_bytes = 0
        self._checked: set[int] = set()  # shards whose entries passed every check once
        # of shards over MARK_RECORDS records: where every MARK_RECORDS-th record starts
        self._marks: dict[int, npt.NDArray[np.int64]] = {}

    def __len__(self) -> int:
        return len(self._rows)

    def _dataset_index(self) -> DatasetIndex:
        if self._index is None:
            self._index = self._where.open()
        return self._index

    @overload
    def __getitem__(self, k: int) -> ShardIndex: ...
    @overload
    def __getitem__(self, k: slice) -> Sequence[ShardIndex]: ...
    def __getitem__(self, k: int | slice) -> ShardIndex | Sequence[ShardIndex]:
        if isinstance(k, slice):
            return [self[j] for j in range(*k.indices(len(self)))]
        found = self._kept.get(k)
        if found is not None:
            self._kept.move_to_end(k)
            return found
        found = self._decode(k)
        size = sum(
            column.nbytes
            for column in (found.offsets, found.lengths, found.restarts, found.skips)
            if column is not None
        )
        self._kept[k] = found
        self._kept_bytes += size
        while self._kept_bytes > KEEP_BYTES and len(self._kept) > 1:
            _, dropped = self._kept.popitem(last=False)
            self._kept_bytes -= sum(
                column.nbytes
                for column in (dropped.offsets, dropped.lengths, dropped.restarts, dropped.skips)
                if column is not None
            )
        return found

    def _decode(self, k: int) -> ShardIndex:
        """Shard ``k``'s index, decoded (and checked, the first time)."""
        try:
            found = self._dataset_index().shard_index(self._rows[k], checked=k in self._checked)
        except FormatError as exc:
            raise IndexMismatchError(
                f"its entries in the dataset index are not a valid index of it: {exc}; "
                f"rebuild it with `streamrec index --force {shlex.quote(redact(self._where.url))}`",
                url=self._urls[k],
            ) from exc
        self._checked.add(k)
        return found

    def _check(self, k: int) -> None:
        """Shard ``k``'s entries checked once (as :meth:`__getitem__` does), not kept: the
        readers of :meth:`entries` and :meth:`framed_lengths` decode what they need."""
        if k not in self._checked:
            self._decode(k)

    def random_access(self, k: int) -> bool:
        """Whether shard ``k``'s records can be read by index (its row says: none decoded)."""
        return self._dataset_index().shards[self._rows[k]].random_access

    def framed_lengths(self, k: int, local: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """Shard ``k``'s records ``local``: their framed lengths, read where they are stored
        (the shard's entries checked once first), none other decoded."""
        self._check(k)
        lengths = self._dataset_index().lengths(self._rows[k])[local]
        return lengths.astype(np.int64) + OVERHEAD_BYTES

    def entries(
        self, k: int, low: int, high: int
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """Shard ``k``'s entries ``low .. high-1`` (offsets, framed lengths), decoded alone
        from where they are stored (the shard's entries checked once first): a read holds
        16 bytes a record it reads or checks, not its shard's whole index (issue 31: 64
        reads in flight held ~60 MiB of decoded indexes of 25,600-record shards)."""
        found = self._kept.get(k)
        if found is not None:
            return found.offsets[low:high], found.lengths[low:high]
        self._check(k)
        raw = self._dataset_index().lengths(self._rows[k])  # records lie end to end from 0
        lengths = raw[low:high].astype(np.int64) + OVERHEAD_BYTES
        offsets = np.empty(len(lengths), dtype=np.int64)
        if len(offsets):
            offsets[0] = self._offset(k, raw, low)
            np.cumsum(lengths[:-1], out=offsets[1:])
            offsets[1:] += offsets[0]
        return offsets, lengths

    def _offset(self, k: int, raw: npt.NDArray[np.integer], record: int) -> int:
        """Where shard ``k``'s record ``record`` starts (``raw``: its stored lengths)."""
        if len(raw) <= MARK_RECORDS:
            return int(raw[:record].sum(dtype=np.int64)) + OVERHEAD_BYTES * record
        marks = self._marks.get(k)
        if marks is None:
            steps = np.arange(0, len(raw), MARK_RECORDS)
            sums = np.add.reduceat(raw, steps, dtype=np.int64) + OVERHEAD_BYTES * np.diff(
                steps, append=len(raw)
            )
            marks = np.zeros(len(sums) + 1, dtype=np.int64)
            np.cumsum(sums, out=marks[1:])
            self._marks[k] = marks
        mark = record // MARK_RECORDS
        low = mark * MARK_RECORDS
        return (
            int(marks[mark])
            + int(raw[low:record].sum(dtype=np.int64))
            + OVERHEAD_BYTES * (record - low)
        )

    def __iter__(self) -> Iterator[ShardIndex]:
        return (self[k] for k in range(len(self)))

    def digest(self, k: int) -> bytes:
        """What shard ``k``'s entries are (a BLAKE2b digest of them in the dataset index),
        without decoding them: the key its verified boundaries are kept under."""
        return self._dataset_index().segment_digest(self._rows[k])

    def __getstate__(self) -> dict[str, Any]:
        return {"where": self._where, "rows": self._rows, "urls": self._urls}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["where"], None, state["rows"], state["urls"])  # type: ignore[misc]


@dataclass(frozen=True)
class TableSource:
    """What a dataset index gives a record table: the listed shards' indexes, codecs,
    record counts and framed bytes in all."""

    indexes: MappedIndexes
    compressions: list[Compression]
    random_access: list[bool]
    counts: list[int]
    framed_bytes: int


async def load_dataset_index(
    shards: Sequence[ObjectInfo],
    store_of: Callable[[str], ObjectStore],
    options: ReadOptions,
    stats: Stats,
) -> TableSource | None:
    """The dataset index of ``shards``, if there is one that describes all of them as they
    are (see the module docstring); None otherwise (read the sidecars)."""
    started = time.perf_counter()
    try:
        return await _load(shards, store_of, options, stats)
    finally:
        stats.listing_s += time.perf_counter() - started


async def _load(
    shards: Sequence[ObjectInfo],
    store_of: Callable[[str], ObjectStore],
    options: ReadOptions,
    stats: Stats,
) -> TableSource | None:
    url = dataset_index_url(shards)
    if url is None:
        return None
    store = store_of(url)

    def count_retry(_: Exception) -> None:
        stats.retries += 1

    try:
        [found] = await options.retry.run(
            lambda: store.expand(url), describe=f"looking up {url}", on_retry=count_retry
        )
    except (ObjectNotFoundError, PermissionDeniedError):  # none, or none this reader may see
        return None
    where = await _fetch(found, store, options, count_retry)
    index = await asyncio.to_thread(where.open)
    directory = url[: -len(DATASET_INDEX_NAME)]
    by_name = {shard.name: k for k, shard in enumerate(index.shards)}

    def known_as(shard: ObjectInfo) -> Compression | Literal["unknown"]:
        # the dataset's setting, else the name's suffix, else a manifest's statement
        return compression_known(options.compression, shard.url, shard.compression)

    rows: list[int] = []
    for shard in shards:
        k = by_name.get(shard.url[len(directory) :]) if shard.url.startswith(directory) else None
        row = index.shards[k] if k is not None else None
        problem = None
        if row is None:
            problem = "is not in it"
        elif row.size != shard.size:
            problem = f"has {shard.size} bytes, it says {row.size}"
        elif None not in (row.version, shard.version) and row.version != shard.version:
            problem = f"is version {shard.version}, it says {row.version}"
        elif known_as(shard) not in ("unknown", row.compression):
            problem = f"is read with compression={known_as(shard)!r}, it says {row.compression!r}"
        if problem is not None:
            logger.warning(
                "not using the dataset index %s: the shard %s %s (reading the shards' own "
                "indexes instead; rebuild it with `streamrec index --force %s`)",
                redact(url),
                redact(shard.url),
                problem,
                shlex.quote(redact(directory.rstrip("/"))),
            )
            return None
        assert k is not None and row is not None
        if shard.records is not None and shard.records != row.records:
            raise IndexMismatchError(
                f"its manifest says {shard.records} records, the dataset index {redact(url)} "
                f"says {row.records}: one of them is stale",
                url=shard.url,
            )
        rows.append(k)
    chosen = [index.shards[k] for k in rows]
    return TableSource(
        MappedIndexes(where, index, rows, [shard.url for shard in shards]),
        [row.compression for row in chosen],
        [row.random_access for row in chosen],
        [row.records for row in chosen],
        sum(row.stream_bytes for row in chosen),
    )


async def _fetch(
    obj: ObjectInfo,
    store: ObjectStore,
    options: ReadOptions,
    on_retry: Callable[[Exception], None],
) -> _Where:
    """Where the dataset index ``obj`` can be mapped from: itself when local, else its copy
    in the host's cache (downloaded by one process), else its bytes."""
    if isinstance(store, LocalStore):
        return _Where(obj.url, path=LocalStore.path(obj.url))
    copy = await fetch_whole(
        obj,
        store,
        host_cache(options),
        cache_namespace(obj.url, options.storage_options),
        options.retry,
        on_retry,
    )
    return _Where(obj.url, path=copy.path, data=copy.data)


def host_cache(options: ReadOptions) -> ShardCache:
    """The cache of the dataset's metadata a host shares (dataset indexes, manifests):
    ``cache_dir`` when the dataset has one, else a per-user directory under the system's
    temp directory (:func:`default_cache_dir`)."""
    if options.cache_dir is not None and options.cache_bytes is not None:
        return ShardCache(options.cache_dir, options.cache_bytes, stall_s=options.retry.timeout_s)
    return ShardCache(default_cache_dir(), DEFAULT_CACHE_BYTES, stall_s=options.retry.timeout_s)
