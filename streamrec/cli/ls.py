"""``streamrec ls``: the shards a set of urls names, with sizes and compression."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from streamrec.cli.common import (
    EXIT_OK,
    Commands,
    add_command,
    add_common_arguments,
    human_bytes,
    map_bounded,
    positive_int,
    print_json,
    read_options_of,
)
from streamrec.pipeline.stream.scan import ShardScan
from streamrec.storage.registry import ObjectInfo

__all__ = ["register"]

EPILOG = """\
output: one line per shard (size in bytes, compression, url), then a total line.
Compression is taken from the name (.gz/.gzip, .zlib/.zz), else from the manifest, else
sniffed from the first bytes.

examples:
  streamrec ls 'data/train-*.tfrecord'
  streamrec ls 's3://bucket/train/*.tfrecord' --storage-options '{"anon": true}'
  streamrec ls 'gs://bucket/train-*.tfrecord.gz' --json | jq '.total_bytes'

--json: {"shards": [{"url", "size", "compression", "version"}], "num_shards", "total_bytes"}
exit status: 0 ok; 1 nothing matched or storage failed; 2 usage error
"""


def register(commands: Commands) -> None:
    """Add the ``ls`` subcommand."""
    parser = add_command(
        commands,
        "ls",
        summary="list shards with their sizes and compression",
        description=(
            "List the TFRecord shards that paths, globs or urls name: size, compression and "
            "url of each, in reading order, and the total."
        ),
        epilog=EPILOG,
    )
    add_common_arguments(parser, compression=False)
    parser.add_argument(
        "--jobs",
        type=positive_int,
        default=8,
        metavar="N",
        help="objects sniffed at once (default: 8)",
    )
    parser.set_defaults(run=run)


async def _list(args: argparse.Namespace) -> list[tuple[ObjectInfo, str]]:
    async with ShardScan(read_options_of(args)) as scan:
        shards = await scan.list_shards(args.urls)

        async def describe(shard: ObjectInfo) -> tuple[ObjectInfo, str]:
            return shard, await scan.compression(shard) or "none"

        return await map_bounded(shards, args.jobs, describe)


def run(args: argparse.Namespace) -> int:
    """List the shards; print them as text or JSON."""
    found = asyncio.run(_list(args))
    total = sum(shard.size for shard, _ in found)
    if args.json:
        shards: list[dict[str, Any]] = [
            {"url": s.url, "size": s.size, "compression": codec, "version": s.version}
            for s, codec in found
        ]
        print_json({"shards": shards, "num_shards": len(found), "total_bytes": total})
        return EXIT_OK
    for shard, codec in found:
        print(f"{shard.size:>15,}  {codec:<5}  {shard.url}")
    plural = "" if len(found) == 1 else "s"
    print(f"{total:>15,}  total  ({len(found)} shard{plural}, {human_bytes(total)})")
    return EXIT_OK
