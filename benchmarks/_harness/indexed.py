"""What the benchmarks of indexed reading share (bench_random_access.py, bench_shuffle.py):
their shard sets indexed locally with ``streamrec index`` and uploaded with the ``.idx``
sidecars, and the same set-up of SeaweedFS behind the emulated link (or loopback only).
"""

from __future__ import annotations

import contextlib
import io
import os
import time
from collections.abc import Sequence
from pathlib import Path

from . import BUCKET, MIB
from .datasets import Dataset
from .remote import run_worker
from .servers import LINK_SHAPE, RTT, Services, free_port, free_subnet

__all__ = ["index_locally", "link_note", "link_services", "require_root", "upload_indexed"]


def index_locally(data: Dataset) -> None:
    """``streamrec index`` the local shards (valid sidecars are kept)."""
    from streamrec.cli import main as cli_main

    with contextlib.redirect_stdout(io.StringIO()):
        status = cli_main(["index", "--no-progress", f"{data.spec.directory}/shard-*.tfrecord"])
    if status != 0:
        raise SystemExit(f"streamrec index exited with {status}")


def upload_indexed(script: str | Path, services: Services, datasets: Sequence[Dataset]) -> None:
    """Put the shards and their sidecars into the loopback SeaweedFS (the link reaches the
    same server), with ``script``'s ``upload`` worker."""
    store = services.stores["s3-lo"]
    files = [
        (str(path), f"{BUCKET}/{data.prefix}/{path.name}")
        for data in datasets
        for shard in data.files
        for path in (shard, shard.with_name(shard.name + ".idx"))
    ]
    job = {"kind": "upload", "backend": "s3", "endpoint": store.endpoint, "files": files}
    t0 = time.perf_counter()
    run_worker(script, job, 900.0)
    total = sum(d.nbytes for d in datasets) / MIB
    print(f"  uploaded {total:.0f} MiB in {time.perf_counter() - t0:.1f} s", flush=True)


def require_root(no_link: bool) -> None:
    """The emulated link needs root; ``--no-link`` runs on loopback without it."""
    if os.geteuid() != 0 and not no_link:
        raise SystemExit("the emulated link needs root (network namespace, tc); or --no-link")


def link_services(tmp: Path, no_link: bool) -> Services:
    """SeaweedFS (S3 only) under ``tmp``, behind the emulated link unless ``no_link``; use it
    as a context manager and call ``start()``."""
    return Services(
        tmp,
        gcs=False,
        link=not no_link,
        subnet=None if no_link else free_subnet(),
        proxy_port=free_port(),
    )


def link_note(no_link: bool, loopback: str) -> str:
    """The sentence a README table gets about the link (``loopback``: what ran without it)."""
    if no_link:
        return f"The link was not set up (`--no-link`): {loopback}."
    return (
        f"Emulated link: 1 Gbit tbf, {RTT * 1000:.0f} ms RTT, "
        f"{LINK_SHAPE.rate / 1e6:.0f} MB/s per connection."
    )
