"""Transform chains and their plain-Python models, shared by the chain tests
(unit/test_chain.py, integration/test_chain_processes.py) and the child processes they start.

Every function here is module-level, so process workers and spawned DataLoader workers can
unpickle it.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import streamrec
from support.resume import write_shards

__all__ = [
    "CHAINS",
    "SIZES",
    "heavy",
    "keep",
    "key",
    "make_dataset",
    "model",
    "shards",
    "stop_and_save",
]

SIZES = [14, 9, 0, 21, 6, 17]  # 67 records; one empty shard


def shards(root: Path) -> list[str]:
    return write_shards(root, SIZES, compressed=frozenset({3}))


def make_dataset(files: list[str], **options: Any) -> streamrec.Dataset:
    # tiny blocks: many chunks, so items and batches cross chunk and shard boundaries
    options.setdefault("block_bytes", 200)
    return streamrec.open_dataset(files, **options)


def keep(record: bytes) -> bool:
    """The filter of the chains: about a third of the records."""
    return zlib.crc32(record) % 3 == 0


def tag(record: bytes) -> str:
    """The map of the chains (the record, readable and JSON-friendly)."""
    return record.decode()


def heavy(record: bytes) -> tuple[str, int]:
    """A map worth a worker: some CPU per record, and a result that names the record."""
    h = zlib.crc32(record)
    for _ in range(200):
        h = zlib.crc32(record, h)
    return record.decode(), h


def pair(batch: list[Any]) -> list[Any]:
    """A map on batches: the batch with its size in front."""
    return [len(batch), *batch]


def key(item: Any) -> Any:
    """Items made comparable (and JSON-friendly) for the tests."""
    if isinstance(item, bytes):
        return item.decode()
    if isinstance(item, (list, tuple)):
        return [key(x) for x in item]
    return item


#: name -> (the chain on a dataset, its model on the list of the dataset's records per epoch)
CHAINS: dict[
    str, tuple[Callable[[Any], Any], Callable[[Callable[[int], list[bytes]]], list[Any]]]
] = {
    "map": (lambda ds: ds.map(tag), lambda ep: [tag(r) for r in ep(0)]),
    "filter": (lambda ds: ds.filter(keep), lambda ep: [r for r in ep(0) if keep(r)]),
    "take": (lambda ds: ds.take(30), lambda ep: ep(0)[:30]),
    "skip": (lambda ds: ds.skip(12), lambda ep: ep(0)[12:]),
    "repeat": (lambda ds: ds.repeat(3), lambda ep: ep(0) + ep(1) + ep(2)),
    "unbatch": (lambda ds: ds.batch(5).unbatch(), lambda ep: ep(0)),
    "filter.map.batch": (
        lambda ds: ds.filter(keep).map(tag).batch(4),
        lambda ep: _batches([tag(r) for r in ep(0) if keep(r)], 4),
    ),
    "batch.map.unbatch": (
        lambda ds: ds.batch(6).map(pair).unbatch(),
        lambda ep: [x for b in _batches(ep(0), 6) for x in pair(b)],
    ),
    "repeat.take": (lambda ds: ds.repeat(2).take(100), lambda ep: (ep(0) + ep(1))[:100]),
    "skip.take": (lambda ds: ds.skip(10).take(25), lambda ep: ep(0)[10:35]),
    "repeat.batch": (lambda ds: ds.repeat(2).batch(8), lambda ep: _batches(ep(0) + ep(1), 8)),
    "repeat.batch.unbatch.skip": (
        lambda ds: ds.repeat(3).batch(7).unbatch().skip(3),
        lambda ep: (ep(0) + ep(1) + ep(2))[3:],
    ),
    "map.threads": (
        lambda ds: ds.map(tag, num_workers=2, task_items=3),
        lambda ep: [tag(r) for r in ep(0)],
    ),
}


def _batches(items: list[Any], n: int) -> list[list[Any]]:
    return [items[i : i + n] for i in range(0, len(items), n)]


def stop_and_save(pipe: Any, k: int) -> tuple[list[Any], dict[str, Any]]:
    """The first ``k`` items of ``pipe`` (plain ``for``), then its state (JSON round trip)."""
    head: list[Any] = []
    if k:
        for item in pipe:
            head.append(key(item))
            if len(head) == k:
                break
    return head, json.loads(json.dumps(pipe.state_dict()))


def model(name: str, files: list[str], **options: Any) -> list[Any]:
    """What the chain ``name`` yields, by its plain-Python model of the dataset's epochs."""

    def epoch(e: int) -> list[bytes]:
        ds = make_dataset(files, **options)
        ds.set_epoch(e)
        return list(ds)

    return [key(x) for x in CHAINS[name][1](epoch)]
