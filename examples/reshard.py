"""Reshard a small dataset: many small shards -> a few gzip shards, then resume a killed run.

    python examples/reshard.py

Writes 10 small input shards to a temporary directory and reshards them into gzip shards of at
most 8 KiB with ``streamrec.reshard.job.reshard``. The first run is interrupted after two of its
tasks (as Ctrl-C or a preempted machine would); the second run, the same call, skips the
finished tasks and does the rest. It prints the summary and the manifest and checks that every
record arrived exactly once. The same call works store to store: pass
``s3://...`` / ``gs://...`` urls and ``src_storage_options`` / ``dst_storage_options``; add
``engine="dask"`` to spread the tasks over a Dask cluster. The command-line twin is
``streamrec reshard 'in/*.tfrecord' 'out/part-{index:05d}.tfrecord.gz' --max-bytes 8KiB
--compression gzip``.
"""

from __future__ import annotations

import collections
import json
import tempfile
from pathlib import Path
from typing import Any

import streamrec
from streamrec.example import encode
from streamrec.reshard import ReshardProgress, ReshardSummary, reshard


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="streamrec-reshard-") as tmp:
        root = Path(tmp)
        # 10 input shards of 200 Examples each
        payloads = [
            encode({"label": i % 10, "text": f"record number {i} ".encode() * 8})
            for i in range(2000)
        ]
        with streamrec.sync.open_writer(
            str(root / "in" / "train-{index:05d}-of-{num_shards:05d}.tfrecord"),
            num_shards=10,
            order="contiguous",
            total_records=len(payloads),
        ) as writer:
            writer.write_many(payloads)

        def run(progress: Any) -> ReshardSummary:
            return reshard(
                str(root / "in" / "train-*.tfrecord"),
                str(root / "out" / "part-{index:05d}.tfrecord.gz"),
                max_bytes=8 << 10,
                compression="gzip",
                task_bytes=128 << 10,  # small tasks, to show several (default: 256 MiB of input)
                shuffle=True,
                seed=42,
                progress=progress,
            )

        def interrupt_after_two_tasks(progress: ReshardProgress) -> None:
            if progress.tasks_done == 2:
                raise KeyboardInterrupt  # what Ctrl-C does to a running reshard

        try:
            run(interrupt_after_two_tasks)
        except KeyboardInterrupt:
            print("first run interrupted after 2 tasks; running the same call again")
        summary = run(False)
        print(f"second run: {summary.tasks_skipped} of {summary.tasks} tasks already done")
        assert summary.tasks_skipped == 2, "the rerun redid finished tasks"
        inputs = len(list(root.glob("in/train-*")))
        print(
            f"{summary.records} records: {summary.bytes_in:,} B in {inputs}"
            f" shards -> {summary.bytes_out:,} B in {len(summary.shards)} gzip shards "
            f"({summary.tasks} task(s), {summary.seconds:.2f} s, {summary.mb_per_s:.1f} MB/s)"
        )
        for url in summary.shards:
            print("  ", Path(url).relative_to(root))
        manifest = json.loads(Path(summary.manifest_url).read_text())
        print(f"manifest: {manifest['num_shards']} shards, {manifest['records']} records")

        copied = collections.Counter(streamrec.open_dataset(summary.shards))
        assert copied == collections.Counter(payloads), "records lost or duplicated"
        print("every record is there exactly once (every CRC verified on the way)")


if __name__ == "__main__":
    main()
