"""The subcommands read through the pipeline's parts (:mod:`streamrec.pipeline.stream.scan`): the
``--prefetch-bytes`` budget (``open_dataset``'s default), the listing and codec choice of
``open_dataset``, records located by shard and offset."""

from __future__ import annotations

import asyncio
import inspect
from contextlib import aclosing
from pathlib import Path

import pytest

import streamrec
from streamrec.cli import build_parser, main
from streamrec.cli.common import map_bounded, read_options_of
from streamrec.format.framing import FOOTER_BYTES, HEADER_BYTES
from streamrec.pipeline.options import ReadOptions
from streamrec.pipeline.stream.scan import ShardScan

READING_COMMANDS = ["count", "verify", "head", "inspect", "index"]


def write_shards(root: Path, shards: int, records: int, size: int) -> list[Path]:
    paths = []
    for n in range(shards):
        path = root / f"part-{n}.tfrecord"
        with streamrec.sync.open_writer(str(path)) as writer:
            for i in range(records):
                writer.write(bytes([n, i % 256]) * (size // 2))
        paths.append(path)
    return paths


@pytest.mark.parametrize("command", READING_COMMANDS)
def test_prefetch_bytes_defaults_to_open_datasets_and_takes_units(command: str) -> None:
    default = inspect.signature(streamrec.open_dataset).parameters["prefetch_bytes"].default
    args = build_parser().parse_args([command, "x.tfrecord"])
    assert args.prefetch_bytes == default
    assert read_options_of(args).prefetch_bytes == default
    args = build_parser().parse_args([command, "x.tfrecord", "--prefetch-bytes", "256KiB"])
    assert read_options_of(args).prefetch_bytes == 256 << 10


def test_options_reach_the_reads() -> None:
    args = build_parser().parse_args(
        ["count", "x", "--prefetch-bytes", "3MiB", "--timeout", "7", "--compression", "none"]
    )
    options = read_options_of(args, "skip")
    assert (options.prefetch_bytes, options.retry.timeout_s) == (3 << 20, 7)
    assert (options.compression, options.on_corrupt) == (None, "skip")
    assert ShardScan(options).budget.limit == 3 << 20


def test_shards_read_side_by_side_stay_in_the_budget(tmp_path: Path) -> None:
    shards = write_shards(tmp_path, shards=4, records=64, size=16 << 10)  # ~1 MiB each
    limit, block = 128 << 10, 32 << 10
    options = ReadOptions(prefetch_bytes=limit, block_bytes=block)

    async def count() -> tuple[list[int], int]:
        async with ShardScan(options) as scan:
            listed = await scan.list_shards([str(tmp_path / "*.tfrecord")])
            assert [s.url for s in listed] == [str(p) for p in shards]
            counts = await map_bounded(listed, 4, lambda s: scan.shard(s).count())
            return counts, scan.budget.peak

    counts, peak = asyncio.run(count())
    assert counts == [64] * 4
    # the limit, and at most one block over it per shard read at once (ByteBudget)
    assert 0 < peak <= limit + 4 * block


def test_located_records_name_their_shard_index_and_offset(tmp_path: Path) -> None:
    write_shards(tmp_path, shards=2, records=3, size=10)

    async def located() -> list[tuple[str, int, int, bytes]]:
        async with ShardScan(ReadOptions()) as scan:
            listed = await scan.list_shards([str(tmp_path)])
            async with aclosing(scan.located(listed)) as records:
                return [(s.url.rsplit("/", 1)[1], i, at, p) async for s, i, at, p in records]

    step = HEADER_BYTES + 10 + FOOTER_BYTES
    assert asyncio.run(located()) == [
        (f"part-{n}.tfrecord", i, i * step, bytes([n, i]) * 5) for n in range(2) for i in range(3)
    ]


def test_count_with_a_small_budget_prints_the_same(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_shards(tmp_path, shards=3, records=40, size=8 << 10)
    glob = str(tmp_path / "*.tfrecord")
    assert main(["count", glob]) == 0
    default = capsys.readouterr().out
    assert main(["count", glob, "--prefetch-bytes", "64KiB", "--jobs", "3"]) == 0
    assert capsys.readouterr().out == default
    assert default.splitlines()[-1].split() == ["120", "total"]
