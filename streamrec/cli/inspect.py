"""``streamrec inspect``: what the features of a sample of records look like, and a spec."""

from __future__ import annotations

import argparse
import asyncio
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from streamrec.cli.common import (
    EXIT_OK,
    Commands,
    Progress,
    add_command,
    add_common_arguments,
    add_prefetch_argument,
    display_width,
    non_negative_int,
    pad,
    plural,
    print_json,
    read_options_of,
)
from streamrec.errors import ExampleError
from streamrec.format.inspect import FeatureStats, Inspector, spec_source
from streamrec.pipeline.stream.scan import ShardScan

__all__ = ["register", "run"]

EPILOG = """\
output: for each feature of the sampled records (the first N in reading order): its kind
(bytes / float / int64), in how many records it appears, values per record (min..max and
mean when they vary), the size of bytes values, and a suggested spec entry; then a spec to
paste into code for streamrec.example.decode / decode_batch:

  FixedLenFeature(np.int64)            one value in every record
  FixedLenFeature(np.float32, (4,))    always 4 values
  FixedLenFeature(bytes)               one (text) bytes value in every record
  RawFeature(np.uint8, (3072,))        one bytes value of a fixed size (an encoded array:
                                       put the dtype and shape it was written with)
  VarLenFeature(np.int64)              counts vary, or the feature is missing in some records

SequenceExamples are shown as context features (same rules) and feature_lists (steps per
record and values per step; read them with streamrec.example.decode_sequence). A suggestion
is only as good as the sample, which the output describes: raise -n (--sample) to see more
records, or read every one with --all.

examples:
  streamrec inspect 'data/train-*.tfrecord'
  streamrec inspect -n 10000 's3://bucket/train-*.tfrecord.gz'
  streamrec inspect --json data/train-00000.tfrecord | jq .spec

--json: {"records", "kinds", "payload_bytes", "features": [{"section", "name", "kind",
         "kinds", "records", "of_records", "values", "steps", "value_bytes", "spec", "note"}],
         "spec": {name: spec}, "shards_sampled", "shards_listed", "complete"}   (values etc.
         are {"min", "max", "mean"}; shards_sampled counts the shards read, empty ones
         included; complete: every record was sampled)
exit status: 0 ok; 1 damaged data or a missing object; 2 usage error
"""

_SECTION_TITLES = {
    "features": "Example features",
    "context": "SequenceExample context",
    "feature_lists": "SequenceExample feature_lists",
}


def register(commands: Commands) -> None:
    """Add the ``inspect`` subcommand."""
    parser = add_command(
        commands,
        "inspect",
        summary="summarise the features of a sample and suggest a feature spec",
        description=(
            "Read a sample of records and describe their features (kinds, value counts, "
            "byte sizes), with the feature spec that decodes them."
        ),
        epilog=EPILOG,
    )
    add_common_arguments(parser)
    add_prefetch_argument(parser)
    how_many = parser.add_mutually_exclusive_group()
    how_many.add_argument(
        "-n",
        "--sample",
        type=non_negative_int,
        default=1000,
        metavar="N",
        help="how many records to sample, the first in reading order (default: 1000)",
    )
    how_many.add_argument(
        "--all",
        action="store_true",
        help="read every record: a spec that fits all of them (a FixedLenFeature is only safe "
        "for a feature present in every record)",
    )
    parser.add_argument(
        "--kind",
        choices=["auto", "example", "sequence_example"],
        default="auto",
        help="payload type (default: auto, guessed per record)",
    )
    parser.set_defaults(run=run)


@dataclass
class _Coverage:
    """What the sample covered: shards read and listed, and whether records were left."""

    shards_read: int = 0
    shards_listed: int = 0
    complete: bool = True  # every record of every listed shard was sampled


async def _sample(args: argparse.Namespace, inspector: Inspector) -> _Coverage:
    """Feed the first ``args.sample`` records (every one with ``--all``) to ``inspector``."""
    limit = None if args.all else args.sample
    async with ShardScan(read_options_of(args)) as scan:
        shards = await scan.list_shards(args.urls)
        coverage = _Coverage(len(shards), len(shards))
        if limit == 0:
            return _Coverage(0, len(shards), complete=not shards)
        with Progress(args, total=limit, unit="rec", desc="inspect") as bar:
            async with aclosing(scan.located(shards)) as located:
                async for shard, index, offset, payload in located:
                    if limit is not None and inspector.records >= limit:
                        # one record past the sample: there is more than it saw
                        coverage.complete = False
                        # (a shard whose first record is that one was not sampled)
                        coverage.shards_read = shards.index(shard) + (1 if index else 0)
                        return coverage
                    try:
                        inspector.add(payload)
                    except ExampleError as exc:
                        where = f"record {index} in {shard.url} at byte offset {offset}"
                        raise ExampleError(f"{where}: {exc}") from exc
                    bar.update(1)
    return coverage


def run(args: argparse.Namespace) -> int:
    """Sample records and describe their features."""
    inspector = Inspector(args.kind)
    coverage = asyncio.run(_sample(args, inspector))
    report = inspector.report()
    report["shards_sampled"] = coverage.shards_read
    report["shards_listed"] = coverage.shards_listed
    report["complete"] = coverage.complete
    if args.json:
        print_json(report)
    else:
        _print_report(inspector, report)
    return EXIT_OK


def _coverage_note(report: dict[str, Any]) -> str:
    """What the suggestion rests on: every record, or the first ones only."""
    records = plural(report["records"], "record")
    shards = plural(report["shards_listed"], "shard")
    if report["complete"]:
        return f"note: the sample is every record ({records} in {shards})"
    return (
        f"note: the sample is the first {records} only (from {report['shards_sampled']} of "
        f"{shards}), not every record: a feature present in "
        "all of them may be missing in a later one, where its FixedLenFeature fails to parse; "
        "sample more with --sample N, or every record with --all"
    )


def _print_report(inspector: Inspector, report: dict[str, Any]) -> None:
    kinds = ", ".join(f"{n} {k}" for k, n in report["kinds"].items() if n)
    if not inspector.records and report["shards_sampled"]:
        kinds = "it holds no records" if report["shards_sampled"] == 1 else "they hold no records"
    shards = plural(report["shards_sampled"], "shard")
    print(
        f"sampled {plural(inspector.records, 'record')} from {shards}"
        + (f": {kinds}" if kinds else "")
    )
    if inspector.records:
        print(f"payload bytes: {inspector.payload_bytes.describe()}")
    raw = inspector.kinds["raw"]
    if raw:
        print(
            f"{raw} of {inspector.records} payloads are neither Example nor SequenceExample "
            "protos: read them as plain bytes"
        )
    for section, title in _SECTION_TITLES.items():
        rows = [s for s in inspector.ordered() if s.section == section]
        if rows:
            print()
            print(f"{title} ({plural(inspector.sampled(section), 'record')})")
            _print_table(rows, inspector.sampled(section))
    spec = inspector.spec()
    if spec:
        print()
        print(_coverage_note(report))
        print(f"suggested spec (from {plural(inspector.records, 'sampled record')}):")
        print(spec_source(spec))


def _row(stats: FeatureStats, sampled: int) -> list[str]:
    spec, _ = stats.suggest(sampled)
    cells = [stats.name, stats.kind, f"{stats.records}/{sampled}"]
    if stats.section == "feature_lists":
        cells.append(stats.steps.describe())
    cells += [stats.values.describe(), stats.value_bytes.describe(), spec or "-"]
    return cells


def _print_table(rows: list[FeatureStats], sampled: int) -> None:
    header = ["name", "kind", "present"]
    if rows[0].section == "feature_lists":
        header += ["steps/record", "values/step"]
    else:
        header.append("values/record")
    header += ["bytes/value", "suggested spec"]
    table = [header] + [_row(stats, sampled) for stats in rows]
    widths = [max(display_width(line[i]) for line in table) for i in range(len(header) - 1)]
    for line in table:
        cells = [pad(cell, width) for cell, width in zip(line, widths, strict=False)]
        print("  " + "  ".join([*cells, line[-1]]).rstrip())
    notes: dict[str, list[str]] = {}
    for stats in rows:
        _, note = stats.suggest(sampled)
        if note and stats.section != "feature_lists":
            notes.setdefault(note, []).append(stats.name)
    for note, names in notes.items():
        print(f"  note: {', '.join(names)}: {note}")
    if rows[0].section == "feature_lists":
        print("  note: read feature lists with streamrec.example.decode_sequence")
