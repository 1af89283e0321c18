"""``streamrec cleanup``: abort what killed writers left unfinished under a url prefix."""

from __future__ import annotations

import argparse
import asyncio
import functools
import re
import time

from streamrec.cli.common import (
    EXIT_OK,
    Commands,
    add_command,
    add_common_arguments,
    print_json,
    retry_of,
)
from streamrec.storage.leftovers import Leftover, find_leftovers, remove_leftover
from streamrec.storage.registry import open_store

__all__ = ["parse_duration", "register"]

EPILOG = """\
What is found (nothing here is ever visible as an object):
  s3://     open multipart uploads under the prefix (invisible, but billed until aborted)
  local     streamrec's own hidden temporary files (.NAME.<12 hex>.tmp) under the prefix
  gs://     nothing: resumable upload sessions cannot be listed; GCS drops them after a week
  az://     blobs with staged (uncommitted) blocks and no committed content; their blocks are
            discarded (Azure itself drops uncommitted blocks after 7 days)

Only writes begun more than --older-than ago are touched (default 1h), so writers still at
work are left alone; `streamrec reshard` aborts the open uploads of the shards it is about to
write by itself.

examples:
  streamrec cleanup s3://bucket/out/ --dry-run
  streamrec cleanup out/ --older-than 0
  streamrec cleanup s3://bucket/ --older-than 2d --json

--json: {"leftovers": [{"url", "kind", "age_s", "handle"}], "removed": N, "dry_run": bool,
        "left_alone": N (younger than --older-than), "older_than_s": S}
exit status: 0 ok; 1 storage failed; 2 usage error
"""

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """argparse type: seconds from ``90``, ``90s``, ``30m``, ``1h`` or ``2d``."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*([smhd]?)\s*", text)
    if match is None:
        raise argparse.ArgumentTypeError(
            f"not a duration: {text!r} (a number with s, m, h or d, e.g. 30m)"
        )
    return float(match[1]) * _UNITS[match[2] or "s"]


def register(commands: Commands) -> None:
    """Add the ``cleanup`` subcommand."""
    parser = add_command(
        commands,
        "cleanup",
        summary="abort uploads and remove temporary files killed writers left behind",
        description=(
            "Find the unfinished writes under a url prefix that killed writers left behind "
            "(S3 multipart uploads, local temporary files) and abort or remove them."
        ),
        epilog=EPILOG,
    )
    parser.add_argument("prefix", metavar="URL_PREFIX", help="s3://bucket/prefix or a local path")
    add_common_arguments(parser, urls=False, compression=False)
    parser.add_argument(
        "--older-than",
        type=parse_duration,
        default=3600.0,
        metavar="DURATION",
        help="only writes begun longer ago than this (default: 1h; 0 for all)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="list what would be removed, remove nothing"
    )
    parser.set_defaults(run=run)


async def _cleanup(args: argparse.Namespace) -> tuple[list[Leftover], list[Leftover], int]:
    """The leftovers old enough to touch, those left alone (younger), and how many removed."""
    store, policy = open_store(args.prefix, args.storage_options), retry_of(args)
    try:
        listing = functools.partial(find_leftovers, store, args.prefix)
        if args.timeout is None:  # a listing may take many pages: no bound unless asked for
            everything = await listing()
        else:  # --timeout bounds the whole listing, each removal too
            describe = f"listing the unfinished writes under {args.prefix}"
            everything = await policy.run(listing, describe=describe)
        cutoff = time.time() - args.older_than
        found = [f for f in everything if f.started <= cutoff]
        younger = [f for f in everything if f.started > cutoff]
        removed = 0
        if not args.dry_run:
            for leftover in found:
                remove = functools.partial(remove_leftover, store, leftover)
                await policy.run(remove, describe=f"{leftover.url}: removing its {leftover.kind}")
                removed += 1
        return found, younger, removed
    finally:
        await store.close()


def _duration(seconds: float) -> str:
    """``3600.0`` -> ``"1h"``: the way ``--older-than`` is written."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def run(args: argparse.Namespace) -> int:
    """List (and unless --dry-run, remove) the leftovers under the prefix."""
    found, younger, removed = asyncio.run(_cleanup(args))
    if args.json:
        leftovers = [
            {"url": f.url, "kind": f.kind, "age_s": round(f.age_s(), 1), "handle": f.handle}
            for f in found
        ]
        print_json(
            {
                "leftovers": leftovers,
                "removed": removed,
                "dry_run": args.dry_run,
                "left_alone": len(younger),
                "older_than_s": args.older_than,
            }
        )
        return EXIT_OK
    verb = "would remove" if args.dry_run else "removed"
    for leftover in found:
        print(f"{verb}: {leftover.kind} of {leftover.url} ({leftover.age_s():,.0f} s old)")
    summary = f"{len(found)} leftover(s) found, {removed} removed"
    if younger:
        oldest = max(0.0, max(f.age_s() for f in younger))
        summary += (
            f"; {len(younger)} left alone, begun less than --older-than "
            f"{_duration(args.older_than)} ago (the oldest {oldest:,.0f} s ago): their writers "
            "may still be at work (--older-than 0 removes them too)"
        )
    print(summary)
    return EXIT_OK
