"""``streamrec count`` and ``streamrec verify``: read whole shards concurrently, check every CRC."""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import dataclass, field
from typing import Any

from streamrec.cli.common import (
    EXIT_DATA_ERROR,
    EXIT_OK,
    Commands,
    Progress,
    add_command,
    add_common_arguments,
    add_prefetch_argument,
    cli_text,
    error,
    map_bounded,
    positive_int,
    print_json,
    read_options_of,
)
from streamrec.errors import CorruptRecordError, FormatError, StreamrecError
from streamrec.format.framing import OnCorrupt
from streamrec.pipeline.stream.scan import ShardScan
from streamrec.storage.registry import ObjectInfo

__all__ = ["ShardResult", "register", "run_count", "run_verify", "scan_shards"]

COUNT_EPILOG = """\
output: records per shard (in reading order), then the total. Shards are read concurrently
(--jobs at a time) and every record's length and payload CRCs are checked.

examples:
  streamrec count 'data/train-*.tfrecord'
  streamrec count 'data/*.tfrecord.gz' --skip-corrupt
  streamrec count 's3://bucket/train-*' --storage-options \\
      '{"client_kwargs": {"endpoint_url": "http://127.0.0.1:9000"}, "key": "..", "secret": ".."}'
  streamrec count 'gs://bucket/train-*' --json | jq .total_records

--json: {"shards": [{"url", "size", "compression", "records", "corrupt_skipped", "error"}],
         "num_shards", "total_records", "total_bytes", "complete"}
exit status: 0 ok; 1 damaged data (without --skip-corrupt) or a missing/unreadable object,
the counts of damaged shards are then the good records before the damage; 2 usage error
"""

VERIFY_EPILOG = """\
Every record of every shard is read and both its CRCs are checked. Reading goes on after
damage: a record with a bad payload CRC is reported and skipped; damage that breaks the
framing (bad length CRC, truncated record, broken gzip/zlib stream) is reported and the rest
of that shard cannot be read. Each problem is listed with the url, the record's index in its
shard and the byte offset of its 12-byte header (in the uncompressed stream for .gz/.zlib).

output: one line per shard (OK / BAD / ERROR), each problem under its shard, a summary line.

examples:
  streamrec verify 'data/train-*.tfrecord'
  streamrec verify 'gs://bucket/train-*.tfrecord.gz' --json | jq '.problems[]'

--json: {"ok", "num_shards", "good_records", "bad_shards", "problems": [{"url",
         "record_index", "offset", "type", "problem", "rest_unreadable", "message"}],
         "shards": [{"url", "size", "compression", "good_records", "problems"}]}
exit status: 0 every CRC matched; 1 any damage or an unreadable object; 2 usage error
"""


def register(commands: Commands) -> None:
    """Add the ``count`` and ``verify`` subcommands."""
    count = add_command(
        commands,
        "count",
        summary="count the records of TFRecord shards, verifying every CRC",
        description=(
            "Count the records of TFRecord shards (paths, globs or urls; GZIP/ZLIB detected "
            "automatically), verifying every record's CRCs, per shard and in total."
        ),
        epilog=COUNT_EPILOG,
    )
    add_common_arguments(count)
    count.add_argument(
        "--skip-corrupt",
        action="store_true",
        help="skip damaged records (and count them) instead of stopping the shard there",
    )
    _add_jobs(count)
    count.set_defaults(run=run_count)

    verify = add_command(
        commands,
        "verify",
        summary="check every CRC and list each damaged record with its offset",
        description=(
            "Check every record of TFRecord shards and report each damaged one with its "
            "url, record index and byte offset; exit status 1 if anything is damaged."
        ),
        epilog=VERIFY_EPILOG,
    )
    add_common_arguments(verify)
    _add_jobs(verify)
    verify.set_defaults(run=run_verify)


def _add_jobs(parser: argparse.ArgumentParser) -> None:
    add_prefetch_argument(parser)
    parser.add_argument(
        "--jobs",
        type=positive_int,
        default=8,
        metavar="N",
        help="shards read at once (default: 8)",
    )


@dataclass
class ShardResult:
    """What reading one shard found.

    ``records`` counts good records; ``dropped`` the damage skipped (verify, --skip-corrupt);
    ``error`` what stopped the shard early (damage in raise mode, or a storage error).
    """

    shard: ObjectInfo
    records: int = 0
    compression: str = "none"
    dropped: list[FormatError] = field(default_factory=list)
    error: StreamrecError | None = None

    @property
    def problems(self) -> list[StreamrecError]:
        """Everything wrong with the shard, in file order."""
        return [*self.dropped, *([self.error] if self.error is not None else [])]


async def scan_shards(args: argparse.Namespace, on_corrupt: OnCorrupt) -> list[ShardResult]:
    """Read every shard the urls name, ``args.jobs`` at a time; results in shard order."""
    async with ShardScan(read_options_of(args, on_corrupt)) as scan:
        shards = await scan.list_shards(args.urls)
        total = sum(shard.size for shard in shards)
        with Progress(args, total=total, unit="B", desc=args.command) as bar:

            async def one(shard: ObjectInfo) -> ShardResult:
                reader = scan.shard(shard, on_bytes=bar.update)
                result = ShardResult(shard)
                try:
                    await reader.count()
                except StreamrecError as exc:
                    result.error = exc
                result.records = reader.records
                result.compression = reader.decoder.compression or "none"
                result.dropped = list(reader.decoder.dropped)
                return result

            return await map_bounded(shards, args.jobs, one)


# ------------------------------------------------------------------------------------ count


def run_count(args: argparse.Namespace) -> int:
    """Count records per shard and in total."""
    on_corrupt: OnCorrupt = "skip" if args.skip_corrupt else "raise"
    results = asyncio.run(scan_shards(args, on_corrupt))
    failed = [r for r in results if r.error is not None]
    total = sum(r.records for r in results)
    if args.json:
        print_json(_count_document(results, total))
    else:
        _print_counts(results, total, complete=not failed)
    for result in failed:
        error(result.error)
    return EXIT_DATA_ERROR if failed else EXIT_OK


def _count_document(results: list[ShardResult], total: int) -> dict[str, Any]:
    shards = [
        {
            "url": r.shard.url,
            "size": r.shard.size,
            "compression": r.compression,
            "records": r.records,
            "corrupt_skipped": len(r.dropped),
            "error": None if r.error is None else cli_text(r.error),
        }
        for r in results
    ]
    return {
        "shards": shards,
        "num_shards": len(results),
        "total_records": total,
        "total_bytes": sum(r.shard.size for r in results),
        "complete": all(r.error is None for r in results),
    }


def _print_counts(results: list[ShardResult], total: int, *, complete: bool) -> None:
    for result in results:
        note = ""
        if result.dropped:
            note = f"  ({len(result.dropped)} corrupt skipped)"
        if result.error is not None:
            note += "  (incomplete: damaged or unreadable, see below)"
        print(f"{result.records:>12,}  {result.shard.url}{note}")
    print(f"{total:>12,}  total" + ("" if complete else "  (incomplete)"))


# ----------------------------------------------------------------------------------- verify


def run_verify(args: argparse.Namespace) -> int:
    """Check every record of every shard; list each problem."""
    results = asyncio.run(scan_shards(args, "skip"))
    if args.json:
        print_json(_verify_document(results))
    else:
        _print_verify(results)
    return EXIT_DATA_ERROR if any(r.problems for r in results) else EXIT_OK


def _rest_unreadable(problem: StreamrecError) -> bool:
    """True when the problem ends the shard (only a bad payload CRC lets reading go on)."""
    return not (isinstance(problem, CorruptRecordError) and problem.which == "payload")


def _problem_document(result: ShardResult, problem: StreamrecError) -> dict[str, Any]:
    located = problem if isinstance(problem, FormatError) else None
    return {
        "url": result.shard.url,
        "record_index": located.record_index if located else None,
        "offset": located.offset if located else None,
        "type": type(problem).__name__,
        "problem": cli_text(located.problem if located else problem),
        "rest_unreadable": _rest_unreadable(problem),
        "message": cli_text(problem),
    }


def _verify_document(results: list[ShardResult]) -> dict[str, Any]:
    problems = [_problem_document(r, p) for r in results for p in r.problems]
    shards = [
        {
            "url": r.shard.url,
            "size": r.shard.size,
            "compression": r.compression,
            "good_records": r.records,
            "problems": len(r.problems),
        }
        for r in results
    ]
    return {
        "ok": not problems,
        "num_shards": len(results),
        "good_records": sum(r.records for r in results),
        "bad_shards": sum(1 for r in results if r.problems),
        "problems": problems,
        "shards": shards,
    }


def _print_verify(results: list[ShardResult]) -> None:
    for result in results:
        problems = result.problems
        url = result.shard.url
        if not problems:
            print(f"OK     {result.records:>10,} records  {url}")
            continue
        damaged = result.error is None or isinstance(result.error, FormatError)
        status = "BAD  " if damaged else "ERROR"
        found = f"{len(problems)} problem{'' if len(problems) == 1 else 's'}"
        print(f"{status}  {result.records:>10,} good records, {found}  {url}")
        for problem in problems:
            rest = "; the rest of the shard cannot be read" if _rest_unreadable(problem) else ""
            print(f"         {cli_text(problem)}{rest}")
    print(_verify_summary(results))


def _verify_summary(results: list[ShardResult]) -> str:
    good = sum(r.records for r in results)
    bad_shards = sum(1 for r in results if r.problems)
    problems = sum(len(r.problems) for r in results)
    shards = f"{len(results)} shard{'' if len(results) == 1 else 's'}"
    if not problems:
        return f"all CRCs OK: {good:,} records in {shards}"
    return (
        f"DAMAGED: {problems} problem{'' if problems == 1 else 's'} in {bad_shards} of "
        f"{shards}; {good:,} good records"
    )
