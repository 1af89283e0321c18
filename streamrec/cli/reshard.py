"""``streamrec reshard``: rewrite TFRecord shards as another set, store to store, resumably.

``register(commands)`` adds the subcommand to the ``streamrec`` parser; ``main(argv)`` runs it
on its own (``python -m streamrec.cli.reshard SRC... DST_TEMPLATE [options]``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from streamrec.cli.common import (
    Commands,
    add_timeout_argument,
    add_verbose_argument,
    error,
    human_bytes,
    json_object,
    parse_bytes,
    positive_int,
    retry_of,
    source_url,
)

__all__ = ["main", "parse_bytes", "register"]

EXIT_OK = 0
EXIT_DATA_ERROR = 1
EXIT_USAGE = 2

DESCRIPTION = """\
Read TFRecord shards (paths, globs or urls; GZIP/ZLIB detected; every record's CRCs
verified) and write them as a new set of shards: rotated by size or record count, or a fixed
number of shards; optionally recompressed and shuffled. Streams store to store (s3://, gs://,
az://, local, memory://; http(s):// sources) without local staging; uploads are S3 multipart /
GCS resumable / Azure staged blocks; each shard appears only when complete; _manifest.json is
written last.

Resumable: interrupted (even killed) and run again with the same arguments, it skips the
tasks an earlier run finished and ends with the same output as an uninterrupted run.

--index writes beside each output shard its record index, <shard>.idx (committed after the
shard, listed in _manifest.json), for readers that seek to records (DALI, the tfrecord
package, streamrec).

Output names: with --num-shards (or no limit: one shard) the template gets the shard's index
(and {num_shards}). With --max-bytes / --max-records the input is cut into tasks of whole
input shards (--task-bytes each); with one task {index} counts the shards (part-00000,
part-00001, ...), with several shard j of task t gets {index} = "<t>-<j>" in the field's
format (part-{index:05d} -> part-00003-00001), or {task} and {index} when the template has
{task}. The rule is printed on stderr when the run starts. The manifest lists every shard in
order."""

EPILOG = """\
examples:
  # 256 MiB gzip shards on S3 from GCS
  streamrec reshard 'gs://src/train-*.tfrecord' 's3://dst/train/part-{index:05d}.tfrecord.gz' \\
      --max-bytes 256MiB --compression gzip \\
      --dst-storage-options '{"client_kwargs": {"endpoint_url": "http://127.0.0.1:9000"}}'

  # exactly 64 shards named like TensorFlow's, shuffled
  streamrec reshard 'data/*.tfrecord' 'out/train-{index:05d}-of-{num_shards:05d}.tfrecord' \\
      --num-shards 64 --shuffle --seed 7

  # on a Dask cluster (omit --scheduler for a local cluster of --workers processes)
  streamrec reshard 's3://src/*.tfrecord' 'gs://dst/part-{index:05d}.tfrecord' \\
      --max-records 100000 --engine dask --scheduler tcp://10.0.0.5:8786

sizes take units: 1048576, 64KiB, 256MiB, 1GiB (powers of 1024) or 1MB, 1GB (powers of 1000).
exit status: 0 done, 1 data or storage error (one line on stderr), 2 usage error."""


def register(commands: Commands) -> None:
    """Add the ``reshard`` subcommand to a ``streamrec`` parser's subcommands."""
    parser = commands.add_parser(
        "reshard",
        help="rewrite TFRecord shards as another set of shards, store to store (resumable)",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "sources",
        nargs="+",
        type=source_url,
        metavar="SRC",
        help=(
            "input shards: paths, globs, directories, manifests or urls, as for the other "
            "commands (quote globs so the shell leaves them alone)"
        ),
    )
    parser.add_argument(
        "template",
        type=source_url,
        metavar="DST_TEMPLATE",
        help="output shards' url with an {index} field, e.g. 's3://b/out/part-{index:05d}.tfrecord'",
    )
    limits = parser.add_argument_group("output shards (at most one of these; none: one shard)")
    limits.add_argument(
        "--max-bytes", type=parse_bytes, metavar="SIZE", help="rotate shards before this size"
    )
    limits.add_argument(
        "--max-records", type=positive_int, metavar="N", help="rotate shards before N records"
    )
    limits.add_argument(
        "--num-shards", type=positive_int, metavar="N", help="write exactly N shards"
    )
    parser.add_argument(
        "--compression",
        choices=["none", "gzip", "zlib"],
        default="none",
        help="compression of the output shards (default: none; inputs are detected)",
    )
    parser.add_argument(
        "--shuffle",
        action="store_true",
        help="shuffle: inputs permuted by the seed, records shuffled within each task",
    )
    parser.add_argument("--seed", type=int, default=0, metavar="N", help="shuffle seed (0)")
    parser.add_argument(
        "--engine",
        choices=["local", "dask"],
        default="local",
        help="run tasks in this process (default) or on Dask",
    )
    parser.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="Dask scheduler address (default: a local cluster of --workers processes)",
    )
    parser.add_argument(
        "--workers",
        type=positive_int,
        default=2,
        metavar="N",
        help="processes of the local Dask cluster (default 2)",
    )
    parser.add_argument(
        "--task-bytes",
        type=parse_bytes,
        metavar="SIZE",
        help="with --max-bytes/--max-records: input bytes per task (default 256MiB or 4 shards)",
    )
    for side, what in (("src", "sources'"), ("dst", "destination's")):
        parser.add_argument(
            f"--{side}-storage-options",
            type=json_object,
            metavar="JSON",
            help=(
                f"JSON object for the {what} fsspec filesystem, e.g. "
                '\'{"client_kwargs": {"endpoint_url": "http://host:9000"}}\' (S3) or '
                '\'{"token": "anon"}\' (GCS)'
            ),
        )
    parser.add_argument(
        "--index",
        action="store_true",
        help=(
            "write each output shard's record index <shard>.idx (the tfrecord package's / "
            "DALI's format; gzip/zlib shards get restart points for random access)"
        ),
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar (there is one on stderr only when stderr is a terminal)",
    )
    add_verbose_argument(parser)
    add_timeout_argument(parser)
    parser.set_defaults(run=run)


def _error(message: object) -> None:
    error(message, "streamrec reshard")


def run(args: argparse.Namespace) -> int:
    """The ``reshard`` handler: run the job, print its summary; returns the exit status."""
    from streamrec.errors import StreamrecError
    from streamrec.reshard.job import reshard

    sources, template = args.sources, args.template
    limits = [args.max_bytes, args.max_records, args.num_shards]
    if args.num_shards is not None and sum(v is not None for v in limits) > 1:
        _error("--num-shards cannot be combined with --max-bytes / --max-records")
        return EXIT_USAGE
    if args.scheduler is not None and args.engine != "dask":
        _error("--scheduler needs --engine dask")
        return EXIT_USAGE
    try:
        summary = reshard(
            sources,
            template,
            max_bytes=args.max_bytes,
            max_records=args.max_records,
            num_shards=args.num_shards,
            compression=None if args.compression == "none" else args.compression,
            shuffle=args.shuffle,
            seed=args.seed,
            engine=args.engine,
            scheduler=args.scheduler,
            src_storage_options=args.src_storage_options,
            dst_storage_options=args.dst_storage_options,
            progress=not args.no_progress,
            task_bytes=args.task_bytes,
            workers=args.workers,
            index=args.index,
            retry=retry_of(args),
            on_plan=lambda plan: print(f"streamrec reshard: {plan.naming_rule}", file=sys.stderr),
        )
    except StreamrecError as exc:  # damaged data, storage faults: FormatError is a ValueError
        _error(exc)
        return EXIT_DATA_ERROR
    except (ValueError, TypeError) as exc:
        _error(exc)
        return EXIT_USAGE
    except (OSError, ImportError, TimeoutError, RuntimeError) as exc:  # no Dask, cluster failed
        _error(exc)
        return EXIT_DATA_ERROR
    except KeyboardInterrupt:
        _error("interrupted (run the same command again to resume)")
        return 130
    if args.json:
        sys.stdout.write(json.dumps(summary.as_dict(), indent=2) + "\n")
        return EXIT_OK
    reused = f", {summary.tasks_skipped} done by an earlier run" if summary.tasks_skipped else ""
    tasks = f"{summary.tasks} task{'s' if summary.tasks != 1 else ''}"
    print(
        f"{summary.records:,} records  {human_bytes(summary.bytes_in)} in -> "
        f"{human_bytes(summary.bytes_out)} out  {len(summary.shards)} shards\n"
        f"{summary.seconds:.2f} s  {summary.mb_per_s:.1f} MB/s  "
        f"({tasks}{reused}, engine {summary.engine})\n"
        f"manifest: {summary.manifest_url}"
    )
    return EXIT_OK


def main(argv: Sequence[str | os.PathLike[str]] | None = None) -> int:
    """Run ``streamrec reshard`` with ``argv`` (the arguments after ``reshard``; paths may be
    ``pathlib.Path`` objects)."""
    parser = argparse.ArgumentParser(prog="streamrec")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    register(commands)
    given = sys.argv[1:] if argv is None else [os.fspath(a) for a in argv]
    args = parser.parse_args(["reshard", *given])
    code: int = args.run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
