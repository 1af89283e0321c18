"""bench_write.py --link-shape: the writer, tuned and fixed, through several emulated links.

Each shape (``RTTms/MBps/tbf-rate``: round trip, per-connection cap, aggregate cap) gets its
own namespace and proxy in front of one SeaweedFS (``Services``'s ``shapes``). Through each,
every round runs (order rotated): streamrec at its defaults (part size and window tuned),
streamrec at each fixed ``--fixed PARTMiBxC`` (default ``16x8``: the old fixed defaults) and
the link limit (16 concurrent 16 MiB ``PutObject``). The lines give per shape the median MB/s
(x the link limit's median, the rounds' range), the largest peak-RSS growth and, for the tuned
writer, the part size and uploads in flight it ended with (``w.stats``).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import netem

from . import MB, MIB
from .report import source_state
from .servers import Services, free_subnet

__all__ = ["SHAPE_HELP", "replace_lines", "run"]

SHAPE_HELP = (
    "an emulated link as RTTms/MBps-per-connection/tbf-rate (repeatable), e.g. "
    "10ms/100MBps/2.5gbit 60ms/25MBps/1gbit 150ms/10MBps/1gbit: streamrec tuned, fixed "
    "(--fixed) and the link limit through each"
)
HEADING = "## Upload throughput (bench_write.py)"


@dataclass
class Writer:
    label: str
    kind: str  # "streamrec" | "limit"
    part_bytes: int | None = None  # None: the writer's own (tuned)
    concurrency: int | None = None
    seconds: dict[str, list[float]] = field(default_factory=dict)  # by store key
    rss_kib: dict[str, list[int]] = field(default_factory=dict)
    chosen: dict[str, list[str]] = field(default_factory=dict)


def parse_fixed(text: str) -> Writer:
    part, concurrency = text.lower().split("x")
    return Writer(f"fixed {part}MiBx{concurrency}", "streamrec", int(part) * MIB, int(concurrency))


def run(
    script: str,
    shapes_text: Sequence[str],
    fixed: Sequence[str],
    rounds: int,
    records: int,
    shard_bytes: int,
    total_bytes: int,
    run_worker: Callable[[dict[str, Any]], dict[str, Any]],
    check_and_clean: Callable[[str, str, str], None],
) -> str:
    """Every writer through every shape, ``rounds`` times; the README lines (printed too)."""
    start = time.perf_counter()
    loads = [os.getloadavg()[0]]
    source = source_state()
    shapes = [netem.LinkShape.parse(text) for text in shapes_text]
    writers = [Writer("tuned (defaults)", "streamrec"), *map(parse_fixed, fixed)]
    writers.append(Writer("link limit", "limit"))
    with (
        tempfile.TemporaryDirectory(prefix="bench-write-shapes-") as tmp,
        Services(Path(tmp), gcs=False, shapes=shapes, subnet=free_subnet()) as services,
    ):
        services.start()
        stores = [s for s in services.stores.values() if s.link]
        for r in range(rounds):
            for store in stores:
                for k, writer in enumerate(
                    writers[r % len(writers) :] + writers[: r % len(writers)]
                ):
                    prefix = f"w{k}-{r}-{store.key}"
                    job = {
                        "kind": writer.kind,
                        "endpoint": store.endpoint,
                        "prefix": prefix,
                        "part_bytes": writer.part_bytes,
                        "concurrency": writer.concurrency,
                        "records": records,
                        "shard_bytes": shard_bytes,
                        "scratch": tmp,
                    }
                    result = run_worker(job)
                    check_and_clean(store.endpoint, prefix, writer.kind)
                    writer.seconds.setdefault(store.key, []).append(result["seconds"])
                    writer.rss_kib.setdefault(store.key, []).append(result["rss_growth_kib"])
                    stats = result.get("stats") or {}
                    if stats:
                        chosen = f"{stats['part_bytes'] / MIB:g} MiB x {stats['max_concurrency']}"
                        writer.chosen.setdefault(store.key, []).append(chosen)
                    print(
                        f"{store.label:26} {writer.label:18} round {r}: "
                        f"{total_bytes / result['seconds'] / MB:6.1f} MB/s, RSS "
                        f"+{result['rss_growth_kib'] / 1024:.0f} MiB {stats or ''}",
                        flush=True,
                    )
            loads.append(os.getloadavg()[0])
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    detail = []  # printed: every writer with its rounds' range
    cells = []  # the README's: per shape, each streamrec writer against the limit
    for store in stores:
        limit = statistics.median(writers[-1].seconds[store.key])
        parts = []
        for writer in writers:
            times = writer.seconds[store.key]
            med = total_bytes / statistics.median(times) / MB
            ratio = limit / statistics.median(times)
            lo, hi = total_bytes / max(times) / MB, total_bytes / min(times) / MB
            detail.append(
                f"{store.label:26} {writer.label:18} {med:6.1f} MB/s ({ratio:.2f}x; "
                f"{lo:.0f}-{hi:.0f}) RSS +{max(writer.rss_kib[store.key]) / 1024:.0f} MiB"
            )
            if writer.kind != "streamrec":
                continue
            cell = f"{writer.label.split()[0]} {med:.0f} ({ratio:.2f}x), "
            cell += f"+{max(writer.rss_kib[store.key]) / 1024:.0f}"
            if writer.chosen.get(store.key) and writer.part_bytes is None:
                cell += f", {statistics.mode(writer.chosen[store.key])}"
            parts.append(cell)
        rtt = store.label.removeprefix("S3 ").split("/")[0]
        cells.append(f"{rtt}: " + " / ".join(parts))
    section = "\n".join(
        [
            f"`python benchmarks/bench_write.py --rounds {rounds} --link-shape "
            f"{' --link-shape '.join(shapes_text)}"
            + "".join(f" --fixed {f}" for f in fixed if list(fixed) != ["16x8"])
            + "`",
            f"({when}, {source}, {time.perf_counter() - start:.0f} s, load "
            f"{min(loads):.1f}-{max(loads):.1f}) MB/s median (x limit), RSS +MiB, chosen:",
            "; ".join(cells) + ".",
        ]
    )
    print("\n".join(detail), flush=True)
    print(section, flush=True)
    return section


def replace_lines(readme: Path, section: str) -> None:
    """Put ``section`` under the README's upload heading, in place of the lines there."""
    lines = readme.read_text().splitlines()
    at = lines.index(HEADING)
    end = next((i for i in range(at + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    keep = lines[at + 1 : at + 3]  # the section's description
    new = [*lines[: at + 1], *keep, *section.splitlines(), "", *lines[end:]]
    readme.write_text("\n".join(new) + "\n")
