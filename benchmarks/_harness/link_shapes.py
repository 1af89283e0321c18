"""bench_remote.py --link-shape: the same readers through several emulated links at once.

Each shape (``RTTms/MBps/tbf-rate``: round trip, per-connection cap, aggregate cap of the
veth pair) gets its own namespace and proxy in front of the one SeaweedFS (``Services``'s
``shapes``). The readers are streamrec at its defaults (nothing passed), streamrec at each
``--settings`` given, and the link limit (``bulk``: 16 x 8 MiB range GETs); the datasets are
~1 KiB and ~1 MiB Example records. The table gives, per shape and dataset, the median MB/s
(x the link limit measured beside it), the largest peak-RSS growth (x ``prefetch_bytes``) and,
for streamrec, the block size and concurrency it read with (``ds.stats``' settings).
``--consumer-ms-per-mb`` makes every streamrec consumer sleep per MB taken (a consumer
slower than the link): the reader must then hold no more than the budget.

``--epochs`` (1 MiB records only): each streamrec reader reads the dataset three times in one
process (``set_epoch``): a first epoch from the defaults (it learns the link), then a second
epoch starting from what the first learned (``memory``) and one whose store's memory was
emptied first (``fresh``, :meth:`LinkMemory.forget`), in alternating order per round. Per
epoch: MB/s of the first :data:`FIRST_MB` MB of records (the ramp: where a start from the
defaults shows) and of the whole epoch, and the setting it started with.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import netem

from . import KIB, MIB
from .datasets import Dataset, DataSpec, ensure_dataset
from .remote import upload_all
from .remote_report import Key, Reader, Settings
from .report import command_line, source_state
from .servers import Services, Store, free_subnet
from .stats import RunSamples

__all__ = ["FIRST_MB", "SHAPE_HELP", "epochs_read", "run_shapes"]

FIRST_MB = 64
"""``--epochs``: the first this many MB of records of an epoch are timed apart."""

SHAPE_HELP = (
    "an emulated link as RTTms/MBps-per-connection/tbf-rate (repeatable), e.g. "
    "10ms/100MBps/2.5gbit 60ms/25MBps/1gbit 150ms/10MBps/1gbit: only streamrec (defaults "
    "and --settings given) and the link limit through each, 1 KiB and 1 MiB records"
)

Measure = Callable[..., None]


def shape_specs(quick: bool) -> list[DataSpec]:
    shards = 4 if quick else 16
    return [DataSpec("1KiB", KIB, shards, 64 * MIB), DataSpec("1MiB", MIB, shards, 64 * MIB)]


def run_shapes(
    script: str,
    argv: Sequence[str] | None,
    shapes_text: Sequence[str],
    settings: Sequence[Settings],
    rounds: int,
    consumer_s_per_mb: float,
    measure: Measure,
    quick: bool,
    epochs: bool = False,
) -> str:
    """Measure every reader through every shape, ``rounds`` times (order rotated); return
    the README lines (printed as well)."""
    start = time.perf_counter()
    loads = [os.getloadavg()[0]]
    source = source_state()
    shapes = [netem.LinkShape.parse(text) for text in shapes_text]
    specs = shape_specs(quick)
    datasets = [ensure_dataset(spec) for spec in (specs[1:] if epochs else specs)]
    readers = [Reader("streamrec"), *(Reader("streamrec", s) for s in settings), Reader("bulk")]
    results: dict[Key, RunSamples] = {}
    with (
        tempfile.TemporaryDirectory(prefix="bench-remote-shapes-") as tmp,
        Services(Path(tmp), gcs=False, shapes=shapes, subnet=free_subnet()) as services,
    ):
        services.start()
        upload_all(script, services, datasets)
        stores = [s for s in services.stores.values() if s.link]
        for r in range(rounds):
            extra: dict[str, Any] = {}
            if consumer_s_per_mb:
                extra["consumer_s_per_mb"] = consumer_s_per_mb
            if epochs:  # which second epoch comes first alternates
                extra["epochs"] = ["fresh", "memory"] if r % 2 else ["memory", "fresh"]
            measure(stores, datasets, readers, 1, results, services.proxy_log, r, extra)
            loads.append(os.getloadavg()[0])
    lines = render(results, stores, datasets, readers, consumer_s_per_mb)
    if epochs:
        lines += ["", *render_epochs(results, stores, datasets[0], readers)]
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    head = (
        f"`{command_line('bench_remote.py', argv)}` ({when}, "
        f"{source}; {rounds} rounds, {time.perf_counter() - start:.0f} s, load "
        f"{min(loads):.1f}-{max(loads):.1f}):"
    )
    section = "\n".join([head, "", *lines])
    print(section, flush=True)
    return section


def _chosen(samples: RunSamples) -> str:
    """The block MiB / concurrency streamrec reported reading with (most common)."""
    seen = [
        f"{r['settings'].get('block_bytes', 0) / MIB:g}/{r['settings'].get('max_concurrency')}"
        for r in samples.runs
        if r.get("settings")
    ]
    return statistics.mode(seen) if seen else ""


def render(
    results: dict[Key, RunSamples],
    stores: Sequence[Store],
    datasets: Sequence[Dataset],
    readers: Sequence[Reader],
    consumer_s_per_mb: float,
) -> list[str]:
    names = [d.spec.name for d in datasets]
    lines = [
        f"| link | reader | {' | '.join(names)} |",
        "|---|---|" + "--:|" * len(names),
    ]
    for store in stores:
        for reader in readers:
            cells = []
            for data in datasets:
                s = results.get((store.key, data.spec.name, reader.label))
                limit = results.get((store.key, data.spec.name, "link limit"))
                if s is None or limit is None:
                    cells.append("")
                    continue
                med = s.median(data.nbytes)
                cell = f"{med:.0f} ({med / limit.median(data.nbytes):.2f}x)"
                growth = s.rss_growth_mib()
                if reader.kind == "streamrec" and growth is not None:
                    prefetch = reader.settings.prefetch_bytes if reader.settings else 64 * MIB
                    cell += f", RSS +{growth:.0f} MiB ({growth * MIB / prefetch:.2f}x)"
                    chosen = _chosen(s)
                    cell += f", {chosen}" if chosen and reader.settings is None else ""
                cells.append(cell)
            label = reader.label
            lines.append(f"| {store.label.removeprefix('S3 ')} | {label} | {' | '.join(cells)} |")
    if consumer_s_per_mb:
        lines.append(f"\n(streamrec consumers sleep {consumer_s_per_mb * 1000:g} ms per MB)")
    return lines


def extra_job(extra: dict[str, Any], reader: Reader) -> dict[str, Any]:
    """What a job adds for ``reader`` (the consumer's sleep is streamrec's only)."""
    return extra if reader.kind == "streamrec" else {}


def epochs_read(ds: Any, job: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    """``--epochs``: ``ds`` read three times (see the module docstring); the first epoch's
    result in ``measured_read``'s keys, and ``epochs``: name -> that epoch's numbers."""
    from streamrec.pipeline.stream.tune import LINKS, link_key

    key = link_key(job["glob"], options)
    order: Sequence[str] = job["epochs"]
    consumer_s_per_mb = float(job.get("consumer_s_per_mb", 0.0))

    def one(name: str) -> dict[str, Any]:
        ds.stats.settings.pop("tuned", None)  # (what this epoch starts with shows anew)
        before = ds.stats.bytes_read
        t0 = time.perf_counter()
        first = first_mb = None
        n = taken = slept = 0
        start: dict[str, int] = {}
        for record in ds:
            n += 1
            taken += len(record)
            if first is None:
                first = time.perf_counter()
                start = dict(ds.stats.settings)
            if first_mb is None and taken >= FIRST_MB * 10**6:
                first_mb = time.perf_counter()
            if consumer_s_per_mb and taken - slept >= 10**6:
                time.sleep(consumer_s_per_mb * (taken - slept) / 10**6)
                slept = taken
        end = time.perf_counter()
        chosen = f"{start['block_bytes'] / MIB:g}/{start['max_concurrency']}"
        return {
            "epoch": name,
            "seconds": end - t0,
            "first": (first or t0) - t0,
            "first_mb_s": FIRST_MB / ((first_mb or end) - t0),
            "mb_s": taken / 10**6 / (end - t0),
            "records": n,
            "nbytes": ds.stats.bytes_read - before,
            "start": chosen if start.get("tuned") == 2 else "defaults",
            "end": dict(ds.stats.settings),
        }

    LINKS.forget()
    learned = one("learn")
    remembered = LINKS.get(key)
    epochs = {"learn": learned}
    for number, name in enumerate(order, start=1):
        LINKS.forget()
        if name == "memory" and remembered is not None:
            LINKS.put(key, remembered)
        ds.set_epoch(number)
        epochs[name] = one(name)
    return {**learned, "epochs": epochs, "settings": dict(ds.stats.settings)}


def render_epochs(
    results: dict[Key, RunSamples],
    stores: Sequence[Store],
    data: Dataset,
    readers: Sequence[Reader],
) -> list[str]:
    """``--epochs``' table: medians over the rounds."""
    lines = [
        f"| link | reader | first {FIRST_MB} MB: learn / memory / fresh | epoch: learn / "
        "memory / fresh | memory starts at |",
        "|---|---|--:|--:|---|",
    ]
    for store in stores:
        for reader in readers:
            s = results.get((store.key, data.spec.name, reader.label))
            if reader.kind != "streamrec" or s is None:
                continue
            runs = [r["epochs"] for r in s.runs if "epochs" in r]
            if not runs:
                continue

            def med(name: str, field: str, runs: list[dict[str, Any]] = runs) -> str:
                return f"{statistics.median(r[name][field] for r in runs):.0f}"

            firsts = " / ".join(med(n, "first_mb_s") for n in ("learn", "memory", "fresh"))
            whole = " / ".join(med(n, "mb_s") for n in ("learn", "memory", "fresh"))
            starts = statistics.mode(r["memory"]["start"] for r in runs)
            label = store.label.removeprefix("S3 ")
            lines.append(f"| {label} | {reader.label} | {firsts} | {whole} | {starts} |")
    return lines
