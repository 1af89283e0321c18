"""Shards' record index sidecars (``<shard>.idx``): found, fetched and checked; record counts.

The read side of :mod:`streamrec.format.index.core`. For each shard:

1. **find** its sidecar: from the listing where it saw them
   (:attr:`~streamrec.storage.base.ObjectInfo.index_known`, see
   :mod:`streamrec.pipeline.listing.urls`); otherwise one listing of ``<directory>/*.idx`` for a
   directory holding many such shards (local, S3, GCS, memory), else a lookup of
   ``<shard>.idx`` each. No sidecar: ``None``.
2. **decide the shard's codec** the way its reader does
   (:func:`~streamrec.format.codecs.resolve_compression`: the ``compression`` setting, else the
   name's suffix, else what its listing states (a manifest's ``"compression"``:
   ``ObjectInfo.compression``), else its first 12 bytes, read only when none of those tells): a
   compressed shard's index may be larger and has its offsets in the uncompressed stream.
3. **check the sidecar's size** (as listed) against
   :func:`~streamrec.format.index.core.index_size_limit` *before* reading it, then read it 1 MiB
   at a time, each piece parsed (:class:`~streamrec.format.index.core.IndexParser`) against the
   shard's size now before the next is requested: at most ``concurrency`` pieces in flight
   and one parse's temporaries, whatever the sidecars hold. A count (:func:`count_index`,
   ``len(ds)``) keeps no table; an index kept holds 8 bytes a number.

A sidecar that does not fit its shard (too big, or not a valid index of it: stale after the
shard was rewritten) is an :class:`~streamrec.errors.IndexMismatchError` naming both urls and
``streamrec index --force``. Shards are handled ``concurrency`` at a time; the first error
cancels the rest.

:func:`record_counts` gives each shard's record count where it is known without reading the
shard: its manifest's count (``ObjectInfo.records``), else its sidecar's length (after the
sidecar's own checks; whether its entries are the shard's records is checked when they are
read, :mod:`streamrec.pipeline.indexed.trust`: that needs the shard's bytes).
"""

from __future__ import annotations

import asyncio
import shlex
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from typing import Literal, TypeVar

from streamrec._portal import run_all
from streamrec.errors import (
    CompressionError,
    FormatError,
    IndexMismatchError,
    ObjectNotFoundError,
    StorageError,
    TransientStorageError,
)
from streamrec.format.codecs import Compression, compression_known, resolve_compression, sniff
from streamrec.format.framing import HEADER_BYTES
from streamrec.format.identify import HEAD_BYTES as IDENTIFY_BYTES
from streamrec.format.identify import looks_like
from streamrec.format.index.core import (
    INDEX_SUFFIX,
    IndexParser,
    ShardIndex,
    index_size_limit,
    index_url,
)
from streamrec.storage import timing
from streamrec.storage.base import GLOB_CHARS, ObjectInfo, ObjectStore
from streamrec.storage.pages import list_glob
from streamrec.storage.registry import store_key
from streamrec.storage.retry import RetryPolicy

__all__ = [
    "DEFAULT_CONCURRENCY",
    "count_index",
    "decoder_compression",
    "find_indexes",
    "load_index",
    "load_indexes_and_codecs",
    "record_counts",
    "shard_compression",
    "stated_contradiction",
]

T = TypeVar("T")
StoreOf = Callable[[str], ObjectStore]
OnRetry = Callable[[TransientStorageError], None]

DEFAULT_CONCURRENCY = 16
"""Shards whose sidecars are looked up and read at once."""
_LIST_FROM = 8
"""From this many shards of unknown index in one directory, one listing of its sidecars
replaces a lookup each."""
_LISTABLE = ("local", "s3", "gcs", "memory")  # stores whose globs list reliably (not http)


async def shard_compression(
    shard: ObjectInfo,
    store: ObjectStore,
    retry: RetryPolicy,
    requested: str | None = "auto",
    *,
    on_retry: OnRetry | None = None,
) -> Compression:
    """The codec ``shard`` is read with: ``requested`` unless ``"auto"``, else by the name's
    suffix, else as its listing states (``ObjectInfo.compression``: a manifest's), else by its
    first 12 bytes (read only then)."""
    known = compression_known(requested, shard.url, shard.compression)
    if known != "unknown" or not shard.size:
        return None if known == "unknown" else known

    async def head() -> bytes:
        return await store.read_range(shard, 0, min(HEADER_BYTES, shard.size))

    first = await timing.metadata_read(
        retry.run(head, describe=f"{shard.url}: reading its first bytes", on_retry=on_retry)
    )
    return resolve_compression(requested, shard.url, first, shard.compression)


def decoder_compression(shard: ObjectInfo, requested: str | None) -> str | None:
    """The ``compression`` a decoder of ``shard`` is given: the codec :func:`shard_compression`
    knows without reading (``requested``, the name, the listing's statement), else ``"auto"``
    (the first bytes the decoder reads anyway decide). Every reader of a shard decides alike:
    a statement its bytes contradict fails there, never reads them otherwise."""
    known = compression_known(requested, shard.url, shard.compression)
    return "auto" if known == "unknown" else known


_DESCRIBED = {None: "uncompressed", "gzip": "with GZIP", "zlib": "with ZLIB"}


async def stated_contradiction(
    shard: ObjectInfo,
    codec: Compression,
    store: ObjectStore,
    retry: RetryPolicy,
    *,
    on_retry: OnRetry | None = None,
) -> CompressionError | None:
    """Called where reading ``shard`` as ``codec`` failed: when that is the codec its listing
    states (``ObjectInfo.compression``, untrusted metadata) and its first bytes (one read of
    16) are not that, the error to raise instead, naming the shard, byte 0 and the statement
    (not the index or a resume state the failure seemed to blame); else None."""
    if shard.compression == "unknown" or codec != shard.compression or not shard.size:
        return None

    async def head() -> bytes:
        return await store.read_range(shard, 0, min(IDENTIFY_BYTES, shard.size))

    try:
        first = await retry.run(
            head, describe=f"{shard.url}: reading its first bytes", on_retry=on_retry
        )
    except StorageError:
        return None  # the failure being explained stands on its own
    kind = looks_like(first)
    found: Compression | Literal["unknown"] = sniff(first)
    if found is None and kind != "an uncompressed TFRecord file":
        found = "unknown"
    if found == codec:
        return None
    override = "" if found == "unknown" else f"; compression={found!r} reads it regardless"
    return CompressionError(
        f'its listing states it is stored {_DESCRIBED[codec]} (the "compression" of its '
        f"manifest or dataset index), but its first bytes look like "
        f"{kind or 'no format streamrec knows'}: that metadata does not describe this "
        f"shard{override}",
        url=shard.url,
        offset=0,
    )


async def find_indexes(
    shards: Sequence[ObjectInfo],
    store_of: StoreOf,
    retry: RetryPolicy,
    *,
    concurrency: int = DEFAULT_CONCURRENCY,
    on_retry: OnRetry | None = None,
) -> list[ObjectInfo | None]:
    """Each shard's index sidecar (url, size, version), or None where it has none (see the
    module docstring for how they are found)."""
    found: dict[int, ObjectInfo | None] = {}
    unknown: dict[str, list[int]] = defaultdict(list)
    for k, shard in enumerate(shards):
        if shard.index_known:
            found[k] = shard.index
        else:
            directory, _, _ = shard.url.rpartition("/")
            unknown[directory].append(k)
    gate = asyncio.Semaphore(concurrency)

    async def listing(directory: str, members: list[int]) -> None:
        pattern = f"{directory}/*{INDEX_SUFFIX}"
        store = store_of(pattern)
        async with gate:
            try:
                listed = await list_glob(store, pattern, retry, on_retry)
            except ObjectNotFoundError:
                listed = []
        by_url = {obj.url: obj for obj in listed}
        for k in members:
            found[k] = by_url.get(index_url(shards[k].url))

    async def lookup(k: int) -> None:
        url = index_url(shards[k].url)
        store = store_of(url)
        async with gate:
            try:
                [found[k]] = await retry.run(
                    lambda: store.expand(url), describe=f"looking up {url}", on_retry=on_retry
                )
            except ObjectNotFoundError:
                found[k] = None

    jobs: list[Awaitable[None]] = []
    for directory, members in unknown.items():
        if (
            len(members) >= _LIST_FROM
            and GLOB_CHARS.isdisjoint(directory)
            and store_key(shards[members[0]].url) in _LISTABLE
        ):
            jobs.append(listing(directory, members))
        else:
            jobs += [lookup(k) for k in members]
    await run_all(jobs)
    return [found[k] for k in range(len(shards))]


def _rebuild(shard: ObjectInfo) -> str:
    return f"rebuild it with `streamrec index --force {shlex.quote(shard.url)}`"


_READ_BYTES = 1 << 20
"""A sidecar is read (and parsed) this many bytes at a time: ``concurrency`` sidecars in
flight hold at most that many of these, whatever their size."""


async def load_index(
    shard: ObjectInfo,
    sidecar: ObjectInfo,
    store: ObjectStore,
    retry: RetryPolicy,
    *,
    compressed: bool,
    on_retry: OnRetry | None = None,
) -> ShardIndex:
    """The index in ``sidecar`` of ``shard`` (``compressed``: stored with GZIP/ZLIB), its size
    checked before it is read; IndexMismatchError when it does not fit the shard as it is,
    ObjectNotFoundError when it is gone (see :func:`_parse_current`)."""
    parser = await _parse_current(
        shard, sidecar, store, retry, compressed=compressed, keep=True, on_retry=on_retry
    )
    return parser.index()


async def count_index(
    shard: ObjectInfo,
    sidecar: ObjectInfo,
    store: ObjectStore,
    retry: RetryPolicy,
    *,
    compressed: bool,
    on_retry: OnRetry | None = None,
) -> int:
    """The record count of ``sidecar``'s index of ``shard``, checked as :func:`load_index`
    checks it, without keeping its table (memory: one piece of its text at a time)."""
    parser = await _parse_current(
        shard, sidecar, store, retry, compressed=compressed, keep=False, on_retry=on_retry
    )
    return parser.records


class _Resized(StorageError):
    """A sidecar read short of the size it was listed (or named in a manifest) with."""


async def _parse_current(
    shard: ObjectInfo,
    sidecar: ObjectInfo,
    store: ObjectStore,
    retry: RetryPolicy,
    *,
    compressed: bool,
    keep: bool,
    on_retry: OnRetry | None,
) -> IndexParser:
    """:func:`_parse_sidecar` of ``sidecar`` as it was listed, else as it is now: a sidecar a
    manifest names (``record_index``, read without a lookup) may have been rebuilt or removed
    since (``streamrec index --force`` rewrites sidecars, not the manifest). Where the one
    listed is gone, another size or does not fit, it is looked up (once, only then) and the
    one there now read; ObjectNotFoundError when there is none now."""
    try:
        return await _parse_sidecar(
            shard, sidecar, store, retry, compressed=compressed, keep=keep, on_retry=on_retry
        )
    except (ObjectNotFoundError, _Resized, IndexMismatchError):
        try:
            [now] = await retry.run(
                lambda: store.expand(sidecar.url),
                describe=f"looking up {sidecar.url}",
                on_retry=on_retry,
            )
        except ObjectNotFoundError:
            now = None
        if now is not None and (now.size, now.version) == (sidecar.size, sidecar.version):
            raise  # it is the one listed: what was wrong with it stands
        if now is None:
            raise ObjectNotFoundError(
                f"{sidecar.url}: the record index of {shard.url} its listing or manifest "
                "names is gone"
            ) from None
    return await _parse_sidecar(
        shard, now, store, retry, compressed=compressed, keep=keep, on_retry=on_retry
    )


async def _parse_sidecar(
    shard: ObjectInfo,
    sidecar: ObjectInfo,
    store: ObjectStore,
    retry: RetryPolicy,
    *,
    compressed: bool,
    keep: bool,
    on_retry: OnRetry | None,
) -> IndexParser:
    """``sidecar`` read :data:`_READ_BYTES` at a time, each piece parsed before the next is
    requested; refused before a byte is read when its listed size is more than any index of
    the shard can have (and, by the parser, as soon as what is read is)."""
    limit = index_size_limit(shard.size, compressed)
    if sidecar.size > limit:
        raise IndexMismatchError(
            f"its record index {sidecar.url} has {sidecar.size} bytes, more than any index of "
            f"a shard of {shard.size} bytes can have ({limit}); {_rebuild(shard)}",
            url=shard.url,
        )
    parser = IndexParser(
        source=sidecar.url, stored_size=shard.size, compressed=compressed, keep=keep
    )
    try:
        for start in range(0, sidecar.size, _READ_BYTES):
            stop = min(start + _READ_BYTES, sidecar.size)

            async def read(start: int = start, stop: int = stop) -> bytes:
                return await store.read_range(sidecar, start, stop)

            describe = f"{sidecar.url}: reading bytes {start}-{stop}"
            data = await timing.metadata_read(retry.run(read, describe=describe, on_retry=on_retry))
            if len(data) != stop - start:
                raise _Resized(
                    f"{sidecar.url}: read {len(data)} of its bytes {start}-{stop} (of "
                    f"{sidecar.size})"
                )
            parser.feed(data)
            del data
        parser.finish()
    except FormatError as exc:
        raise IndexMismatchError(
            f"its record index does not fit it ({shard.size} bytes now): {exc.problem}; "
            f"{_rebuild(shard)}",
            url=shard.url,
        ) from exc
    return parser


async def _each_index(
    shards: Sequence[ObjectInfo],
    store_of: StoreOf,
    retry: RetryPolicy,
    use: Callable[[ShardIndex | int | None, Compression], T],
    *,
    keep: bool,
    compression: str | None,
    concurrency: int,
    on_retry: OnRetry | None,
) -> list[T]:
    """``use(index, codec)`` of each shard's index (``keep=False``: its record count; None:
    no sidecar, codec None: not looked at) and codec, ``concurrency`` at a time; each index
    is dropped once used."""
    sidecars = await find_indexes(
        shards, store_of, retry, concurrency=concurrency, on_retry=on_retry
    )
    gate = asyncio.Semaphore(concurrency)
    load = load_index if keep else count_index

    async def one(shard: ObjectInfo, sidecar: ObjectInfo | None) -> T:
        if sidecar is None:
            return use(None, None)
        async with gate:
            store = store_of(shard.url)
            codec = await shard_compression(shard, store, retry, compression, on_retry=on_retry)
            try:
                index = await load(
                    shard,
                    sidecar,
                    store_of(sidecar.url),
                    retry,
                    compressed=codec is not None,
                    on_retry=on_retry,
                )
            except ObjectNotFoundError:  # named by a manifest, removed since
                return use(None, None)
            except IndexMismatchError as exc:
                wrong = await stated_contradiction(shard, codec, store, retry, on_retry=on_retry)
                if wrong is not None:
                    raise wrong from exc
                raise
            return use(index, codec)

    return await run_all(one(s, i) for s, i in zip(shards, sidecars, strict=True))


async def load_indexes_and_codecs(
    shards: Sequence[ObjectInfo],
    store_of: StoreOf,
    retry: RetryPolicy,
    *,
    compression: str | None = "auto",
    concurrency: int = DEFAULT_CONCURRENCY,
    on_retry: OnRetry | None = None,
) -> list[tuple[ShardIndex, Compression] | None]:
    """Each shard's parsed index and the codec it is read with, None where it has no sidecar
    (see the module docstring); ``compression`` is the dataset's setting (``"auto"``, None,
    ``"gzip"``, ``"zlib"``)."""

    def kept(
        index: ShardIndex | int | None, codec: Compression
    ) -> tuple[ShardIndex, Compression] | None:
        assert not isinstance(index, int)
        return None if index is None else (index, codec)

    return await _each_index(
        shards,
        store_of,
        retry,
        kept,
        keep=True,
        compression=compression,
        concurrency=concurrency,
        on_retry=on_retry,
    )


async def record_counts(
    shards: Sequence[ObjectInfo],
    store_of: StoreOf,
    retry: RetryPolicy,
    *,
    compression: str | None = "auto",
    concurrency: int = DEFAULT_CONCURRENCY,
    on_retry: OnRetry | None = None,
) -> list[int | None]:
    """Each shard's record count where it is known without reading the shard: its manifest's
    (``ObjectInfo.records``), else its index sidecar's; None where neither is there."""
    counts: list[int | None] = [shard.records for shard in shards]
    todo = [k for k, count in enumerate(counts) if count is None]
    found = await _each_index(
        [shards[k] for k in todo],
        store_of,
        retry,
        lambda count, _: (
            None if count is None else len(count) if isinstance(count, ShardIndex) else count
        ),
        keep=False,
        compression=compression,
        concurrency=concurrency,
        on_retry=on_retry,
    )
    for k, count in zip(todo, found, strict=True):
        counts[k] = count
    return counts
