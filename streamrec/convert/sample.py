"""A sample of records spread over a whole dataset, for inferring its spec.

Where every shard's record count is known (manifests, the dataset index, index sidecars),
:func:`sample_records` draws positions uniformly over all records
(:func:`~streamrec.format.example.infer.sample_positions`) and reads them by index
(``Dataset.aget``), or, without index sidecars, reads each shard holding a drawn position up to
its last one. Where counts are not known it takes the first records of every shard, or of
shards evenly spread over the listing when there are more shards than records wanted
(:func:`~streamrec.format.example.infer.shard_quotas`): never just the first shard's prefix.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from contextlib import aclosing
from dataclasses import dataclass

from streamrec.errors import FormatError, RandomAccessUnavailableError
from streamrec.format.example.infer import sample_positions, shard_quotas
from streamrec.pipeline.dataset import Dataset
from streamrec.pipeline.listing.lengths import list_counts
from streamrec.pipeline.options import ReadOptions
from streamrec.pipeline.stats import Stats
from streamrec.pipeline.stream.scan import ShardScan
from streamrec.storage.base import ObjectInfo

__all__ = ["Sample", "sample_records"]


@dataclass
class Sample:
    """The records sampled and where they came from."""

    payloads: list[bytes]
    shards_sampled: int
    """Shards at least one sampled record came from."""
    shards_listed: int
    total: int | None
    """Records in the whole dataset, when every shard's count is known."""
    how: str
    """``"positions"`` (uniform over all records) or ``"per-shard"`` (counts unknown)."""


async def sample_records(
    urls: Sequence[str], options: ReadOptions, n: int, seed: int = 0
) -> Sample:
    """About ``n`` records spread over all the shards ``urls`` stand for (every record when
    the dataset has no more than ``n``)."""
    counts = await list_counts(urls, options, Stats())
    shards = list(counts.shards)
    if counts.unknown is None and len(counts.counts) == len(shards):
        starts = list(itertools.accumulate(counts.counts, initial=0))
        positions = sample_positions(starts[-1], n, seed)
        try:
            payloads = await Dataset(list(urls), options).aget(positions)
        except RandomAccessUnavailableError:
            payloads = await _read_positions(options, shards, starts, positions)
        sampled = len({bisect.bisect_right(starts, p) - 1 for p in positions})
        return Sample(payloads, sampled, len(shards), starts[-1], "positions")
    payloads, sampled = [], 0
    async with ShardScan(options) as scan:
        for shard_number, quota in shard_quotas(len(shards), n):
            taken = await _first_records(scan, shards[shard_number], quota)
            payloads += taken
            sampled += 1 if taken else 0
    return Sample(payloads, sampled, len(shards), None, "per-shard")


async def _first_records(scan: ShardScan, shard: ObjectInfo, quota: int) -> list[bytes]:
    """The first ``quota`` records of ``shard`` (fewer when it holds fewer)."""
    taken: list[bytes] = []
    async with aclosing(scan.shard(shard).chunks()) as chunks:
        async for chunk in chunks:
            taken += chunk[: quota - len(taken)]
            if len(taken) >= quota:
                break
    return taken


async def _read_positions(
    options: ReadOptions, shards: list[ObjectInfo], starts: list[int], positions: list[int]
) -> list[bytes]:
    """The records at ``positions`` (sorted), each shard read up to its last wanted record."""
    wanted: dict[int, list[int]] = {}
    for position in positions:
        shard = bisect.bisect_right(starts, position) - 1
        wanted.setdefault(shard, []).append(position - starts[shard])
    payloads: list[bytes] = []
    async with ShardScan(options) as scan:
        for shard, indices in sorted(wanted.items()):
            prefix = await _first_records(scan, shards[shard], indices[-1] + 1)
            if len(prefix) <= indices[-1]:
                stated = starts[shard + 1] - starts[shard]
                raise FormatError(
                    f"its stated record count is {stated} but it holds {len(prefix)} records",
                    url=shards[shard].url,
                    record_index=len(prefix),
                )
            payloads += [prefix[i] for i in indices]
    return payloads
