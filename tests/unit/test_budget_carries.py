"""What the prefetch budget keeps for a record the decoder has not completed (issue 29 E.24).

A reader keeps the bytes of the pieces it handed on reserved until the decoder asks for more,
minus nothing for the part of an incomplete record the decoder still holds
(``ObjectReader.carries``) - of an uncompressed shard only: a compressed shard's decoder holds
inflated bytes, not the reader's, and its pieces are dropped once inflated.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import fsspec
import pytest

import streamrec
from streamrec.format.shard import ShardEncoder

MIB = 1 << 20
KIB = 1 << 10


def _records() -> list[bytes]:
    # 4 MiB records that deflate to about half: an incomplete record inflated so far is
    # larger than the stored bytes handed on for it
    return [os.urandom(2 * MIB) + bytes(2 * MIB) for _ in range(3)]


@pytest.fixture(scope="module")
def gzip_shards() -> Iterator[tuple[str, str, list[bytes]]]:
    """The same gzip shard twice in memory://: named ``.gz``, and named as if plain (its
    compression found by sniffing its first bytes)."""
    root = f"/streamrec-budget-carries/{uuid.uuid4().hex}"
    fs = fsspec.filesystem("memory")
    records = _records()
    encoder = ShardEncoder("gzip")
    data = encoder.encode(records) + encoder.finish()
    fs.pipe(f"{root}/named.tfrecord.gz", data)
    fs.pipe(f"{root}/sniffed.tfrecord", data)
    fs.glob(f"{root}/*", detail=True)
    yield f"memory:/{root}/named.tfrecord.gz", f"memory:/{root}/sniffed.tfrecord", records
    fs.rm(root, recursive=True)


@pytest.mark.parametrize("which", [0, 1], ids=["named", "sniffed"])
def test_a_gzip_shard_keeps_no_inflated_record_in_the_budget(
    gzip_shards: tuple[str, str, list[bytes]], which: int
) -> None:
    # (found by a review: a gzip shard whose name does not say so was sniffed after the
    # decoder's reader was told to keep what the framing holds: the inflated part of each
    # record kept up to all of its stored bytes reserved, 2 MiB with a 1 MiB budget)
    url, records = gzip_shards[which], gzip_shards[2]
    block = 256 * KIB
    ds = streamrec.open_dataset(url, prefetch_bytes=MIB, block_bytes=block)
    assert list(ds) == records
    assert ds.stats.peak_prefetch_bytes <= MIB + block
