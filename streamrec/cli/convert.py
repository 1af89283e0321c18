"""``streamrec convert``: TFRecord Examples <-> Parquet, store to store (resumable to Parquet)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from streamrec.cli.common import (
    EXIT_DATA_ERROR,
    EXIT_OK,
    Commands,
    Progress,
    add_command,
    add_common_arguments,
    add_prefetch_argument,
    error,
    human_bytes,
    parse_bytes,
    plural,
    positive_int,
    print_json,
    read_options_of,
    source_url,
)
from streamrec.convert.from_parquet import from_parquet
from streamrec.convert.sample import sample_records
from streamrec.convert.to_parquet import (
    DEFAULT_ROW_GROUP_ROWS,
    DEFAULT_ROWS_PER_FILE,
    DEFAULT_TASK_BYTES,
    to_parquet,
)
from streamrec.errors import ExampleError, StreamrecError
from streamrec.format.example.infer import SpecInference, spec_from_json
from streamrec.format.example.sequence import sequence_schema
from streamrec.format.example.spec import FeatureSpec
from streamrec.pipeline.stream.scan import ShardScan
from streamrec.reshard.dask import DaskEngineError
from streamrec.reshard.job import ReshardProgress
from streamrec.storage.base import ObjectInfo

__all__ = ["register", "run"]

EXIT_USAGE = 2

EPILOG = """\
--to parquet: SRC... are TFRecord shards of Examples (paths, globs, directories, manifests,
urls); DST is a directory (local or s3://, gs://, az://, memory://) that gets
part-<task>-<file>.parquet files: tasks of --task-bytes of consecutive input shards, a new
file every --rows-per-file rows, a row group every --row-group-rows. The columns follow a
spec: --spec FILE.json (as `streamrec inspect --schema --json | jq .spec` prints it), else
one inferred from --sample records spread over all shards (see `streamrec inspect --help`,
--schema); a record the spec does not fit stops the run, naming it. Types: FixedLenFeature
-> int64 / float / large_binary (fixed_size_list for shapes), VarLenFeature -> large_list.
--sequence STEPS.json: the records are SequenceExamples; each feature list of that spec is a
large_list column of steps, after the context's columns from --spec (none without it).
Each file appears only when complete (local: a rename; S3: one PUT or a multipart upload).
Resumable: killed and run again with the same arguments, it skips the tasks an earlier run
finished (DST/_convert/<fingerprint>/task-*.json) and writes the others again under the same
names: no file twice, no duplicate rows.

--from parquet: SRC... are Parquet files, globs or directories (their *.parquet); DST is a
TFRecord template as for reshard ('out/part-{index:05d}.tfrecord'). The files are planned,
named and resumed as `streamrec reshard` does its input shards (see `streamrec reshard
--help`; the naming rule is printed on stderr): --max-records / --max-bytes rotation in tasks
of --task-bytes of input (the files' footers give their row counts, so --max-records numbers
the shards 0, 1, 2, ... across tasks), or exactly --num-shards N: shards of consecutive rows
(files in url order), their row counts differing by one at most (the first ones hold the
extra rows; an empty shard only when there are fewer rows than N); --index; _manifest.json
last. Killed and run again with the same arguments, it redoes only the unfinished tasks. Each
row becomes one Example: integers and bool -> int64_list, floats -> float_list (float32),
binary and strings -> bytes_list, lists (nested too) -> their values flattened, null -> no
feature. Examples written with --to parquet come back byte for byte when every feature is
present in every record (a missing VarLenFeature comes back as an empty list).

--engine dask (both ways): one Dask task per task of the plan, on the cluster at --scheduler
ADDRESS or on a local cluster of --workers processes (pip install "streamrec[dask]"). Each
task writes its files and then its state on a worker, as the local engine does: the same
output, byte for byte, and the same resume (a rerun of either engine skips the tasks either
finished); a task whose worker dies is run again. Progress advances as tasks finish.

examples:
  streamrec convert 'data/train-*.tfrecord' s3://bucket/parquet/ --to parquet
  streamrec convert data/ out/ --to parquet --spec spec.json --rows-per-file 100000
  streamrec convert 's3://bucket/parquet/*.parquet' 'back/part-{index:05d}.tfrecord' \\
      --from parquet --max-records 100000 --index
  streamrec convert 's3://bucket/train-*.tfrecord' s3://bucket/parquet/ --to parquet \\
      --engine dask --scheduler tcp://10.0.0.5:8786

needs pyarrow: pip install "streamrec[arrow]"
--json: {"direction", "rows", "files": [{"url", "rows", "bytes"}], "fingerprint",
         "tasks", "tasks_skipped"} (--to); {"direction", "records", "shards", "manifest", "tasks",
         "tasks_skipped"} (--from)
exit status: 0 done; 1 damaged data, a record the spec does not fit, a storage error;
2 usage error
"""


def register(commands: Commands) -> None:
    """Add the ``convert`` subcommand."""
    parser = add_command(
        commands,
        "convert",
        summary="convert TFRecord Examples to Parquet files and back, store to store",
        description=(
            "Write the Examples of TFRecord shards as Parquet files (--to parquet), or the "
            "rows of Parquet files as TFRecord Examples (--from parquet)."
        ),
        epilog=EPILOG,
    )
    parser.add_argument(
        "paths", nargs="+", type=source_url, metavar="SRC... DST", help="sources, then DST"
    )
    add_common_arguments(parser, urls=False)
    add_prefetch_argument(parser)
    way = parser.add_mutually_exclusive_group(required=True)
    way.add_argument("--to", choices=["parquet"], help="TFRecord Examples -> Parquet files in DST/")
    way.add_argument(
        "--from",
        dest="source_format",
        choices=["parquet"],
        help="Parquet rows -> TFRecord Examples in shards named by the DST template",
    )
    out = parser.add_argument_group("--to parquet")
    out.add_argument(
        "--spec",
        metavar="FILE.json",
        help="the columns: a JSON spec (inspect --schema --json's .spec); default: inferred "
        "from a sample",
    )
    out.add_argument(
        "--sequence",
        metavar="FILE.json",
        help="the records are SequenceExamples: a JSON spec (as --spec's) of their feature "
        "lists, each a column of steps; --spec gives the context's columns (none without it: "
        "not inferred)",
    )
    out.add_argument(
        "--sample",
        type=positive_int,
        default=1000,
        metavar="N",
        help="records sampled across all shards to infer the spec (default: 1000)",
    )
    out.add_argument("--seed", type=int, default=0, help="seed of the sample (default: 0)")
    out.add_argument(
        "--rows-per-file",
        type=positive_int,
        default=DEFAULT_ROWS_PER_FILE,
        metavar="N",
        help=f"rows per Parquet file (a task's last has fewer; default {DEFAULT_ROWS_PER_FILE})",
    )
    out.add_argument(
        "--row-group-rows",
        type=positive_int,
        default=DEFAULT_ROW_GROUP_ROWS,
        metavar="N",
        help=f"rows per Parquet row group (default {DEFAULT_ROW_GROUP_ROWS})",
    )
    out.add_argument(
        "--jobs", type=positive_int, default=4, metavar="N", help="tasks run at once (4)"
    )
    engine = parser.add_argument_group("engine (both ways)")
    engine.add_argument(
        "--engine",
        choices=["local", "dask"],
        default="local",
        help="run the tasks in this process (default) or on Dask, as reshard does",
    )
    engine.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="Dask scheduler address (default: a local cluster of --workers processes)",
    )
    engine.add_argument(
        "--task-bytes",
        type=parse_bytes,
        metavar="SIZE",
        help="input bytes per task, the unit of resume and of Dask's parallelism (default "
        f"{human_bytes(DEFAULT_TASK_BYTES)}; --from: reshard's, 256MiB or 4 x --max-bytes)",
    )
    engine.add_argument(
        "--workers",
        type=positive_int,
        default=2,
        metavar="N",
        help="processes of the local Dask cluster (default 2)",
    )
    back = parser.add_argument_group("--from parquet (output shards: at most one limit)")
    back.add_argument("--max-records", type=positive_int, metavar="N", help="rotate before N")
    back.add_argument("--max-bytes", type=parse_bytes, metavar="SIZE", help="rotate before SIZE")
    back.add_argument("--num-shards", type=positive_int, metavar="N", help="exactly N shards")
    back.add_argument(
        "--index", action="store_true", help="write each shard's record index sidecar (.idx)"
    )
    back.add_argument(
        "--shard-compression",
        choices=["none", "gzip", "zlib"],
        default="none",
        help="compression of the output shards (default: none)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Convert, one way or the other."""
    if len(args.paths) < 2:
        error("convert needs at least one source and a destination: SRC... DST")
        return 2
    sources, destination = args.paths[:-1], args.paths[-1]
    if args.scheduler is not None and args.engine != "dask":
        error("--scheduler needs --engine dask")
        return 2
    try:
        if args.to == "parquet":
            return _to_parquet(args, sources, destination)
        return _from_parquet_checked(args, sources, destination)
    except (ImportError, DaskEngineError) as exc:  # no pyarrow or Dask; the cluster failed
        error(exc)
        return EXIT_DATA_ERROR
    except (OSError, RuntimeError, TimeoutError) as exc:
        if args.engine != "dask":
            raise
        error(f"dask: {exc}")  # the cluster did not start, the scheduler is unreachable
        return EXIT_DATA_ERROR


def _from_parquet_checked(args: argparse.Namespace, sources: list[str], destination: str) -> int:
    if args.sequence is not None:
        error("--sequence is for --to parquet (--from parquet writes Examples)")
        return 2
    limits = [x for x in (args.max_records, args.max_bytes, args.num_shards) if x is not None]
    if len(limits) > 1:
        error("give at most one of --max-records, --max-bytes, --num-shards")
        return 2
    return _from_parquet(args, sources, destination)


def _spec_file(option: str, path: str) -> dict[str, FeatureSpec]:
    try:
        with open(path, encoding="utf-8") as file:
            return spec_from_json(json.load(file))
    except (OSError, ValueError) as exc:
        raise ExampleError(f"{option} {path}: {exc}") from exc


def _spec_of(args: argparse.Namespace, sources: list[str]) -> dict[str, FeatureSpec]:
    if args.spec is not None:
        return _spec_file("--spec", args.spec)
    if args.sequence is not None:
        return {}  # (a SequenceExample's context is not inferred)
    sample = asyncio.run(sample_records(sources, read_options_of(args), args.sample, args.seed))
    inference = SpecInference()
    for number, payload in enumerate(sample.payloads):
        try:
            inference.add_payload(payload)
        except ExampleError as exc:
            raise ExampleError(f"sampled record {number}: {exc}") from exc
    for name, why in inference.skipped.items():
        print(f"streamrec convert: note: {name} left out: {why}", file=sys.stderr)
    print(
        f"streamrec convert: spec inferred from {plural(len(sample.payloads), 'record')} from "
        f"{sample.shards_sampled} of {plural(sample.shards_listed, 'shard')}",
        file=sys.stderr,
    )
    return inference.spec()


def _to_parquet(args: argparse.Namespace, sources: list[str], destination: str) -> int:
    sequence = None if args.sequence is None else _spec_file("--sequence", args.sequence)
    spec = _spec_of(args, sources)
    if not spec and not sequence:
        if sequence is not None:
            error("no feature to convert: --sequence and --spec name none")
        else:
            error("no feature to convert: the sample has none every record agrees on")
        return EXIT_DATA_ERROR
    if sequence is not None:
        try:
            sequence_schema(spec, sequence)
        except (TypeError, ValueError) as exc:  # a name in both, a type Arrow lacks
            raise ExampleError(f"--sequence {args.sequence}: {exc}") from exc
    options = read_options_of(args)

    async def listed() -> list[ObjectInfo]:
        async with ShardScan(options) as scan:
            return await scan.list_shards(sources)

    shards = asyncio.run(listed())
    total = sum(shard.size for shard in shards)  # (tasks done before: never reached)
    with Progress(args, total=total, unit="B", desc="convert") as bar:
        summary = to_parquet(
            shards,
            destination,
            spec,
            options,
            rows_per_file=args.rows_per_file,
            row_group_rows=args.row_group_rows,
            task_bytes=args.task_bytes or DEFAULT_TASK_BYTES,
            jobs=args.jobs,
            engine=args.engine,
            scheduler=args.scheduler,
            workers=args.workers,
            on_bytes=bar.update,
            sequence=sequence,
        )
    if args.json:
        print_json(
            {
                "direction": "to parquet",
                "rows": summary.rows,
                "files": summary.files,
                "fingerprint": summary.fingerprint,
                "tasks": summary.tasks,
                "tasks_skipped": summary.tasks_skipped,
            }
        )
    else:
        skipped = f" ({summary.tasks_skipped} done before)" if summary.tasks_skipped else ""
        print(
            f"wrote {plural(summary.rows, 'row')} in {plural(len(summary.files), 'Parquet file')}"
            f" to {destination} ({plural(summary.tasks, 'task')}{skipped})"
        )
    return EXIT_OK


def _from_parquet(args: argparse.Namespace, sources: list[str], template: str) -> int:
    options = read_options_of(args)
    with Progress(args, total=None, unit="B", desc="convert") as bar:
        seen = [0]

        def progress(where: ReshardProgress) -> None:
            bar.update(where.bytes_read - seen[0])
            seen[0] = where.bytes_read

        try:
            summary = from_parquet(
                sources,
                template,
                options,
                engine=args.engine,
                scheduler=args.scheduler,
                workers=args.workers,
                progress=progress,
                max_records=args.max_records,
                max_bytes=args.max_bytes,
                num_shards=args.num_shards,
                index=args.index,
                compression=None if args.shard_compression == "none" else args.shard_compression,
                task_bytes=args.task_bytes,
                on_plan=lambda plan: print(
                    f"streamrec convert: {plan.naming_rule}", file=sys.stderr
                ),
            )
        except StreamrecError:
            raise  # damaged data, storage (a FormatError is a ValueError too)
        except (ValueError, TypeError) as exc:
            error(exc)
            return EXIT_USAGE
    if args.json:
        print_json(
            {
                "direction": "from parquet",
                "records": summary.records,
                "shards": summary.shards,
                "manifest": summary.manifest_url,
                "tasks": summary.tasks,
                "tasks_skipped": summary.tasks_skipped,
            }
        )
    else:
        skipped = f" ({summary.tasks_skipped} done before)" if summary.tasks_skipped else ""
        print(
            f"wrote {plural(summary.records, 'record')} in "
            f"{plural(len(summary.shards), 'shard')} ({plural(summary.tasks, 'task')}{skipped})"
        )
    return EXIT_OK
