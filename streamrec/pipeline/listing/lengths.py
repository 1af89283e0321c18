"""How many records a dataset holds without reading its shards: ``len(ds)``, ``ds.num_records``.

Every shard the urls stand for is listed as the reader lists it
(:func:`~streamrec.pipeline.listing.urls.list_shards`), and its record count taken from
its manifest, else from the dataset index
(:mod:`~streamrec.pipeline.listing.dataset_index`), else from its index sidecar
(:func:`~streamrec.pipeline.listing.sidecars.record_counts`). :class:`ShardCounts` keeps them: they
do not depend on the epoch or on the split. From them, :func:`count_for` makes the plan the reader
would make for this consumer and epoch (the shuffle, the host split, the DataLoader worker split,
shard- or record-level: :func:`~streamrec.pipeline.listing.plan.plan_shards`) and counts what it
reads (:func:`~streamrec.pipeline.listing.plan.planned_records`).

A shard with neither a manifest count nor a sidecar, or with a sidecar that does not fit it,
is a :class:`~streamrec.errors.RecordCountUnknownError` (a ``TypeError``, as ``len()``
requires) naming a shard and the ``streamrec index`` command that indexes them. That outcome
is kept as well (until the dataset is opened again): ``list(ds)`` asks ``len(ds)`` first, and
must not look every shard's sidecar up again each time. Storage errors are not kept.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from streamrec.errors import IndexMismatchError, RecordCountUnknownError
from streamrec.pipeline.listing.dataset_index import load_dataset_index
from streamrec.pipeline.listing.plan import dataloader_worker, plan_shards, planned_records
from streamrec.pipeline.listing.sidecars import record_counts
from streamrec.pipeline.listing.urls import list_shards
from streamrec.pipeline.options import ReadOptions
from streamrec.pipeline.order import part_of
from streamrec.pipeline.stats import Stats
from streamrec.redact import redact
from streamrec.storage.registry import ObjectInfo, StoreSet
from streamrec.storage.timing import recorded

__all__ = [
    "RecordCounts",
    "ShardCounts",
    "count_for",
    "counts_key",
    "index_command",
    "list_counts",
]


@dataclass(frozen=True)
class RecordCounts:
    """How many records a dataset holds (``Dataset.count_records()``)."""

    total: int
    """Records of every shard its urls stand for, before any host or worker split
    (``ds.num_records``)."""
    consumer: int
    """Records this consumer reads in the dataset's current epoch, after the host split and
    the DataLoader worker split (``len(ds)``)."""


@dataclass(frozen=True)
class ShardCounts:
    """Each listed shard's record count, in listing order, and what they were listed for; or
    why they are not all known (kept too: ``list(ds)`` asks for a length every time)."""

    key: tuple[object, ...]
    """The settings the listing depends on (urls, compression, allow_absolute_urls)."""
    counts: tuple[int, ...]
    unknown: str | None = None
    """Why some count is not known (the message of RecordCountUnknownError), or None."""
    shards: tuple[ObjectInfo, ...] = ()
    """The shards listed, in listing order (random access numbers their records without
    listing them again: :mod:`streamrec.pipeline.indexed.lookup`)."""


def counts_key(urls: Sequence[str], options: ReadOptions) -> tuple[object, ...]:
    """What a listing's counts depend on (nothing of the epoch or the split)."""
    return (tuple(urls), options.compression, options.allow_absolute_urls)


async def list_counts(urls: Sequence[str], options: ReadOptions, stats: Stats) -> ShardCounts:
    """Every shard's record count, without reading the shards (see the module docstring), or
    why they are not all known (``unknown``); its requests counted in ``stats``."""
    return await recorded(stats, _list_counts(urls, options, stats))


async def _list_counts(urls: Sequence[str], options: ReadOptions, stats: Stats) -> ShardCounts:
    key = counts_key(urls, options)
    async with StoreSet(
        options.storage_options, lookup_reads_first_bytes=options.cache_dir is None
    ) as stores:
        shards = await list_shards(urls, options, stores.get, stats)
        try:
            source = None
            if any(shard.records is None for shard in shards):  # one dataset index, else
                source = await load_dataset_index(shards, stores.get, options, stats)
            if source is not None:
                return ShardCounts(key, tuple(source.counts), shards=tuple(shards))
            found = await record_counts(
                shards,
                stores.get,
                options.retry,
                compression=options.compression,
                on_retry=lambda _: _count_retry(stats),
            )
        except IndexMismatchError as exc:
            return ShardCounts(key, (), f"{exc} (its record count is unknown)", tuple(shards))
    unknown = [shard.url for shard, count in zip(shards, found, strict=True) if count is None]
    if unknown:
        return ShardCounts(
            key,
            (),
            f"the record count of {len(unknown)} of {len(shards)} shards is not known without "
            f"reading them: no manifest lists them and they have no index sidecar (e.g. "
            f"{redact(unknown[0])}); index them once with `{index_command(urls)}` and open the "
            "dataset again",
            tuple(shards),
        )
    return ShardCounts(key, tuple(c for c in found if c is not None), shards=tuple(shards))


def index_command(urls: Sequence[str]) -> str:
    """The ``streamrec index`` command line that indexes the shards ``urls`` stand for."""
    return " ".join(["streamrec index", *(shlex.quote(redact(url)) for url in urls)])


def _count_retry(stats: Stats) -> None:
    stats.retries += 1


def count_for(counts: ShardCounts, options: ReadOptions, epoch: int) -> RecordCounts:
    """The totals, and what this consumer (host, DataLoader worker) reads in ``epoch``;
    RecordCountUnknownError when they are not known."""
    if counts.unknown is not None:
        raise RecordCountUnknownError(counts.unknown)
    num_workers, worker_index = dataloader_worker()
    total = sum(counts.counts)
    if options.indexed:  # contiguous parts of the epoch's positions (pipeline/order.py)
        consumers = options.num_hosts * num_workers
        consumer = options.host_index * num_workers + worker_index
        whole = [(0, total)] if total else []
        return RecordCounts(total, part_of(whole, consumers, consumer, options.even_mode).length)
    plan = plan_shards(
        range(len(counts.counts)),  # the plan only permutes and slices: indices plan alike
        shuffle=options.shuffle_shards,
        seed=options.seed,
        epoch=epoch,
        num_hosts=options.num_hosts,
        host_index=options.host_index,
        num_workers=num_workers,
        worker_index=worker_index,
        quiet=True,
    )
    return RecordCounts(total, planned_records(plan, counts.counts.__getitem__))
