"""Scale: time to the first record, memory and state size of every indexed mode on datasets of
thousands of shards and tens of millions of records, with the dataset index and without it.

Run from the repository root after building the C accelerators::

    python setup.py build_ext --inplace
    python benchmarks/bench_scale.py [--cases 20k,25m] [--rounds 3] [--json PATH]
    python benchmarks/bench_scale.py --s3 [--s3-shards 2000,5000] [--rounds 3] [--json PATH]
        [--s3-consumers 8] [--s3-index dataset]

Datasets (written once under ``benchmarks/data/scale-*`` by ``open_writer(..., index=True)``:
shards, their ``.idx`` sidecars, ``_manifest.json`` and ``_dataset_index.bin``):

* ``20k``: 20,000 shards x 128 records of 1 KiB (framed), 2.56 M records, 2.6 GB;
* ``25m``: 1,000 shards x 25,600 records of 100 B, 25.6 M records, 2.6 GB;
* ``1k``: 1,000 shards x 128 records of 1 KiB (``--quick``).

Every measurement is a fresh process (warm page cache): one consumer of ``num_hosts=8``
(``host_index=3``) opens the directory and takes its first record, in each mode:
``global`` (``shuffle="global"``), ``block`` (``shuffle="block"``), ``even``
(``even="drop"``), ``get`` (``ds.get([i])``, a random ``i``), ``len`` (``len(ds)``) and
``resume`` (``load_state_dict`` of a state taken after 1,000 global records by another
process, then the first record) and ``epoch2`` (a global shuffle's second epoch in the same
process, timed from ``set_epoch(1)``). Columns: ``s`` the seconds from ``open_dataset`` to that
record (median of the rounds), ``MiB`` the growth of peak RSS over the process's RSS before
``open_dataset`` (median), ``state B`` the JSON size of ``state_dict()`` after the first record.
``fetched / read`` (global, epoch2): over the first 2,000 records, the bytes fetched for
records (``stats.bytes_fetched - stats.bytes_checked``) over the records' bytes
(``bytes_read``); ``checked MiB``: the bytes read to check the index's boundaries
(``bytes_checked``, once per shard prefix and process). ``index`` is ``dataset`` (the dataset
index, as written) or ``sidecars`` (the same directory
with ``_dataset_index.bin`` moved aside: what streamrec did before it); ``x`` is sidecars
seconds / dataset seconds. The probe is ``_harness/scale_probe.py``.

``--s3`` (root: the emulated link) runs the S3 part instead (with ``--cases`` as well):
2,000 shards (``--s3-shards``) of the same 1 KiB records in SeaweedFS behind the emulated
60 ms link, 1 and 8 consumer processes and a DataLoader of 4 workers, every request counted
by kind at a proxy; ``_harness/scale_s3.py`` says what each column is.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _harness import DATA_DIR as DATA
from _harness.results import JSON_HELP, save_results
from _harness.scale_probe import probe_command, probe_env
from _harness.scale_s3 import run_s3

CASES = {  # name: (shards, records a shard, framed bytes a record)
    "1k": (1_000, 128, 1024),
    "20k": (20_000, 128, 1024),
    "25m": (1_000, 25_600, 100),
}
LABELS = {"1k": "1k shards", "20k": "20k shards", "25m": "25.6M records"}
MODES = ("global", "block", "even", "get", "len", "resume", "epoch2")
INDEX = "_dataset_index.bin"


def build(name: str) -> Path:
    """The dataset ``name``, written once."""
    shards, per_shard, framed = CASES[name]
    directory = DATA / f"scale-{name}"
    if (directory / "_manifest.json").exists():
        return directory
    import streamrec

    directory.mkdir(parents=True, exist_ok=True)
    payload = framed - 16 - 10
    started = time.perf_counter()
    with streamrec.sync.open_writer(
        str(directory / "part-{index:06d}.tfrecord"), max_records=per_shard, index=True
    ) as writer:
        for k in range(shards):
            writer.write_many(
                [b"%010d" % (k * per_shard + j) + b"x" * payload for j in range(per_shard)]
            )
            if k % 500 == 499:
                print(f"  {name}: {k + 1} shards written", file=sys.stderr)
    print(f"  {name}: written in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return directory


def probe(directory: Path, mode: str, state: Path) -> dict[str, float]:
    """One fresh process (``_harness/scale_probe.py``): consumer 3 of 8, ``mode``."""
    job = {
        "url": str(directory),
        "mode": mode,
        "state": str(state),
        "loader": 0,
        "options": {"num_hosts": 8, "host_index": 3, "seed": 1},
    }
    run = subprocess.run(
        probe_command(job), capture_output=True, text=True, check=False, env=probe_env()
    )
    if run.returncode:
        raise RuntimeError(f"{mode} on {directory}: {run.stderr[-2000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


Runs = dict[str, dict[str, list[dict[str, float]]]]  # index kind -> mode -> each round's


def measure(directory: Path, modes: list[str], rounds: int) -> Runs:
    found: Runs = {"dataset": {}, "sidecars": {}}
    state = directory.parent / f"{directory.name}-state.json"
    index, aside = directory / INDEX, directory.parent / f"{directory.name}{INDEX}.aside"
    for round_ in range(rounds):
        order = ["dataset", "sidecars"] if round_ % 2 == 0 else ["sidecars", "dataset"]
        for kind in order:
            if kind == "sidecars":
                index.rename(aside)
            try:
                if "resume" in modes:
                    probe(directory, "save", state)
                for mode in random.Random(round_).sample(modes, len(modes)):
                    got = probe(directory, mode, state)
                    found[kind].setdefault(mode, []).append(got)
                    print(
                        f"  round {round_} {kind:8} {mode:6} {got['s']:7.2f} s "
                        f"{got['mib']:8.1f} MiB  state {got['state']} B",
                        file=sys.stderr,
                    )
            finally:
                if kind == "sidecars":
                    aside.rename(index)
    return found


def table(name: str, found: Runs) -> list[list[str]]:
    rows = []
    for mode in MODES:
        if mode not in found["dataset"]:
            continue
        new, old = found["dataset"][mode], found["sidecars"][mode]

        def median(runs: list[dict[str, float]], key: str) -> float:
            return statistics.median(run[key] for run in runs)

        rows.append(
            [
                LABELS[name],
                mode,
                f"{median(new, 's'):.2f}",
                f"{median(new, 'mib'):.0f}",
                f"{median(old, 's'):.2f}",
                f"{median(old, 'mib'):.0f}",
                f"{median(old, 's') / max(median(new, 's'), 1e-9):.1f}x",
                f"{median(new, 'state'):.0f}",
                f"{median(new, 'fetched'):.2f}x" if "fetched" in new[0] else "",
                f"{median(new, 'checked_mib'):.0f}" if "checked_mib" in new[0] else "",
            ]
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cases", help="of " + ", ".join(CASES) + " (default 20k,25m; none with --s3)"
    )
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="the 1k case, one round")
    parser.add_argument(
        "--s3",
        action="store_true",
        help="S3 through the emulated link: 1 and 8 consumers and a DataLoader (needs root)",
    )
    parser.add_argument(
        "--s3-shards", default="2000", help="the S3 datasets' shard counts, e.g. 2000,5000"
    )
    parser.add_argument(
        "--s3-consumers", default="", help="with --s3: only these consumer sets, e.g. 8"
    )
    parser.add_argument(
        "--s3-index", default="dataset,sidecars", help="with --s3: dataset, sidecars or both"
    )
    parser.add_argument("--json", metavar="PATH", type=Path, help=JSON_HELP)
    args = parser.parse_args()
    cases = ["1k"] if args.quick else (args.cases or ("" if args.s3 else "20k,25m")).split(",")
    rounds = 1 if args.quick else args.rounds
    modes = args.modes.split(",")
    sections, names = [], []
    rows: list[list[str]] = []
    for name in filter(None, cases):
        directory = build(name)
        rows += table(name, measure(directory, modes, rounds))
    if rows:
        header = [
            "case",
            "mode",
            "dataset index s",
            "dataset MiB",
            "sidecars s",
            "sidecars MiB",
            "x",
            "state B",
            "fetched / read",
            "checked MiB",
        ]
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        sections.append("\n".join(lines))
        names.append("first record")
    if args.s3:
        shard_counts = [int(n) for n in args.s3_shards.split(",")]
        chosen = [label for label in args.s3_consumers.split(",") if label]
        indexes = [index for index in args.s3_index.split(",") if index]
        sections.append(run_s3(shard_counts, modes, rounds, chosen, indexes))
        for n in shard_counts:
            names += [f"S3 {n:,} shards", f"S3 {n:,} shards, 8 consumers' requests by object"]
    section = "\n\n".join(sections)
    print(section)
    command = "python benchmarks/bench_scale.py " + " ".join(sys.argv[1:])
    save_results(args.json, "bench_scale", section, names, command)


if __name__ == "__main__":
    main()
