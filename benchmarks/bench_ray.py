"""Ray Data reading TFRecord shards: ``streamrec.interop.ray.read_tfrecords`` against what Ray
offers on the same files without TensorFlow, on a local Ray cluster.

The files: ``--shards`` (8) local shards of 1 KiB Examples (``_harness/examples.py``: an int64
label, 64 float32 values, raw bytes), ``--records`` (200,000) in all, indexed (so streamrec's
read tasks are record ranges). Each round materializes the whole dataset decoded into columns
(``ds.materialize()``, Arrow blocks in Ray's object store) and counts its rows and the sum of
its labels: both readers must give the same. A first round, not timed, starts Ray's workers.
Each pair runs with the readers' default blocks (Ray's: 200 or more, its tasks' output split to
reach them; streamrec's: a read task per 16 MiB stored or more, at most Ray's count, and Ray
asked for exactly those) and with ``override_num_blocks=--blocks`` (8).

* **streamrec**: ``read_tfrecords(glob, spec=spec)`` (every CRC checked, the C decoder).
* **Ray's read_tfrecords**: it imports TensorFlow in its read tasks (to parse the Examples
  with ``tf.train.Example``; Ray 2.60 has no tfx-bsl path any more) and builds an Arrow table
  per record; without TensorFlow it fails (``ModuleNotFoundError``). The script records
  whether it ran; where it runs (a Python with ``tensorflow-cpu``; see benchmarks/README.md) it
  is timed beside the others, on the same files, with the same check of rows and labels.
* **Ray without TensorFlow**: ``ray.data.read_binary_files`` (one row of bytes per file) and a
  ``flat_map`` that frames the records in Python (``struct``, as Ray's TFRecord reader does;
  no CRC checked) and parses each Example with protobuf into a row of columns (as Ray's
  reader converts ``tf.train.Example`` s).

Usage: ``python benchmarks/bench_ray.py [--records N] [--shards N] [--rounds N] [--cpus N]
[--blocks N] [--json benchmarks/results/bench_ray.json]``.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import struct
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import ray
from _harness.examples import make_payloads, spec_for
from _harness.report import cpu_model, now, source_state
from _harness.results import JSON_HELP, dumps, save_results

import streamrec
from streamrec.cli import main as streamrec_command
from streamrec.format.proto import example_pb2
from streamrec.interop.ray import read_tfrecords

CHART = {"value": "records/s median", "label": ["reader"]}
TITLE = "Ray Data: streamrec's read_tfrecords against Ray without (and with) TensorFlow"
BASELINE = "Ray read_binary_files + Python framing + protobuf"
RAY_TF = "Ray read_tfrecords (TensorFlow)"


def write_files(directory: Path, records: int, shards: int) -> str:
    payloads = make_payloads(records)
    per_shard = -(-records // shards)
    for shard in range(shards):
        with streamrec.sync.open_writer(str(directory / f"part-{shard:05d}.tfrecord")) as writer:
            writer.write_many(payloads[shard * per_shard : (shard + 1) * per_shard])
    pattern = str(directory / "part-*.tfrecord")
    streamrec_command(["index", "--no-progress", pattern])
    return pattern


def parse_file(row: dict[str, Any]) -> list[dict[str, Any]]:
    """One file's records as rows: Python framing (no CRC) and protobuf Examples."""
    data, rows, offset = row["bytes"], [], 0
    while offset < len(data):
        (length,) = struct.unpack_from("<Q", data, offset)
        payload = data[offset + 12 : offset + 12 + length]
        offset += 12 + length + 4
        example = example_pb2.Example.FromString(payload)
        features = example.features.feature
        rows.append(
            {
                "label": features["label"].int64_list.value[0],
                "values": list(features["values"].float_list.value),
                "data": features["data"].bytes_list.value[0],
            }
        )
    return rows


def summary(dataset: ray.data.Dataset) -> tuple[float, int, int]:
    """Seconds to materialize it, its rows and the sum of their labels.

    The sum is taken here, block by block from the object store, not by ``Dataset.sum``: that
    starts hash-aggregation actors whose teardown ran into the next reader's timed round
    (measured: 8 blocks of streamrec 0.6-0.9 s alone, 5.9-7.3 s after a ``sum``)."""
    started = time.perf_counter()
    done = dataset.materialize()
    seconds = time.perf_counter() - started
    tables = [ray.get(ref) for ref in done.to_arrow_refs()]
    labels = sum(pc.sum(table["label"]).as_py() or 0 for table in tables)
    return seconds, sum(table.num_rows for table in tables), int(labels)


def ray_read_tfrecords(pattern: str) -> str:
    """Whether Ray's own read_tfrecords runs here (its error when it does not)."""
    try:
        ray.data.read_tfrecords(sorted(glob.glob(pattern))).take(1)
    except Exception as error:  # its task's error, re-raised by Ray
        cause = str(error).strip().splitlines()[-1]
        return f"fails without TensorFlow: {cause[:120]}"
    return "runs"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--blocks", type=int, default=8, help="override_num_blocks of the 2nd pair")
    parser.add_argument("--json", type=Path, help=JSON_HELP)
    args = parser.parse_args()
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        pattern = write_files(Path(tmp), args.records, args.shards)
        spec = spec_for(next(iter(streamrec.open_dataset(pattern))))
        ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
        ray.data.DataContext.get_current().enable_progress_bars = False
        files = sorted(glob.glob(pattern))  # the shards (not their .idx)

        def ours(blocks: int | None) -> ray.data.Dataset:
            return read_tfrecords(pattern, spec=spec, override_num_blocks=blocks)

        def theirs(blocks: int | None) -> ray.data.Dataset:
            return ray.data.read_binary_files(files, override_num_blocks=blocks).flat_map(
                parse_file
            )

        def ray_own_reader(blocks: int | None) -> ray.data.Dataset:
            return ray.data.read_tfrecords(files, override_num_blocks=blocks)

        ray_own = ray_read_tfrecords(pattern)
        readers = {}
        for blocks in (None, args.blocks):
            setting = "default blocks" if blocks is None else f"{blocks} blocks"
            readers[f"streamrec read_tfrecords(spec), {setting}"] = partial(ours, blocks)
            readers[f"{BASELINE}, {setting}"] = partial(theirs, blocks)
            if ray_own == "runs":  # TensorFlow is installed here
                readers[f"{RAY_TF}, {setting}"] = partial(ray_own_reader, blocks)
        times: dict[str, list[float]] = {name: [] for name in readers}
        outcome: dict[str, tuple[int, int]] = {}
        for make in readers.values():  # Ray starts its worker processes: not timed
            summary(make())
        for _ in range(args.rounds):
            for name, make in readers.items():  # alternating: drift hits both alike
                seconds, rows, labels = summary(make())
                times[name].append(seconds)
                outcome[name] = (rows, labels)
                print(f"{name}: {rows:,} rows in {seconds:.2f} s", flush=True)
        ray.shutdown()
    assert len(set(outcome.values())) == 1, outcome  # the same rows from all
    rows_total = next(iter(outcome.values()))[0]
    lines = []
    for name, seconds in times.items():
        median = statistics.median(seconds)
        setting = name.rpartition(", ")[2]
        base = statistics.median(times[f"{BASELINE}, {setting}"])
        with_tf = ""
        if ray_own == "runs":
            with_tf = f" {statistics.median(times[f'{RAY_TF}, {setting}']) / median:.2f}x |"
        lines.append(
            f"| {name} | {rows_total:,} | {median:.2f} | {rows_total / median:,.0f} "
            f"| {base / median:.2f}x |{with_tf}"
        )
    tf_column = (" vs Ray read_tfrecords with TF |", "--:|") if ray_own == "runs" else ("", "")
    command = (
        f"python benchmarks/bench_ray.py --records {args.records} --shards {args.shards} "
        f"--rounds {args.rounds} --cpus {args.cpus} --blocks {args.blocks}"
    )
    section = "\n".join(
        [
            f"Command: `{command}` ({now()}, {time.monotonic() - started:.0f} s in all, "
            f"load {os.getloadavg()[0]:.1f} at the end).",
            "",
            f"Machine: {cpu_model('unknown CPU')}, {os.cpu_count()} cores, Ray {ray.__version__}"
            f" (num_cpus={args.cpus}).",
            "",
            f"Source: {source_state()}. Local files, page cache warm.",
            "",
            f"| reader | records | s median | records/s median | vs Ray without TF |{tf_column[0]}",
            f"|---|--:|--:|--:|--:|{tf_column[1]}",
            *lines,
            "",
            f"Ray's own read_tfrecords on the same files: {ray_own}.",
        ]
    )
    print(section)
    save_results(args.json, "bench_ray", section, ["Ray Data: TFRecord reads"])
    if args.json is not None:  # a new results file gets its chart entry; Ray's outcome a note
        doc = json.loads(args.json.read_text())
        for table in doc["tables"]:
            table.setdefault("chart", CHART)
            table["notes"] = [f"Ray's own read_tfrecords: {ray_own}"]
        doc["title"] = TITLE
        args.json.write_text(dumps(doc))


if __name__ == "__main__":
    main()
