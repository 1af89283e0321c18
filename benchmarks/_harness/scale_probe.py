"""bench_scale.py's probe: one consumer's first record in a fresh process, in one mode.

Run as ``python -c "from _harness.scale_probe import main; main()" JOB_JSON`` with
``benchmarks/`` on ``PYTHONPATH`` (:func:`probe_command`). The job (a dict) says:

* ``url``, ``mode`` (``global``, ``block``, ``even``, ``get``, ``len``, ``resume``,
  ``epoch2``: a global shuffle's second epoch in the same process, timed from
  ``set_epoch(1)``, or ``save``: take 1,000 global records and write the state to ``state``);
* ``options``: ``open_dataset``'s keywords besides the mode's (``num_hosts``, ``host_index``,
  ``seed``, ``cache_dir``, ``storage_options``...);
* ``loader``: 0 (the dataset itself) or a number of DataLoader workers: ``streamrec.torch``'s
  ``IterableDataset`` in a ``DataLoader(batch_size=None)`` (torchdata's
  ``StatefulDataLoader`` to save and resume), and for ``get`` a map-style dataset whose
  ``__getitems__`` calls ``ds.get`` (README, "Random access"), batches of 8, shuffled;
  ``len`` is ``len(loader)``;
* ``barrier``: print ``ready`` and wait for a line on stdin before starting (so that the
  consumers of a job start together, their imports done: with an ``s3://`` url also those
  of the S3 path, aiohttp, s3fs and botocore, as the remote benchmarks' workers do).

It prints one JSON line: ``s`` seconds from ``open_dataset`` to the first record, ``mib`` the
growth of peak RSS over the RSS before ``open_dataset`` (``VmHWM`` reset through
``/proc/self/clear_refs`` just before it: ``getrusage``'s ``ru_maxrss`` would keep the peak of
the process this one was forked from, the benchmark's own; with a loader, the largest of the
process's and its workers' peaks), ``state`` the JSON size of ``state_dict()`` after the first
record (None with a loader), ``first`` the wall-clock time of the first record; for
``global`` and ``epoch2`` of a local dataset (no loader) also ``fetched``, the bytes fetched
for the first 2,000 records (``bytes_fetched - bytes_checked``) over their bytes, and
``checked_mib``.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import resource
import sys
import time
from pathlib import Path
from typing import Any

from . import BENCH_DIR
from .procs import reset_peak_rss, status_kib

__all__ = ["SAVE_AFTER", "main", "probe_command", "probe_env"]

SAVE_AFTER = 1000  # records taken before the state a resume starts from is saved


def probe_command(job: dict[str, Any]) -> list[str]:
    """The command line of one probe (run it with :func:`probe_env`)."""
    code = "from _harness.scale_probe import main; main()"
    return [sys.executable, "-c", code, json.dumps(job)]


def probe_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(BENCH_DIR)}


def _mode_options(mode: str) -> dict[str, Any]:
    if mode in ("global", "resume", "save", "epoch2"):
        return {"shuffle": "global"}
    if mode == "block":
        return {"shuffle": "block"}
    if mode == "even":
        return {"even": "drop"}
    return {}


def _first_plain(ds: Any, mode: str, state_path: str) -> Any:
    """The first record of ``ds`` itself; returns what to close (or None)."""
    if mode == "save":
        it = iter(ds)
        for _ in range(SAVE_AFTER):
            next(it)
        Path(state_path).write_text(json.dumps(ds.state_dict()))
        return it
    if mode == "resume":
        ds.load_state_dict(json.loads(Path(state_path).read_text()))
    if mode == "get":
        ds.get([random.Random(5).randrange(ds.num_records)])
        return None
    if mode == "len":
        len(ds)
        return None
    it = iter(ds)
    next(it)
    return it


def _second_epoch(ds: Any) -> tuple[Any, float]:
    """A global shuffle's first record of epoch 1 after one of epoch 0, in this process:
    (the iterator, the seconds from ``set_epoch(1)`` to that record)."""
    it = iter(ds)
    next(it)
    it.close()
    ds.set_epoch(1)
    start = time.perf_counter()
    it = iter(ds)
    next(it)
    return it, time.perf_counter() - start


def _first_loader(ds: Any, mode: str, state_path: str, workers: int) -> Any:
    """The first item through a DataLoader of ``workers`` workers; returns the iterator."""
    from torch.utils.data import DataLoader

    import streamrec.torch

    if mode == "get":

        class Records:
            def __len__(self) -> int:
                return int(ds.num_records)

            def __getitem__(self, i: int) -> bytes:
                return ds.get([i])[0]  # type: ignore[no-any-return]

            def __getitems__(self, indices: list[int]) -> list[bytes]:
                return ds.get(indices)  # type: ignore[no-any-return]

        loader: Any = DataLoader(
            Records(),  # type: ignore[arg-type]
            batch_size=8,
            shuffle=True,
            num_workers=workers,
            collate_fn=list,
        )
        it = iter(loader)
        next(it)
        return it
    wrapped = streamrec.torch.IterableDataset(ds)
    if mode in ("save", "resume"):
        from torchdata.stateful_dataloader import (  # type: ignore[import-untyped]
            StatefulDataLoader,
        )

        loader = StatefulDataLoader(wrapped, batch_size=None, num_workers=workers)
    else:
        loader = DataLoader(wrapped, batch_size=None, num_workers=workers)
    if mode == "len":
        len(loader)
        return None
    if mode == "resume":
        loader.load_state_dict(pickle.loads(Path(state_path).read_bytes()))
    it = iter(loader)
    next(it)
    if mode == "save":
        for _ in range(SAVE_AFTER - 1):
            next(it)
        Path(state_path).write_bytes(pickle.dumps(loader.state_dict()))
    return it


def main() -> None:
    job = json.loads(sys.argv[1])
    import streamrec

    if job["url"].startswith("s3://"):  # what the S3 path imports, before the clock starts
        import aiohttp  # noqa: F401
        import s3fs  # noqa: F401

        import streamrec.storage.s3.store
    if job["loader"]:
        import torch.utils.data  # noqa: F401 - imported before the clock starts
        import torchdata.stateful_dataloader  # type: ignore[import-untyped]  # noqa: F401

        import streamrec.torch
    mode, state_path = job["mode"], job.get("state", "")
    options = {**job["options"], **_mode_options(mode)}
    if job.get("barrier"):
        print("ready", flush=True)
        sys.stdin.readline()
    before = (reset_peak_rss() or 0) / 1024
    start = time.perf_counter()
    ds = streamrec.open_dataset(job["url"], **options)
    if job["loader"]:
        it = _first_loader(ds, mode, state_path, job["loader"])
    elif mode == "epoch2":
        it, seconds = _second_epoch(ds)
    else:
        it = _first_plain(ds, mode, state_path)
    if mode != "epoch2" or job["loader"]:
        seconds = time.perf_counter() - start
    first = time.time()
    state = None if job["loader"] or mode == "save" else len(json.dumps(ds.state_dict()))
    found: dict[str, Any] = {}
    # what the first 2,000 records fetched from storage: local datasets only (the S3 part's
    # consumers would go on reading while the others' first records are counted and timed)
    if mode in ("global", "epoch2") and not job["loader"] and "://" not in job["url"]:
        for _ in range(1999):
            next(it)
        stats = ds.stats
        found["fetched"] = (stats.bytes_fetched - stats.bytes_checked) / max(stats.bytes_read, 1)
        found["checked_mib"] = stats.bytes_checked / 2**20
    if it is not None and hasattr(it, "close"):
        it.close()
    del it  # a loader's workers are joined here
    peak = (status_kib("VmHWM") or 0) / 1024
    if job["loader"]:
        peak = max(peak, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)
    print(json.dumps({"s": seconds, "mib": peak - before, "state": state, "first": first, **found}))
