"""Which shards this consumer reads, in which order: shuffling by (seed, epoch) and splitting
across hosts and DataLoader workers.

Shards are split first across hosts (``shards[host_index::num_hosts]``), then across the
workers of each host. Where there are fewer shards than consumers, records are split instead:
every consumer reads the shards but keeps only every n-th record of each (by the record's
index in its shard, so the split holds in first-ready order too); a warning says so, because
every consumer then reads all of those bytes.

:func:`planned_records` says how many records a plan's consumer reads, given each shard's
record count (``len(ds)``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from streamrec.redact import redact, unsigned_name
from streamrec.storage.base import ObjectInfo

__all__ = [
    "ShardPlan",
    "dataloader_worker",
    "indexed_digest_v1",
    "ordinal",
    "plan_shards",
    "planned_records",
    "seeded_random",
    "shards_digest",
    "shards_digest_v2",
]


def shards_digest(shards: Sequence[ObjectInfo], *extra: object) -> str:
    """A short fingerprint of ``shards`` (names, sizes, versions) and of ``extra`` (how they
    are read): a resume state names it, so that it is never loaded over other shards.
    Signed urls are named without what signing adds (:func:`~streamrec.redact.unsigned_name`):
    a state taken through signed urls resumes through freshly signed ones of the same objects
    (the size and version still pin each object)."""
    return _digest(unsigned_name, shards, extra)


def shards_digest_v2(shards: Sequence[ObjectInfo], *extra: object) -> str:
    """The digest states named their shards by until 2026-11-27 (signed urls redacted but
    with their date and expiry): still accepted on resume, so that those states still load.
    The same as :func:`shards_digest` for urls that are not signed."""
    return _digest(redact, shards, extra)


def _digest(
    name_of: Callable[[str], str], shards: Sequence[ObjectInfo], extra: tuple[object, ...]
) -> str:
    described = [[[name_of(s.url), s.size, s.version] for s in shards], *extra]
    return hashlib.sha256(json.dumps(described).encode()).hexdigest()[:16]


def indexed_digest_v1(shards: Sequence[ObjectInfo], counts: Sequence[int]) -> str:
    """The digest the indexed engine's states named their shards by until 2026-11-24 03:51
    (``[[url, size, version, records], ...]``), before it became :func:`shards_digest` of
    ``(shards, counts)``: still accepted on resume, so that those states still load."""
    described = [[s.url, s.size, s.version, n] for s, n in zip(shards, counts, strict=True)]
    return hashlib.sha256(json.dumps(described).encode()).hexdigest()[:16]


S = TypeVar("S")
logger = logging.getLogger("streamrec")


def seeded_random(seed: int, epoch: int, purpose: str) -> random.Random:
    """A generator that gives the same numbers for the same arguments on every machine."""
    return random.Random(f"streamrec/{purpose}/{seed}/{epoch}")


@dataclass(frozen=True)
class ShardPlan(Generic[S]):
    """The shards one consumer reads, and which of their records it keeps.

    ``record_stride`` 1 keeps every record; n keeps the records whose index in their shard is
    ``record_offset`` modulo n.
    """

    shards: list[S]
    record_stride: int = 1
    record_offset: int = 0


def plan_shards(
    shards: Sequence[S],
    *,
    shuffle: bool = False,
    seed: int = 0,
    epoch: int = 0,
    num_hosts: int = 1,
    host_index: int = 0,
    num_workers: int = 1,
    worker_index: int = 0,
    quiet: bool = False,
) -> ShardPlan[S]:
    """The plan of consumer (``host_index``, ``worker_index``) for one epoch (``quiet``: no
    warning about splitting by record, for a plan made only to count)."""
    if not 0 <= host_index < num_hosts:
        raise ValueError(f"host_index must be in [0, {num_hosts}), not {host_index}")
    if not 0 <= worker_index < num_workers:
        raise ValueError(f"worker_index must be in [0, {num_workers}), not {worker_index}")
    order = list(shards)
    if shuffle:
        seeded_random(seed, epoch, "shards").shuffle(order)
    if len(order) < num_hosts:
        consumers = num_hosts * num_workers
        consumer = host_index * num_workers + worker_index
        if not quiet:
            _warn(len(order), consumers, "consumers (hosts x workers)")
        return ShardPlan(order, consumers, consumer)
    mine = order[host_index::num_hosts]
    if len(mine) < num_workers:
        if not quiet:
            _warn(len(mine), num_workers, "workers on this host")
        return ShardPlan(mine, num_workers, worker_index)
    return ShardPlan(mine[worker_index::num_workers])


def _warn(shards: int, consumers: int, who: str) -> None:
    logger.warning(
        "%d shard(s) for %d %s: splitting by record instead (each reads every shard and keeps "
        "every %s record); write more shards to avoid the extra reading",
        shards,
        consumers,
        who,
        ordinal(consumers),
    )


def ordinal(n: int) -> str:
    """``n`` as an English ordinal: 1st, 2nd, 3rd, 4th, 11th, 12th, 13th, 21st, 102nd."""
    suffix = "th" if n % 100 in (11, 12, 13) else _SUFFIXES.get(n % 10, "th")
    return f"{n}{suffix}"


_SUFFIXES = {1: "st", 2: "nd", 3: "rd"}


def planned_records(plan: ShardPlan[S], count: Callable[[S], int]) -> int:
    """How many records the consumer of ``plan`` reads in its epoch, ``count(shard)`` being
    each shard's record count: all of them, or with a record stride n, those whose index in
    their shard is ``record_offset`` modulo n."""
    stride, offset = plan.record_stride, plan.record_offset
    total = 0
    for shard in plan.shards:
        records = count(shard)
        total += records if stride == 1 else max(0, -(-(records - offset) // stride))
    return total


def dataloader_worker() -> tuple[int, int]:
    """``(num_workers, worker_id)`` inside a PyTorch DataLoader worker, else ``(1, 0)``; torch
    is only consulted when the process has already imported it."""
    torch = sys.modules.get("torch")
    if torch is None:
        return 1, 0
    info = torch.utils.data.get_worker_info()
    if info is None:
        return 1, 0
    return int(info.num_workers), int(info.id)
