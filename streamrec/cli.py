"""The ``streamrec`` command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import streamrec
from streamrec.errors import StreamrecError
from streamrec.format.framing import OnCorrupt

__all__ = ["main"]


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="streamrec",
        description=(
            "Stream TFRecord shards between training jobs and storage, without TensorFlow. "
            "Every record's CRCs are verified."
        ),
    )
    parser.add_argument("--version", action="version", version=f"streamrec {streamrec.__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    count = commands.add_parser(
        "count",
        help="count the records of TFRecord files, verifying every CRC",
        description=(
            "Read TFRecord files (paths or globs, GZIP/ZLIB detected automatically), verify "
            "every record's CRCs and print the number of records per file and in total."
        ),
    )
    count.add_argument("paths", nargs="+", metavar="PATH", help="file, glob or directory/*")
    count.add_argument(
        "--compression",
        default="auto",
        choices=["auto", "none", "gzip", "zlib"],
        help="codec of the files (default: auto, from the suffix or the first bytes)",
    )
    count.add_argument(
        "--skip-corrupt",
        action="store_true",
        help="drop damaged records (logged) instead of stopping at the first one",
    )
    return parser


def _count(args: argparse.Namespace) -> int:
    import asyncio

    compression = None if args.compression == "none" else args.compression
    on_corrupt: OnCorrupt = "skip" if args.skip_corrupt else "raise"

    async def run() -> int:
        total = 0
        probe = streamrec.open_dataset(args.paths, compression=compression)
        for shard in await probe.shards():
            ds = streamrec.open_dataset(shard.url, compression=compression, on_corrupt=on_corrupt)
            n = 0
            async for chunk in ds.record_chunks():
                n += len(chunk)
            skipped = ds.stats.corrupt_skipped
            note = f"  ({skipped} corrupt skipped)" if skipped else ""
            print(f"{n:>12,}  {shard.url}{note}")
            total += n
        print(f"{total:>12,}  total")
        return 0

    return asyncio.run(run())


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``streamrec`` console script."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    try:
        return _count(args)
    except StreamrecError as exc:
        print(f"streamrec: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
