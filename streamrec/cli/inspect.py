"""``streamrec inspect``: what the features of a sample of records look like, and a spec."""

from __future__ import annotations

import argparse
import asyncio
import sys
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from streamrec.cli.common import (
    EXIT_DATA_ERROR,
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
from streamrec.convert.sample import Sample, sample_records
from streamrec.errors import ExampleError
from streamrec.format.example.arrow import arrow_schema
from streamrec.format.example.batch import decode_batch
from streamrec.format.example.infer import (
    SpecInference,
    spec_entry_source,
    spec_to_json,
)
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
--schema: a spec (and its Arrow schema) for Examples, from a sample spread over the whole
dataset rather than its first records: with every shard's record count known (manifests,
the dataset index, index sidecars) N positions drawn uniformly over all records (--seed),
else the first records of every shard (or of N shards evenly spread when there are more
shards than N). A feature in every sampled record with the same count >= 1 becomes
FixedLenFeature(dtype[, (count,)]), any other VarLenFeature(dtype); the spec is checked to
parse the whole sample. Prints the Python spec, the Arrow schema and "looked at K records
from S of T shards". --json: {"records", "shards_sampled", "shards_listed",
"total_records", "how", "spec" (the JSON spec streamrec convert --spec reads),
"spec_source", "arrow_schema": [{"name", "type"}], "skipped": {name: why}}
  streamrec inspect --schema --sample 5000 --seed 1 's3://bucket/train-*.tfrecord'
  streamrec inspect --schema --json data/ | jq .spec > spec.json

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
    parser.add_argument(
        "--schema",
        action="store_true",
        help="infer a spec and Arrow schema for Examples from records sampled across all "
        "shards (uniform positions where record counts are known; see below)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="with --schema: the seed of the sampled positions (default: 0)",
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
    if args.schema:
        return run_schema(args)
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


def run_schema(args: argparse.Namespace) -> int:
    """``--schema``: a spec inferred from a sample across the shards, checked against it."""
    wanted = sys.maxsize if args.all else args.sample
    sample = asyncio.run(sample_records(args.urls, read_options_of(args), wanted, args.seed))
    inference = SpecInference()
    for number, payload in enumerate(sample.payloads):
        try:
            inference.add_payload(payload)
        except ExampleError as exc:
            raise ExampleError(f"sampled record {number}: {exc}") from exc
    spec = inference.spec()
    # the promise: the spec parses every sampled record (raises FeatureError otherwise)
    decode_batch(sample.payloads, spec)
    try:
        schema = arrow_schema(spec)
    except ImportError:
        schema = None
    report = schema_report(sample, inference, schema)
    if args.json:
        print_json(report)
    else:
        _print_schema(report, sample)
    return EXIT_OK if spec or not inference.skipped else EXIT_DATA_ERROR


def schema_report(sample: Sample, inference: SpecInference, schema: Any) -> dict[str, Any]:
    """``--schema --json``'s document."""
    spec = inference.spec()
    return {
        "records": len(sample.payloads),
        "shards_sampled": sample.shards_sampled,
        "shards_listed": sample.shards_listed,
        "total_records": sample.total,
        "how": sample.how,
        "spec": spec_to_json(spec),
        "spec_source": spec_source({k: spec_entry_source(v) for k, v in spec.items()}),
        "arrow_schema": None
        if schema is None
        else [{"name": f.name, "type": str(f.type)} for f in schema],
        "skipped": inference.skipped,
    }


def _print_schema(report: dict[str, Any], sample: Sample) -> None:
    shards = f"{report['shards_sampled']} of {plural(report['shards_listed'], 'shard')}"
    how = (
        f"positions drawn uniformly over all {plural(report['total_records'], 'record')}"
        if sample.how == "positions"
        else "record counts unknown: the first records of each shard sampled"
    )
    print(f"looked at {plural(report['records'], 'record')} from {shards} ({how})")
    print()
    print("spec (parses every sampled record):")
    print(report["spec_source"])
    for name, why in report["skipped"].items():
        print(f"  note: {name} left out: {why}")
    print()
    if report["arrow_schema"] is None:
        print('Arrow schema: pyarrow is not installed (pip install "streamrec[arrow]")')
        return
    print("Arrow schema:")
    for entry in report["arrow_schema"]:
        print(f"  {entry['name']}: {entry['type']}")
