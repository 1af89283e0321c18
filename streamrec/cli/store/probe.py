"""``streamrec probe``: measure a store from where it runs; the settings it suggests.

The measuring is :mod:`streamrec.storage.probe`'s (through the store's own reads and uploads);
the listing is ``open_dataset``'s (:func:`~streamrec.pipeline.listing.urls.list_sources`).
This module parses, prints the table and the recommendation, and draws ``--plot``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import textwrap
import uuid
from pathlib import Path

from streamrec.cli.common import (
    EXIT_OK,
    Commands,
    add_command,
    add_common_arguments,
    error,
    human_bytes,
    parse_bytes,
    positive_float,
    print_json,
    retry_of,
    source_url,
    storage_options_of,
)
from streamrec.pipeline.listing.urls import list_sources
from streamrec.storage.base import GLOB_CHARS, ObjectInfo, split_scheme
from streamrec.storage.probe import MIB, Point, ProbePlan, ProbeResult, probe
from streamrec.storage.registry import StoreSet

__all__ = ["register", "run"]

EXIT_USAGE = 2
logger = logging.getLogger("streamrec")

EPILOG = """\
what it measures, in about --duration-s seconds (the listing not counted):
  listing         how long URL takes to list (as open_dataset lists it), objects per second
  round trip      1-byte range reads one at a time: median and 90th percentile
  one connection  large range reads one after another
  reads           throughput against concurrency (1, 2, 4, ...) for each block size, over
                  the objects listed (cycled through); a block size stops climbing once a
                  step gains less than 10% (the link is full) or passes --memory-cap
  uploads         with --write only: the same for uploads of --part-bytes parts, to objects
                  named _streamrec_probe-* beside the data, each removed once timed
Nothing is written without --write. Reads use streamrec's own range reads, so the numbers
are what open_dataset gets from this machine.

output: the table (MiB/s per concurrency and block size), then the settings for open_dataset
(max_concurrency, block_bytes, prefetch_bytes) and open_writer (max_concurrency,
part_bytes) and a paragraph saying how they were chosen: the setting holding the least in
flight (concurrency x block) within 10% of the best throughput; prefetch_bytes =
max_concurrency x block_bytes (what keeps that many reads in flight), within --memory-cap.

examples:
  streamrec probe 's3://bucket/train/*.tfrecord'
  streamrec probe gs://bucket/train/ --duration-s 60 --plot throughput.png
  streamrec probe 's3://bucket/train-*' --write --json | jq .recommended

--json: {"url", "duration_s", "listing": {"objects", "total_bytes", "seconds", "objects_per_s"},
         "round_trip": {"median_s", "p90_s", "samples"}, "single_connection": STEP,
         "reads": [STEP], "writes": [STEP], "recommended": {"open_dataset": {"max_concurrency",
         "block_bytes", "prefetch_bytes"}, "open_writer": {"max_concurrency", "part_bytes"},
         "expected_bytes_per_s"}, "explanation", "notes"}
  STEP: {"concurrency", "block_bytes", "bytes", "seconds", "requests", "bytes_per_s"}
exit status: 0 ok; 1 nothing to list, or storage failed; 2 usage error (or --plot without
matplotlib)
"""


def register(commands: Commands) -> None:
    """Add the ``probe`` subcommand."""
    parser = add_command(
        commands,
        "probe",
        summary="measure a store from here and recommend read/write settings",
        description=(
            "Measure a store from where this runs (round trip, one connection's throughput, "
            "throughput against concurrency and block size, time to list) on the objects a "
            "url names, and print the settings it recommends for open_dataset and open_writer."
        ),
        epilog=EPILOG,
    )
    parser.add_argument(
        "url",
        type=source_url,
        metavar="URL",
        help="the objects to read: a prefix or directory, a glob, one object, a manifest",
    )
    add_common_arguments(parser, urls=False, compression=False)
    parser.add_argument(
        "--duration-s",
        type=positive_float,
        default=ProbePlan.duration_s,
        metavar="SECONDS",
        help=(
            "time the measurements may take, all together, the listing not counted (default: "
            f"{ProbePlan.duration_s:g}); a step finishes the reads it started"
        ),
    )
    parser.add_argument(
        "--concurrency",
        type=_int_list,
        default=ProbePlan.concurrencies,
        metavar="N,N,...",
        help="reads in flight to try (default: "
        + ",".join(map(str, ProbePlan.concurrencies))
        + ")",
    )
    parser.add_argument(
        "--block-sizes",
        type=_size_list,
        default=ProbePlan.block_sizes,
        metavar="SIZE,...",
        help="range read sizes to try (default: 1MiB,4MiB,16MiB); sizes larger than every "
        "object are skipped",
    )
    parser.add_argument(
        "--memory-cap",
        type=parse_bytes,
        default=ProbePlan.memory_cap_bytes,
        metavar="SIZE",
        help="most bytes in flight in any step, and in any recommendation (default: 1GiB)",
    )
    parser.add_argument(
        "--write",
        action="store_true",
        help="also measure uploads, to objects named _streamrec_probe-* beside the data "
        "(each removed once timed); without it nothing is written",
    )
    parser.add_argument(
        "--part-bytes",
        type=parse_bytes,
        default=ProbePlan.part_bytes,
        metavar="SIZE",
        help="part size of the upload measurement (--write; default: 8MiB; S3 needs >= 5MiB)",
    )
    parser.add_argument(
        "--plot",
        type=Path,
        metavar="OUT.png",
        help="draw throughput against concurrency, one line per block size (and uploads), "
        "to this PNG; needs matplotlib (pip install matplotlib, or streamrec[bench])",
    )
    parser.set_defaults(run=run)


def _can_plot() -> bool:
    """Whether matplotlib's Agg canvas imports (checked before minutes of measuring)."""
    try:
        import matplotlib.backends.backend_agg  # noqa: F401
    except ImportError:
        return False
    return True


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"every concurrency must be >= 1: {text!r}")
    return values


def _size_list(text: str) -> tuple[int, ...]:
    return tuple(parse_bytes(part) for part in text.split(","))


def run(args: argparse.Namespace) -> int:
    """Measure, then print the table and the recommendation (or JSON); draw ``--plot``."""
    if args.plot is not None and not _can_plot():
        error(
            "--plot needs matplotlib, which cannot be imported here: pip install matplotlib "
            "(or streamrec[bench]), or leave --plot out"
        )
        return EXIT_USAGE
    plan = ProbePlan(
        duration_s=args.duration_s,
        concurrencies=args.concurrency,
        block_sizes=args.block_sizes,
        memory_cap_bytes=args.memory_cap,
        part_bytes=args.part_bytes,
        retry=retry_of(args),
    )
    result = asyncio.run(_probe(args, plan))
    if args.plot is not None:
        draw(result, args.plot)
    if args.json:
        print_json(result.document())
    else:
        print_report(result)
    return EXIT_OK


async def _probe(args: argparse.Namespace, plan: ProbePlan) -> ProbeResult:
    url: str = args.url
    # a pool as large as the most reads in flight tried (S3's client caps it otherwise)
    async with StoreSet(storage_options_of(args), max(plan.concurrencies)) as stores:
        store = stores.get(url)
        listed: list[ObjectInfo] = []

        async def list_objects() -> list[ObjectInfo]:
            listed.extend(await list_sources([url], stores.get, plan.retry))
            return listed

        def step(name: str) -> None:
            logger.info("probe: %s", name)

        write_url: str | None = None
        if args.write:
            write_url = f"{_directory(url)}_streamrec_probe-{uuid.uuid4().hex[:8]}-"
        return await probe(url, store, list_objects, plan, write_url=write_url, on_step=step)


def _directory(url: str) -> str:
    """Where the upload measurement writes, for ``url``: the folder its glob starts in, else
    the url itself read as a folder (``s3://b/data`` -> ``s3://b/data/``), or a local file's
    folder. The names start with ``_``, which listings skip."""
    scheme, rest = split_scheme(url)
    glob_at = min((rest.index(c) for c in GLOB_CHARS if c in rest), default=None)
    if glob_at is not None:
        base = url[: len(url) - len(rest) + glob_at]
        return base.rpartition("/")[0] + "/"
    if scheme == "file" and Path(rest.removeprefix("file://")).is_file():
        return url.rpartition("/")[0] + "/"
    if url.endswith(".json"):  # a manifest: its folder
        return url.rpartition("/")[0] + "/"
    return url if url.endswith("/") else url + "/"


# ------------------------------------------------------------------------------------ text


def print_report(result: ProbeResult) -> None:
    """The measurements as a short table, then the recommendation."""
    listing = result.listing
    print(
        f"probe {result.url}: {listing.objects:,} objects, {human_bytes(listing.total_bytes)}, "
        f"listed in {listing.seconds:.3f} s ({listing.objects_per_s:,.0f} objects/s)"
    )
    median, p90 = result.round_trip_median_s, result.round_trip_p90_s
    if median is not None and p90 is not None:
        print(
            f"round trip      median {median * 1000:.1f} ms, p90 {p90 * 1000:.1f} ms "
            f"({len(result.round_trips_s)} reads of 1 byte)"
        )
    if result.single is not None:
        single = result.single
        print(
            f"one connection  {_mib_s(single)} MiB/s ({single.requests} reads of "
            f"{human_bytes(single.block_bytes)} one after another)"
        )
    for title, points in (("reads", result.reads), ("uploads", result.writes)):
        if points:
            print()
            _print_table(title, points)
    recommended = result.recommendation
    if recommended is not None:
        print()
        print("recommended:")
        print(
            f"  open_dataset(..., max_concurrency={recommended.max_concurrency}, "
            f"block_bytes={recommended.block_bytes}, "
            f"prefetch_bytes={recommended.prefetch_bytes})"
        )
        print(
            f"  open_writer(..., max_concurrency={recommended.writer_max_concurrency}, "
            f"part_bytes={recommended.part_bytes})"
        )
        print()
        print(textwrap.fill(recommended.explanation, 92))
    for note in result.notes:
        print(f"note: {note}")


def _print_table(title: str, points: list[Point]) -> None:
    levels = sorted({p.concurrency for p in points})
    blocks = sorted({p.block_bytes for p in points})
    by_key = {(p.block_bytes, p.concurrency): p for p in points}
    print(f"{title + ', MiB/s':<16} " + "".join(f"{c:>8}" for c in levels) + "  (in flight)")
    for block in blocks:
        cells = [by_key.get((block, c)) for c in levels]
        row = "".join(f"{'-' if p is None else _mib_s(p):>8}" for p in cells)
        print(f"  {human_bytes(block):<14} {row}")


def _mib_s(point: Point) -> str:
    return f"{point.bytes_per_s / MIB:.1f}"


# ------------------------------------------------------------------------------------ plot


def draw(result: ProbeResult, path: Path) -> None:
    """Throughput against concurrency, one line per block size (uploads dashed), as a PNG.

    Drawn on a ``Figure`` of its own (the Agg canvas), so pyplot's global state is untouched.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 4.5))
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    lines: list[tuple[str, str, list[Point]]] = []
    for block in sorted({p.block_bytes for p in result.reads}):
        chosen = [p for p in result.reads if p.block_bytes == block]
        lines.append((f"reads, {human_bytes(block)} blocks", "-", chosen))
    if result.writes:
        part = human_bytes(result.writes[0].block_bytes)
        lines.append((f"uploads, {part} parts", "--", result.writes))
    for label, style, points in lines:
        ordered = sorted(points, key=lambda p: p.concurrency)
        axes.plot(
            [p.concurrency for p in ordered],
            [p.bytes_per_s / MIB for p in ordered],
            style,
            marker="o",
            label=label,
        )
    axes.set_xscale("log", base=2)
    levels = sorted({p.concurrency for _, _, points in lines for p in points})
    if levels:
        axes.set_xticks(levels, [str(level) for level in levels])  # 1, 2, 4, not 2^0, 2^1
    axes.set_xlabel("requests in flight (concurrency)")
    axes.set_ylabel("throughput, MiB/s")
    axes.set_title(f"streamrec probe {result.url}", fontsize=9)
    axes.grid(True, alpha=0.3)
    if lines:
        axes.legend()
    figure.tight_layout()
    figure.savefig(path, format="png")
