"""Two source trees of streamrec side by side: the same benchmarks, old and new interleaved.

Run from the repository root of the *new* tree, after building the C accelerators in both::

    git worktree add /tmp/old-streamrec <old commit>
    (cd /tmp/old-streamrec && python setup.py -q build_ext --inplace)
    ln -s "$PWD/benchmarks/data" /tmp/old-streamrec/benchmarks/data   # same test files
    python benchmarks/bench_sidebyside.py --old /tmp/old-streamrec --new . --rounds 6

Every measurement is a fresh process with ``PYTHONPATH=<tree>`` (each worker checks that
``streamrec`` came from that tree). A round runs every suite once per tree, old and new back
to back, the order flipped every round (ABBA...), so slow drift on the shared machine hits both
sides alike. Suites:

* ``local``: ``<tree>/benchmarks/bench_local.py --quick`` (its own 3 inner rounds); the
  ``records/s median`` of its streamrec rows (plus ``tfrecord pkg`` as a control that does not
  depend on the tree).
* ``pipeline``: ``<tree>/benchmarks/bench_pipeline.py --quick --part a --rounds 5``; the
  ``records/s median`` of every row (``raw reader`` and ``decode_batch ceiling`` use only the
  format core).
* ``gzip``: this script's workers reading gzip copies of bench_local's ``--quick`` files
  (compressed once with Python's ``gzip`` module, level 6): ``for`` at 100 B, 1 KiB and
  100 KiB, ``async for`` at 1 KiB; best of 5 reads in the process, after one untimed read.
* ``parse``: this script's workers decoding ``Example`` records of 1 KiB and 10 KiB (a
  ``RawFeature`` of ~all the bytes plus an int64 label; 256 MiB files written once into
  ``benchmarks/data`` by the new tree) with ``open_dataset(path).parse(spec).batch(256)``,
  ``for`` and ``async for``; best of 5 reads in the process, after one untimed read, in
  records per second of wall time and (``per CPU s``) of the process's CPU time.
* ``parse-s3``: the same files and reads from SeaweedFS (``weed mini``) on loopback (S3, the
  files uploaded once per run; take ``flock /tmp/seaweed.lock`` first: fixed ports); best of 3
  reads in the process, after one untimed read.
* ``write``: this script's workers writing 200,000 records of 1 KiB (half random, half a
  repeated pattern; 4,096 distinct payloads cycled) with ``streamrec.sync.open_writer``, one
  ``write()`` per record, to a local directory: ``plain`` (one file), ``gzip`` (one file),
  ``gzip max_bytes`` (``part-{index:05d}`` shards of at most 4 MiB: ~50 shards, the encoder's
  size checks near every limit) and ``plain max_bytes`` (the same, uncompressed); time from
  ``open_writer`` to the end of ``close()``; best of 3 (plain) or 2 (gzip) in the process.

The table shows per case the median over the rounds of each side's rate and the median of the
per-round ratios new/old (> 1: new is faster), and the per-round ratios themselves.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gzip
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Not ``import _harness``: it puts this tree's streamrec first on sys.path, and this script's
# workers must import streamrec from the tree under test (``PYTHONPATH=<tree>``).
BENCH_DIR = Path(__file__).resolve().parent
DATA = BENCH_DIR / "data"
KIB = 1 << 10
MIB = 1 << 20
QUICK_FILES = {  # bench_local.py --quick's files (_harness/local.py's plan_file names them)
    100: "local-100B-32MiB.tfrecord",
    KIB: "local-1024B-32MiB.tfrecord",
    100 * KIB: "local-102400B-32MiB.tfrecord",
}
WRITE_RECORDS = 200_000
WRITE_SIZE = KIB
ROT_BYTES = 4 * MIB

GZIP_CASES = {
    "gzip 100 B for": (100, "for"),
    "gzip 1 KiB for": (KIB, "for"),
    "gzip 1 KiB async for": (KIB, "async"),
    "gzip 100 KiB for": (100 * KIB, "for"),
}
PARSE_CASES = {
    "parse 1 KiB batch(256) for": (KIB, "for"),
    "parse 1 KiB batch(256) async for": (KIB, "async"),
    "parse 10 KiB batch(256) for": (10 * KIB, "for"),
    "parse 10 KiB batch(256) async for": (10 * KIB, "async"),
}
PARSE_S3_CASES = {case.replace("parse", "parse S3", 1): how for case, how in PARSE_CASES.items()}
PARSE_FILE_BYTES = 256 * MIB
S3_ENV = "SBS_S3_ENDPOINT"  # the driver's SeaweedFS, for the parse-s3 workers
S3_BUCKET = "bench"
WRITE_CASES = {
    "write plain": (None, None),
    "write gzip": ("gzip", None),
    "write gzip max_bytes 4 MiB": ("gzip", ROT_BYTES),
    "write plain max_bytes 4 MiB": (None, ROT_BYTES),
}


# ---------------------------------------------------------------- workers (in the tree's process)


def gz_path(size: int) -> Path:
    return DATA / (QUICK_FILES[size] + ".gz")


def worker_gzip(case: str) -> dict[str, Any]:
    import streamrec

    size, mode = GZIP_CASES[case]
    path = str(gz_path(size))

    def read_for() -> int:
        n = 0
        for _ in streamrec.open_dataset(path):
            n += 1
        return n

    def read_async() -> int:
        async def consume() -> int:
            n = 0
            async for _ in streamrec.open_dataset(path):
                n += 1
            return n

        return asyncio.run(consume())

    read = read_for if mode == "for" else read_async
    records = read()  # warm-up, untimed
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        n = read()
        times.append(time.perf_counter() - t0)
        assert n == records
    return {"records": records, "seconds": times}


def parse_path(size: int) -> Path:
    return DATA / f"parse-{size}B-{PARSE_FILE_BYTES // MIB}MiB.tfrecord"


def parse_spec(size: int) -> dict[str, Any]:
    import numpy as np

    from streamrec.example import FixedLenFeature, RawFeature

    body = size - (43 if size > 4 * KIB else 39)  # the Example's own framing taken off
    return {"data": RawFeature(np.uint8, (body,)), "label": FixedLenFeature(np.int64)}


def write_parse_files() -> dict[str, Any]:
    import numpy as np

    import streamrec.sync
    from streamrec.example import encode

    rng = np.random.default_rng(1)
    for size in sorted({size for size, _ in PARSE_CASES.values()}):
        path = parse_path(size)
        if path.exists():
            continue
        (body,) = parse_spec(size)["data"].shape
        pool = [
            encode({"data": rng.bytes(body), "label": np.array([i], dtype=np.int64)})
            for i in range(256)
        ]
        assert abs(len(pool[0]) - size) <= 8, (len(pool[0]), size)  # (~size: varints)
        with streamrec.sync.open_writer(str(path) + ".part") as w:
            for i in range(PARSE_FILE_BYTES // (size + 16)):
                w.write(pool[i & 255])
        os.replace(str(path) + ".part", path)
    return {"records": 0, "seconds": [1.0]}


def s3_options(endpoint: str) -> dict[str, Any]:
    return {"key": "k", "secret": "s", "client_kwargs": {"endpoint_url": endpoint}}


def worker_parse(case: str) -> dict[str, Any]:
    import streamrec

    s3 = case in PARSE_S3_CASES
    size, mode = PARSE_S3_CASES[case] if s3 else PARSE_CASES[case]
    path, spec = str(parse_path(size)), parse_spec(size)
    options: dict[str, Any] = {}
    if s3:
        path = f"s3://{S3_BUCKET}/{parse_path(size).name}"
        options["storage_options"] = s3_options(os.environ[S3_ENV])

    def read_for() -> int:
        n = 0
        for batch in streamrec.open_dataset(path, **options).parse(spec).batch(256):
            n += len(batch["label"])
        return n

    def read_async() -> int:
        async def consume() -> int:
            n = 0
            async for batch in streamrec.open_dataset(path, **options).parse(spec).batch(256):
                n += len(batch["label"])
            return n

        return asyncio.run(consume())

    read = read_for if mode == "for" else read_async
    records = read()  # warm-up, untimed
    times, cpu = [], []
    for _ in range(3 if s3 else 5):
        t0, c0 = time.perf_counter(), time.process_time()
        n = read()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        assert n == records
    return {"records": records, "seconds": times, "cpu_seconds": cpu}


def payload_pool() -> list[bytes]:
    rng = __import__("random").Random(1)
    half = WRITE_SIZE // 2
    pattern = (b"streamrec-" * (half // 10 + 1))[: WRITE_SIZE - half]
    return [rng.randbytes(half) + pattern for _ in range(4096)]


def worker_write(case: str) -> dict[str, Any]:
    import streamrec.sync

    compression, max_bytes = WRITE_CASES[case]
    pool = payload_pool()
    reps = 2 if compression else 3
    times = []
    shards = 0
    for _ in range(reps):
        out = Path(tempfile.mkdtemp(prefix="sbs-write-"))
        try:
            options: dict[str, Any] = {"compression": compression}
            if max_bytes:
                options["max_bytes"] = max_bytes
                template = str(out / "part-{index:05d}.tfrecord")
            else:
                template = str(out / "one.tfrecord")
            t0 = time.perf_counter()
            with streamrec.sync.open_writer(template, **options) as w:
                for i in range(WRITE_RECORDS):
                    w.write(pool[i & 4095])
            times.append(time.perf_counter() - t0)
            shards = len([p for p in out.iterdir() if p.name.endswith(".tfrecord")])
        finally:
            shutil.rmtree(out, ignore_errors=True)
    return {"records": WRITE_RECORDS, "seconds": times, "shards": shards}


def worker_main(case: str, tree: str) -> int:
    import streamrec

    origin = str(Path(streamrec.__file__).resolve())
    if not origin.startswith(str(Path(tree).resolve()) + os.sep):
        raise SystemExit(f"streamrec imported from {origin}, not from {tree}")
    if case in GZIP_CASES:
        result = worker_gzip(case)
    elif case in PARSE_CASES or case in PARSE_S3_CASES:
        result = worker_parse(case)
    elif case == "parse-files":
        result = write_parse_files()
    else:
        result = worker_write(case)
    result["streamrec"] = origin
    print(json.dumps(result))
    return 0


# ---------------------------------------------------------------- driver


def run(tree: Path, argv: list[str], timeout: float = 300) -> str:
    env = dict(os.environ, PYTHONPATH=str(tree))
    proc = subprocess.run(
        [sys.executable, *argv],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode:
        raise SystemExit(f"{argv} in {tree} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


UNITS = {"": 1.0, "k": 1e3, "M": 1e6}


def parse_rate(cell: str) -> float:
    m = re.fullmatch(r"\s*([\d.,]+)\s*([kM]?)\s*", cell)
    if not m:
        raise ValueError(cell)
    return float(m.group(1).replace(",", "")) * UNITS[m.group(2)]


def suite_local(tree: Path) -> dict[str, float]:
    out = run(tree, ["benchmarks/bench_local.py", "--quick"])
    rates: dict[str, float] = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        wanted = cells[1].startswith(("streamrec", "tfrecord")) if len(cells) > 5 else False
        if wanted and cells[0] != "record":
            rates[f"local {cells[0]} {cells[1]}"] = parse_rate(cells[4])  # records/s median
    return rates


def suite_pipeline(tree: Path) -> dict[str, float]:
    out = run(tree, ["benchmarks/bench_pipeline.py", "--quick", "--part", "a", "--rounds", "5"])
    rates: dict[str, float] = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 7 and cells[0].startswith("1 KiB"):
            rates[f"pipeline {cells[0]}: {cells[1]}"] = parse_rate(cells[3])
    return rates


def suite_workers(tree: Path, cases: dict[str, Any]) -> dict[str, float]:
    rates = {}
    for case in cases:
        out = run(tree, [str(Path(__file__).resolve()), "--worker", case, "--tree", str(tree)])
        result = json.loads(out.strip().splitlines()[-1])
        rates[case] = result["records"] / min(result["seconds"])
        if "cpu_seconds" in result:  # (less at the mercy of a shared machine than wall time)
            rates[f"{case}, per CPU s"] = result["records"] / min(result["cpu_seconds"])
    return rates


SUITES: dict[str, Callable[[Path], dict[str, float]]] = {
    "local": suite_local,
    "pipeline": suite_pipeline,
    "gzip": lambda tree: suite_workers(tree, GZIP_CASES),
    "parse": lambda tree: suite_workers(tree, PARSE_CASES),
    "parse-s3": lambda tree: suite_workers(tree, PARSE_S3_CASES),
    "write": lambda tree: suite_workers(tree, WRITE_CASES),
}


def ensure_gzip_files() -> None:
    for size, name in QUICK_FILES.items():
        src, dst = DATA / name, gz_path(size)
        if not src.exists():
            raise SystemExit(f"{src} missing: run benchmarks/bench_local.py --quick once first")
        if dst.exists() and dst.stat().st_mtime >= src.stat().st_mtime:
            continue
        with open(src, "rb") as f, gzip.open(dst, "wb", compresslevel=6) as g:
            shutil.copyfileobj(f, g, 4 * MIB)


def start_seaweed(stack: contextlib.ExitStack) -> None:
    """SeaweedFS on loopback for the parse-s3 suite, the parse files uploaded; its endpoint
    in ``S3_ENV`` for the workers (stopped when ``stack`` closes)."""
    import boto3
    from _harness.servers import Services  # (the driver only: workers import no _harness)

    workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="sbs-weed-")))
    services = stack.enter_context(Services(workdir, gcs=False, link=False))
    services.start()
    endpoint = services.stores["s3-lo"].endpoint
    s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="k", aws_secret_access_key="s")
    for size in sorted({size for size, _ in PARSE_S3_CASES.values()}):
        path = parse_path(size)
        s3.upload_file(str(path), S3_BUCKET, path.name)
        got = s3.head_object(Bucket=S3_BUCKET, Key=path.name)["ContentLength"]
        if got != path.stat().st_size:
            raise SystemExit(f"upload of {path}: {got} bytes arrived")
    os.environ[S3_ENV] = endpoint


def fmt(x: float) -> str:
    for div, unit in ((1e6, " M"), (1e3, " k")):
        if x >= div:
            return f"{x / div:.3g}{unit}"
    return f"{x:.3g}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--old", type=Path)
    parser.add_argument("--new", type=Path, default=BENCH_DIR.parent)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--suites", default="local,pipeline,gzip,write")
    parser.add_argument("--json", type=Path, help="also save every round's rates here")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--tree", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker_main(args.worker, args.tree)
    if args.old is None:
        parser.error("--old is required")
    suites = args.suites.split(",")
    trees = {"old": args.old.resolve(), "new": args.new.resolve()}
    if "gzip" in suites:
        ensure_gzip_files()
    if "parse" in suites or "parse-s3" in suites:  # (written by the new tree's streamrec)
        run(trees["new"], [__file__, "--worker", "parse-files", "--tree", str(trees["new"])], 900)
    with contextlib.ExitStack() as stack:
        if "parse-s3" in suites:
            start_seaweed(stack)
        return measure(args, suites, trees)


def measure(args: argparse.Namespace, suites: list[str], trees: dict[str, Path]) -> int:
    samples: dict[str, dict[str, list[float]]] = {"old": {}, "new": {}}
    t_start = time.perf_counter()
    for r in range(args.rounds):
        order = ["old", "new"] if r % 2 == 0 else ["new", "old"]
        for suite in suites:
            for side in order:
                t0 = time.perf_counter()
                for case, rate in SUITES[suite](trees[side]).items():
                    samples[side].setdefault(case, []).append(rate)
                print(
                    f"round {r + 1} {suite:8} {side}: {time.perf_counter() - t0:5.1f} s "
                    f"(load {os.getloadavg()[0]:.2f})",
                    flush=True,
                )
    if args.json:
        args.json.write_text(json.dumps(samples, indent=1))
    print(f"\n{args.rounds} rounds, {time.perf_counter() - t_start:.0f} s in all\n")
    print("| case | old median | new median | new/old (median of rounds) | per round |")
    print("|---|--:|--:|--:|---|")
    for case, old in samples["old"].items():
        new = samples["new"].get(case, [])
        ratios = [n / o for n, o in zip(new, old, strict=True)]
        print(
            f"| {case} | {fmt(statistics.median(old))} | {fmt(statistics.median(new))} | "
            f"{statistics.median(ratios):.2f} | {' '.join(f'{x:.2f}' for x in ratios)} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
