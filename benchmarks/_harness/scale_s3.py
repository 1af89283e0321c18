"""bench_scale.py --s3: time to the first record and requests at startup of every indexed mode
on 2,000 (``--s3-shards 5000``: 5,000) S3 shards behind the emulated 60 ms link.

The dataset: shards of 128 records of 1 KiB (framed), written once per run by
``open_writer("s3://bench/scale-N/part-{index:06d}.tfrecord", max_records=128, index=True)``
into a fresh SeaweedFS (``_manifest.json``, ``.idx`` sidecars, ``_dataset_index.bin``). The
consumers open the directory ``s3://bench/scale-N`` through the emulated link (netem.py:
60 ms round trips, 25 MB/s per connection; SeaweedFS set up as bench_random_access does), with
a :class:`~_harness.counting_proxy.CountingProxy` in front of the link that counts every
request by kind.

Consumers (the ``consumers`` column), each a fresh ``python -c`` process
(``_harness/scale_probe.py``), ``num_hosts=8``, ``seed=1``, ``cache_dir`` a fresh
temporary directory per job (``cache_bytes`` 1 GiB), shared by the job's processes (one host):

* ``1``: consumer ``host_index=3``;
* ``8``: consumers 0-7, started together (each imports, then all are released at once);
* ``DataLoader 4``: consumer 3 in a ``DataLoader`` of 4 workers (``streamrec.torch``; see
  ``scale_probe.py`` for ``get``, ``len``, and ``resume`` through ``StatefulDataLoader``).

Modes as in the local part; ``resume`` loads a state saved (after 1,000 global records) by
another job of the same consumers, in a fresh cache directory (a restarted job on a new host).
``index``: ``dataset`` (as written) or ``sidecars`` (``_dataset_index.bin`` deleted from the
bucket, put back after). Columns: ``s`` seconds from ``open_dataset`` to the first record
(the largest over the job's consumers; median of the rounds); ``HEAD``/``GET``/``LIST``/``other``
and ``requests``: requests the whole job sent (every process) from the release until its
last consumer had its first record (an early consumer's read-ahead meanwhile included; the
arrival times at the counting proxy), median of the rounds; ``shard GETs`` those of them
that read shard bytes (records, and the checks of the index against the shard's framing:
data, not metadata; the target is checked on all requests and on the rest); ``in all``
every request until the job's processes ended (each closes its iterator after its first
record: read-ahead in flight); ``MiB`` peak RSS growth (largest consumer, median);
``state B`` the JSON size of ``state_dict()`` (largest consumer; none through a loader). The
targets (issue 31): 8 consumers' requests <= 8 x 20 + 4 per 1,000 shards; global and resume
first record <= 3 s. A second table breaks the 8 consumers' requests down by object.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from . import BUCKET
from .counting_proxy import KINDS, CountingProxy
from .indexed import link_note, link_services
from .scale_probe import probe_command, probe_env
from .servers import storage_options

__all__ = ["Consumers", "run_s3"]

RECORDS, FRAMED = 128, 1024
INDEX = "_dataset_index.bin"
JOB_TIMEOUT = 600.0
CACHE_BYTES = 1 << 30


@dataclass(frozen=True)
class Consumers:
    label: str
    hosts: tuple[int, ...]  # host_index of each process
    loader: int = 0  # DataLoader workers (0: none)


CONSUMERS = (
    Consumers("1", (3,)),
    Consumers("8", tuple(range(8))),
    Consumers("DataLoader 4", (3,), loader=4),
)


@dataclass
class Sample:
    """One job: its consumers' results and the requests it sent."""

    seconds: float
    mib: float
    state: int | None
    requests: Counter[tuple[str, str]]  # until the job's last consumer had its first record
    after: int  # all requests, until its last process ended


Runs = dict[tuple[str, str, str], list[Sample]]  # (consumers, mode, index) -> rounds


def write_dataset(endpoint: str, shards: int) -> str:
    """The shards, their sidecars, manifest and dataset index, written by streamrec into the
    loopback SeaweedFS; the directory url."""
    import streamrec.sync

    url = f"s3://{BUCKET}/scale-{shards}"
    payload = FRAMED - 16 - 10
    started = time.perf_counter()
    with streamrec.sync.open_writer(
        url + "/part-{index:06d}.tfrecord",
        max_records=RECORDS,
        index=True,
        storage_options=storage_options("s3", endpoint),
    ) as writer:
        for k in range(shards):
            writer.write_many(
                [b"%010d" % (k * RECORDS + j) + b"x" * payload for j in range(RECORDS)]
            )
    print(f"  {shards} shards written in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return url


class IndexSwitch:
    """Deletes ``_dataset_index.bin`` from the bucket and puts the same bytes back."""

    def __init__(self, endpoint: str, url: str) -> None:
        import s3fs

        self.fs = s3fs.S3FileSystem(skip_instance_cache=True, **storage_options("s3", endpoint))
        self.path = url.split("://", 1)[1] + "/" + INDEX
        self.data: bytes = self.fs.cat_file(self.path)

    def set(self, present: bool) -> None:
        self.fs.invalidate_cache()
        if present and not self.fs.exists(self.path):
            self.fs.pipe_file(self.path, self.data)
        elif not present and self.fs.exists(self.path):
            self.fs.rm_file(self.path)
        self.fs.invalidate_cache()


def run_job(
    proxy: CountingProxy, url: str, endpoint: str, who: Consumers, mode: str, state: Path
) -> Sample:
    """The job's processes, released together; their results and the requests counted."""
    cache = tempfile.mkdtemp(prefix="bench-scale-cache-")
    jobs = [
        {
            "url": url,
            "mode": mode,
            "state": f"{state}-{host}",
            "loader": who.loader,
            "barrier": True,
            "options": {
                "num_hosts": 8,
                "host_index": host,
                "seed": 1,
                "cache_dir": cache,
                "cache_bytes": CACHE_BYTES,
                "storage_options": storage_options("s3", endpoint),
            },
        }
        for host in who.hosts
    ]
    procs: list[subprocess.Popen[str]] = []
    logs = []
    try:
        for job in jobs:
            log = tempfile.TemporaryFile("w+")  # noqa: SIM115 - closed below
            logs.append(log)
            procs.append(
                subprocess.Popen(
                    probe_command(job),
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    text=True,
                    env=probe_env(),
                )
            )
        for proc in procs:  # every one has imported what it needs
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != "ready":
                raise RuntimeError(f"{who.label} {mode}: a consumer did not start")
        proxy.forget()
        go = time.time()
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        outs = [proc.communicate(timeout=JOB_TIMEOUT)[0] for proc in procs]
        done = time.time()
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        errors = []
        for proc, log in zip(procs, logs, strict=True):
            log.seek(0)
            if proc.returncode:
                errors.append(log.read()[-2000:])
            log.close()
        shutil.rmtree(cache, ignore_errors=True)
    if errors:
        raise RuntimeError(f"{who.label} {mode}: {errors[0]}")
    got = [json.loads(out.strip().splitlines()[-1]) for out in outs]
    states = [g["state"] for g in got if g["state"] is not None]
    return Sample(
        seconds=max(g["s"] for g in got),
        mib=max(g["mib"] for g in got),
        state=max(states) if states else None,
        requests=proxy.between(go, max(g["first"] for g in got)),
        after=sum(proxy.between(go, done).values()),
    )


def measure(
    proxy: CountingProxy,
    url: str,
    switch: IndexSwitch,
    modes: Sequence[str],
    rounds: int,
    work: Path,
    consumers: Sequence[Consumers] = CONSUMERS,
    indexes: Sequence[str] = ("dataset", "sidecars"),
) -> Runs:
    runs: Runs = {}
    endpoint = proxy.url
    for round_ in range(rounds):
        order = list(indexes) if round_ % 2 == 0 else list(reversed(indexes))
        for index in order:
            switch.set(index == "dataset")
            for who in consumers:
                state = work / f"state-{who.label.replace(' ', '')}-{index}-{round_}"
                if "resume" in modes:
                    run_job(proxy, url, endpoint, who, "save", state)
                for mode in random.Random(round_).sample(list(modes), len(modes)):
                    got = run_job(proxy, url, endpoint, who, mode, state)
                    runs.setdefault((who.label, mode, index), []).append(got)
                    total = sum(got.requests.values())
                    print(
                        f"  round {round_} {index:8} {who.label:12} {mode:6} "
                        f"{got.seconds:7.2f} s {total:6d} requests ({got.after} in all) "
                        f"{got.mib:7.1f} MiB "
                        f"state {got.state} B  load {os.getloadavg()[0]:.2f}",
                        file=sys.stderr,
                    )
    switch.set(True)
    return runs


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def _kind(samples: list[Sample], kind: str) -> float:
    return _median([sum(n for (k, _), n in s.requests.items() if k == kind) for s in samples])


def _render(header: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in body])


def tables(runs: Runs, shards: int, modes: Sequence[str]) -> str:
    """The two markdown tables and the note between them."""
    limit = 8 * 20 + 4 * shards / 1000
    head = ["shards", "consumers", "mode", "index", "s", *KINDS, "requests", "shard GETs"]
    head += ["in all", "MiB", "state B", "target"]
    rows = []
    for who in CONSUMERS:
        for mode in modes:
            for index in ("dataset", "sidecars"):
                samples = runs.get((who.label, mode, index))
                if not samples:
                    continue
                seconds = _median([s.seconds for s in samples])
                total = _median([sum(s.requests.values()) for s in samples])
                data = _median([s.requests.get(("GET", "shard"), 0) for s in samples])
                meta = _median(
                    [sum(s.requests.values()) - s.requests[("GET", "shard")] for s in samples]
                )
                states = [s.state for s in samples if s.state is not None]
                checks = []
                if who.label == "8":
                    checks.append(f"requests {'met' if total <= limit else 'missed'}")
                    checks.append(f"without shard GETs {'met' if meta <= limit else 'missed'}")
                    if mode in ("global", "resume"):
                        checks.append(f"s {'met' if seconds <= 3 else 'missed'}")
                rows.append(
                    [
                        f"{shards:,}",
                        who.label,
                        mode,
                        index,
                        f"{seconds:.2f}",
                        *(f"{_kind(samples, kind):.0f}" for kind in KINDS),
                        f"{total:.0f}",
                        f"{data:.0f}",
                        f"{_median([s.after for s in samples]):.0f}",
                        f"{_median([s.mib for s in samples]):.0f}",
                        f"{max(states):.0f}" if states else "",
                        ", ".join(checks),
                    ]
                )
    eight = {key: got for key, got in runs.items() if key[0] == "8"}
    seen = {what for samples in eight.values() for s in samples for what in s.requests}
    columns = sorted(seen, key=lambda what: (KINDS.index(what[0]), what[1]))
    split_rows = [
        [f"{shards:,}", mode, index]
        + [f"{_median([s.requests.get(what, 0) for s in samples]):.0f}" for what in columns]
        for mode in modes
        for index in ("dataset", "sidecars")
        if (samples := eight.get(("8", mode, index)))
    ]
    split_head = ["shards", "mode", "index"] + [f"{kind} {what}" for kind, what in columns]
    note = (
        f"Targets: 8 consumers' requests to the first record <= {limit:.0f} (8 x 20 + 4 per "
        "1,000 shards); global and resume first record <= 3 s. 8 consumers' requests by "
        "object (median of the rounds; `shard` a .tfrecord, `other` any other key, `bucket` "
        "no key):"
    )
    return "\n\n".join([_render(head, rows), note, _render(split_head, split_rows)])


def run_s3(
    shards_list: Sequence[int],
    modes: Sequence[str],
    rounds: int,
    consumers: Sequence[str] = (),
    indexes: Sequence[str] = ("dataset", "sidecars"),
) -> str:
    """Servers, datasets, every job; the markdown section (tables and notes). ``consumers``:
    the labels of the consumer sets to run (all when empty); ``indexes``: with the dataset
    index, with sidecars only, or both."""
    chosen = [who for who in CONSUMERS if not consumers or who.label in consumers]
    if os.geteuid() != 0:
        raise SystemExit("bench_scale.py --s3 needs root (network namespace, tc)")
    loads = [os.getloadavg()]
    sections = []
    with (
        tempfile.TemporaryDirectory(prefix="bench-scale-s3-") as tmp,
        link_services(Path(tmp), no_link=False) as services,
    ):
        services.start()
        link = services.stores["s3-link"].endpoint.removeprefix("http://")
        host, port = link.rsplit(":", 1)
        lo = services.stores["s3-lo"].endpoint
        with CountingProxy(host, int(port)) as proxy:
            for shards in shards_list:
                url = write_dataset(lo, shards)
                switch = IndexSwitch(lo, url)
                runs = measure(proxy, url, switch, modes, rounds, Path(tmp), chosen, indexes)
                sections.append(tables(runs, shards, modes))
            if proxy.errors:
                raise RuntimeError(f"counting proxy: {proxy.errors[:3]}")
    loads.append(os.getloadavg())
    load_text = ", ".join(" ".join(f"{x:.2f}" for x in load) for load in loads)
    notes = [
        link_note(False, ""),
        f"Load average (1, 5, 15 min) at the start and the end: {load_text}.",
        f"Rounds: {rounds}; medians.",
    ]
    return "\n\n".join([*sections, " ".join(notes)])
