"""Local read throughput of streamrec against the ``tfrecord`` package and a raw-read ceiling.

Run from the repository root (build the C accelerator first)::

    python setup.py build_ext --inplace
    python benchmarks/bench_local.py [--quick] [--json PATH]

What it measures, for record sizes 100 B, 1 KiB, 100 KiB and 10 MiB (one uncompressed file of
~256 MiB per size, ~32 MiB with ``--quick``, written by streamrec under ``benchmarks/data/`` and
read once untimed so that every timed read comes from the page cache):

* ``streamrec for``: ``for rec in open_dataset(path)`` (background event-loop thread), CRCs on.
* ``streamrec async for``: ``async for rec in open_dataset(path)``, CRCs on.
* ``streamrec record_chunks``: ``async for chunk in ds.record_chunks()``, counting
  ``len(chunk)``: the chunked fast path, no per-record Python work in the consumer.
* ``streamrec record_views``: ``for view in ds.record_views()``: zero-copy read-only
  memoryviews into the pieces read (CRCs on), each chunk held in the budget while viewed;
  ``streamrec async record_views``: the same with ``async for``.
* ``streamrec pure-Python``: ``streamrec for`` with ``framing._scan`` switched to the
  pure-Python fallback ``framing._scan_python`` and the direct reads of large records to their
  pure-Python twin (what users without a C compiler get).
* ``tfrecord pkg``: ``tfrecord.reader.tfrecord_iterator(path)`` from PyPI. It never checks a
  CRC (it reads the CRC fields into a scratch buffer and drops them; there is no option to
  verify) and yields a memoryview into one reused buffer, not ``bytes``: a consumer that keeps
  records must copy them. Its numbers are therefore a lower bar, not like for like.
* ``tf.data batch(1024)`` (with ``--tf-python PATH``, an interpreter with TensorFlow):
  ``tf.data.TFRecordDataset(path).batch(1024)`` iterated to the end in a subprocess of that
  interpreter, in the same rounds as the others; only the iteration is timed (inside the
  subprocess, not TensorFlow's import). TensorFlow checks both CRCs.
* ``raw read ceiling``: ``open(path, "rb", buffering=0)`` + ``readinto`` of the whole file in
  4 MiB blocks, no parsing: the most any reader can do on this machine (one copy out of the
  page cache).

``--busy N`` keeps N processes burning a core each (a busy machine) while every file is
measured; ``--sizes`` picks record sizes (bytes, comma-separated).

How to read the table: every contender runs once per round, rounds interleave the contenders
(order rotated each round) and the table shows the best and the median of the rounds, because
the machine is shared and noisy. ``MB/s`` counts file bytes (payload + 16 B framing per record,
1 MB = 10**6 B), so it is comparable with the raw ceiling; ``vs raw`` is the ratio of best times
on the same file, ``vs tfrecord`` and ``vs tf.data`` ratios of median times. ``peak RSS +MiB``
is the growth of the process' peak resident set during one read (``VmHWM`` after resetting it
through ``/proc/self/clear_refs``; Linux only, blank elsewhere). Targets apply to streamrec's C
path (rows a-c) and to Example ``decode_batch``; Example rows are bench_example.py's
measurement (``_harness/examples.py``).
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from _harness import KIB, MB, MIB
from _harness.examples import run as example_rates
from _harness.local import (
    DataFile,
    Reader,
    ensure_file,
    measure_readers,
    plan_file,
    read_async,
    read_chunks,
    read_raw,
    read_sync,
    read_views,
    read_views_async,
)
from _harness.report import command_line, cpu_model, now, publish, replace_section, source_state
from _harness.results import JSON_HELP, save_results
from _harness.stats import Timings

import streamrec
from streamrec.format import framing
from streamrec.storage.local import records

SIZES = (100, KIB, 100 * KIB, 10 * MIB)
START_MARK = "<!-- bench_local:start -->"
END_MARK = "<!-- bench_local:end -->"

# Targets: records/s for small records, file bytes/s for large ones, decode_batch records/s.
RECORD_TARGETS = {100: 1.5e6, KIB: 1.0e6}
BYTES_TARGETS = {10 * MIB: 10e9}
DECODE_BATCH_TARGET = 1.0e6
TARGETED = ("streamrec for", "streamrec async for", "streamrec record_chunks")

# ---------------------------------------------------------------- contenders


def read_pure_python(path: str) -> int:
    """streamrec, plain ``for``, with the pure-Python frame scanner instead of the C one (and
    the pure-Python direct reads of large records instead of ``storage/_cread``)."""
    saved = framing._scan, records._cread
    framing._scan, records._cread = framing._scan_python, None
    try:
        return read_sync(path)
    finally:
        framing._scan, records._cread = saved


def read_tfrecord(path: str) -> int:
    """The ``tfrecord`` PyPI package (no CRC checks, yields a reused memoryview)."""
    from tfrecord.reader import tfrecord_iterator

    n = 0
    for _ in tfrecord_iterator(path):
        n += 1
    return n


TF_LABEL = "tf.data batch(1024)"
TF_SCRIPT = """
import sys, time
import tensorflow as tf
dataset = tf.data.TFRecordDataset(sys.argv[1]).batch(1024)
t0 = time.perf_counter()
n = 0
for batch in dataset:
    n += int(batch.shape[0])
print("TFREAD", n, time.perf_counter() - t0)
"""


def tf_reader(tf_python: str) -> Reader:
    """tf.data in ``tf_python``'s subprocess: (records, seconds of the iteration alone)."""

    def read_tf(path: str) -> tuple[int, float]:
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": ""}
        done = subprocess.run(
            [tf_python, "-c", TF_SCRIPT, path],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
            env=env,
        )
        for line in done.stdout.splitlines():
            if line.startswith("TFREAD "):
                _, n, seconds = line.split()
                return int(n), float(seconds)
        raise RuntimeError(f"tf.data reader failed:\n{done.stderr[-2000:]}")

    return read_tf


def tf_available(tf_python: str | None) -> bool:
    """Whether ``tf_python`` imports TensorFlow (a note is printed when it does not)."""
    if not tf_python:
        print("no --tf-python given: the tf.data rows are left out", flush=True)
        return False
    check = subprocess.run(
        [tf_python, "-c", "import tensorflow"], capture_output=True, timeout=300, check=False
    )
    if check.returncode != 0:
        print(f"{tf_python} cannot import tensorflow: the tf.data rows are left out", flush=True)
        return False
    return True


def start_busy(n: int) -> list[subprocess.Popen[bytes]]:
    """``n`` processes burning a core each until stopped (:func:`stop_busy`)."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def stop_busy(burners: list[subprocess.Popen[bytes]]) -> None:
    for burner in burners:
        burner.kill()
        burner.wait()


@dataclass(frozen=True)
class Contender:
    """A named reader; ``crc`` says whether it verifies the record CRCs."""

    label: str
    reader: Reader
    crc: str


def contenders(tf_python: str | None = None) -> list[Contender]:
    """Everything measured per file, in table order."""
    found: list[Contender] = [
        Contender("streamrec for", read_sync, "yes"),
        Contender("streamrec async for", read_async, "yes"),
        Contender("streamrec record_chunks", read_chunks, "yes"),
        Contender("streamrec record_views", read_views, "yes"),
        Contender("streamrec async record_views", read_views_async, "yes"),
        Contender("streamrec pure-Python", read_pure_python, "yes"),
    ]
    if importlib.util.find_spec("tfrecord") is not None:
        found.append(Contender("tfrecord pkg", read_tfrecord, "**no**"))
    else:
        print("tfrecord package not installed: its rows are left out", flush=True)
    if tf_python and tf_available(tf_python):
        found.append(Contender(TF_LABEL, tf_reader(tf_python), "yes"))
    found.append(Contender("raw read ceiling", read_raw, "n/a"))
    return found


# ---------------------------------------------------------------- measuring


def measure_file(
    data: DataFile, players: Sequence[Contender], rounds: int, warm_each: bool = False
) -> list[Timings]:
    """Interleave the contenders over ``rounds`` rounds, rotating who goes first; every read
    checks the record count (the raw ceiling's excepted) and records its peak-RSS growth."""
    readers = [(p.label, p.reader) for p in players]
    path = str(data.path)
    return measure_readers(path, data.records, readers, rounds, True, warm_each)


# ---------------------------------------------------------------- reporting


def fmt_size(size: int) -> str:
    if size >= MIB:
        return f"{size // MIB} MiB"
    if size >= KIB:
        return f"{size // KIB} KiB"
    return f"{size} B"


def fmt_rate(x: float) -> str:
    if x >= 1e6:
        return f"{x / 1e6:.2f} M"
    if x >= 1e3:
        return f"{x / 1e3:.1f} k"
    return f"{x:.1f}"


def fmt_bytes_rate(bytes_per_s: float) -> str:
    if bytes_per_s >= 1e9:
        return f"{bytes_per_s / 1e9:.2f} GB/s"
    return f"{bytes_per_s / MB:.0f} MB/s"


def target_cells(label: str, size: int, rec_s: float, bytes_s: float) -> tuple[str, str]:
    """The ``target`` and ``met?`` cells of one row."""
    if label not in TARGETED:
        return "", ""
    if size in RECORD_TARGETS:
        goal = RECORD_TARGETS[size]
        return f">= {fmt_rate(goal)}rec/s", "yes" if rec_s >= goal else "**no**"
    if size in BYTES_TARGETS:
        goal = BYTES_TARGETS[size]
        return f">= {fmt_bytes_rate(goal)}", "yes" if bytes_s >= goal else "**no**"
    return "", ""


HEADER = (
    "| record | reader | CRC | records/s best | records/s median | MB/s best | MB/s median "
    "| vs raw | vs tfrecord | vs tf.data | target | met? | peak RSS +MiB |\n"
    "|---|---|---|--:|--:|--:|--:|--:|--:|--:|---|---|--:|"
)


def file_rows(
    data: DataFile, players: Sequence[Contender], results: Sequence[Timings]
) -> list[str]:
    """Markdown rows for one file."""
    by_label = {p.label: s for p, s in zip(players, results, strict=True)}
    raw = by_label["raw read ceiling"].best()
    tfr = by_label["tfrecord pkg"].median() if "tfrecord pkg" in by_label else None
    tfd = by_label[TF_LABEL].median() if TF_LABEL in by_label else None
    rows = []
    for player, samples in zip(players, results, strict=True):
        best = samples.best()
        bytes_s = data.nbytes / best
        is_raw = player.reader is read_raw
        rec_best = "" if is_raw else fmt_rate(data.records / best)
        rec_med = "" if is_raw else fmt_rate(data.records / samples.median())
        goal, met = target_cells(player.label, data.size, data.records / best, bytes_s)
        rss = "" if samples.rss_growth_kib is None else f"{samples.rss_growth_kib / KIB:.0f}"
        if player.label == TF_LABEL:
            rss = ""  # another process
        median = samples.median()
        vs_tfr = "" if tfr is None else f"{tfr / median:.2f}x"
        vs_tfd = "" if tfd is None else f"{tfd / median:.2f}x"
        rows.append(
            f"| {fmt_size(data.size)} | {player.label} | {player.crc} | {rec_best} | {rec_med} "
            f"| {bytes_s / MB:,.0f} | {data.nbytes / median / MB:,.0f} | {raw / best:.2f}x "
            f"| {vs_tfr} | {vs_tfd} | {goal} | {met} | {rss} |"
        )
    return rows


def example_rows(n: int) -> list[str]:
    """Rows for Example decoding from ``_harness.examples.run(n)`` (bench_example.py's numbers).

    Keys ending in ``_bytes`` are metadata (``payload_bytes``: the Example size), not rates.
    The ``decode_batch`` target applies to the ``decode_batch`` key only (the C parser when
    built), not to ``decode_batch_python``.
    """
    results = example_rates(n)
    payload = results.get("payload_bytes")
    size = "Example" if payload is None else f"Example {fmt_size(int(payload))}"
    rows = []
    for name, rate in results.items():
        if name.endswith("_bytes"):
            continue
        goal, met = "", ""
        if name == "decode_batch":
            goal = f">= {fmt_rate(DECODE_BATCH_TARGET)}rec/s"
            met = "yes" if rate >= DECODE_BATCH_TARGET else "**no**"
        mb_s = "" if payload is None else f"{rate * payload / MB:,.0f}"
        shown = fmt_rate(rate) if math.isfinite(rate) else "n/a"
        rows.append(f"| {size} | {name} | n/a | {shown} | | {mb_s} | | | | | {goal} | {met} | |")
    return rows


def machine_notes() -> str:
    """One line about the machine and the software versions measured."""
    cpu = cpu_model(platform.processor() or platform.machine())
    versions = []
    for pkg in ("crc32c", "tfrecord", "numpy"):
        try:
            from importlib.metadata import version

            versions.append(f"{pkg} {version(pkg)}")
        except Exception:
            continue
    return (
        f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"streamrec {streamrec.__version__} (C framing: {framing.accelerated}), "
        + ", ".join(versions)
    )


def ceiling_note(data: DataFile, players: Sequence[Contender], results: Sequence[Timings]) -> str:
    """One line on the raw ceiling of ``data``'s file and whether a bytes target can be met."""
    raw = next(s for p, s in zip(players, results, strict=True) if p.reader is read_raw)
    ceiling = data.nbytes / raw.best()
    line = f"raw ceiling at {fmt_size(data.size)}: {fmt_bytes_rate(ceiling)}"
    goal = BYTES_TARGETS.get(data.size)
    if goal is not None and goal > ceiling:
        line += (
            f" (the {fmt_bytes_rate(goal)} target is above what a bare `readinto` reaches here,"
            " so judge this row by `vs raw`)"
        )
    return line


NOTES = (
    "`tfrecord pkg` checks no CRC (it has no option to) and yields a memoryview into one "
    "reused buffer, which the consumer must copy to keep; streamrec rows verify both CRCs of "
    "every record and yield independent `bytes`."
)


def render(
    rows: Sequence[str], notes: Sequence[str], command: str, rounds: int, elapsed: float
) -> str:
    """The markdown section: command, date, machine, table, notes."""
    today = now()
    return "\n".join(
        [
            f"Command: `{command}` ({today}, {rounds} rounds, {elapsed:.0f} s in all).",
            "",
            f"Machine: {machine_notes()}.",
            "",
            f"Source: {source_state()}.",
            "",
            HEADER,
            *rows,
            "",
            *(f"* {note}" for note in (NOTES, *notes)),
        ]
    )


# ---------------------------------------------------------------- README

README_INTRO = """# streamrec benchmarks

Run from the repository root after `python setup.py build_ext --inplace`.

* `bench_local.py`: local read throughput (records/s and MB/s, CRCs on) for 100 B, 1 KiB,
  100 KiB and 10 MiB records: streamrec's sync `for`, `async for` and `record_chunks()`, the
  pure-Python fallback, the `tfrecord` PyPI package (no CRC checks), tf.data
  `TFRecordDataset(path).batch(1024)` (with `--tf-python PATH`, an interpreter with TensorFlow)
  and a raw `readinto` ceiling, interleaved in rounds; plus Example decoding from
  `bench_example.py`. `--busy N` runs N CPU burners meanwhile; `--sizes` picks record sizes.
  `python benchmarks/bench_local.py [--quick] [--out benchmarks/README.md]`; a full run takes
  about 1.5 minutes (7 rounds; 100 B records dominate), `--quick` about 10 s. Test files
  (~256 MiB per size, ~32 MiB with `--quick`) go to `benchmarks/data/` (gitignored) and are
  reused.
* `bench_example.py`: Example `decode` and `decode_batch` records/s (`run(n)`).

Machine notes: a shared 2-core Xeon VM ("Intel(R) Xeon(R) Processor"), Python 3.11, with noisy
neighbours and only ~6-9 GB/s of memory/page-cache bandwidth (the `raw read ceiling` row measures
it in every run; anything above it, such as the 10 GB/s target at 10 MiB, cannot be reached
here). Every table is one run of the command shown with it, dated; treat differences under
~10-15 % as noise. The module docstring of `bench_local.py` says what each column means.

## Local read throughput (bench_local.py)

"""


def write_readme(path: Path, section: str) -> None:
    """Replace the marked section of ``path`` (created with an intro when missing)."""
    intro = "" if path.exists() else README_INTRO
    replace_section(path, START_MARK, END_MARK, section, intro)


# ---------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="~32 MiB files, fewer rounds")
    parser.add_argument("--out", type=Path, help="write the table into this README's section")
    parser.add_argument("--json", type=Path, help=JSON_HELP)
    parser.add_argument("--rounds", type=int, help="rounds per file (default 7, 3 with --quick)")
    parser.add_argument("--tf-python", help="an interpreter with TensorFlow: tf.data rows")
    parser.add_argument("--busy", type=int, default=0, help="CPU-burning processes meanwhile")
    parser.add_argument("--sizes", help="record sizes in bytes, comma-separated (default all)")
    parser.add_argument("--no-examples", action="store_true", help="leave out the Example rows")
    parser.add_argument("--file-mib", type=int, help="MiB per file (default 256, 32 --quick)")
    parser.add_argument("--warm-each", action="store_true", help="re-read the file before each")
    parser.add_argument("--only", help="contenders to run, comma-separated labels (default all)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if not framing.accelerated:
        print(
            "warning: the C framing accelerator is not built; run "
            "`python setup.py build_ext --inplace` first",
            flush=True,
        )
    start = time.perf_counter()
    target_bytes = (args.file_mib or (32 if args.quick else 256)) * MIB
    rounds = args.rounds or (3 if args.quick else 7)
    players = contenders(args.tf_python)
    if args.only:  # (the raw ceiling always: the table's ratios need it)
        keep = {*args.only.split(","), "raw read ceiling"}
        players = [p for p in players if p.label in keep]
    rows: list[str] = []
    notes: list[str] = []
    sizes = SIZES if not args.sizes else tuple(int(x) for x in args.sizes.split(","))
    for size in sizes:
        data = plan_file(size, target_bytes)
        ensure_file(data)
        t0 = time.perf_counter()
        burners = start_busy(args.busy)
        try:
            results = measure_file(data, players, rounds, args.warm_each)
        finally:
            stop_busy(burners)
        rows += file_rows(data, players, results)
        notes.append(ceiling_note(data, players, results))
        print(
            f"  {fmt_size(size)}: {data.records} records, {time.perf_counter() - t0:.1f} s",
            flush=True,
        )
    if not args.no_examples:
        rows += example_rows(50_000 if args.quick else 200_000)
    if args.busy:
        notes.append(f"measured with {args.busy} CPU-burning processes running (`--busy`)")
    notes.append(f"load average when done: {os.getloadavg()[0]:.2f}")
    command = command_line("bench_local.py", argv)
    section = render(rows, notes, command, rounds, time.perf_counter() - start)
    publish(section, args.out, write_readme)
    sizes = f"record sizes {args.sizes}" if args.sizes else "all record sizes"
    table = f"{sizes}, {args.busy} CPU burners" if args.busy else f"{sizes}, quiet"
    save_results(args.json, "bench_local", section, [table])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
