"""What the benchmark scripts share: ``import _harness`` from a script beside this package
(``python benchmarks/bench_x.py`` puts ``benchmarks/`` on ``sys.path``).

Importing it is the one place the benchmarks touch ``sys.path``: the repository root goes first,
so that every script measures the in-tree ``streamrec`` (installed or not; a worker started
with ``STREAMREC_BENCH_TREE=<tree>`` measures that tree's instead), and ``tests/`` goes last,
for the test support package (``support.servers``: free ports, fake-gcs-server). It also
turns off gcsfs's gRPC probe (``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false``: against an emulator
every call would wait 60 s on it) before anything imports gcsfs.

Modules (``local`` and ``examples`` import streamrec and numpy at the top, as the local scripts
do; the others import streamrec and the remote clients inside their functions, so that a worker
process imports what its own job needs):

* ``procs``: child processes (one ``RESULT`` JSON line), peak RSS, the rotated round order.
* ``local``: bench_local's single local files and the readers that bench_pipeline shares.
* ``datasets``: the shard sets of Example records the remote benchmarks write and upload.
* ``examples``: Example decoding rates (bench_example.py, bench_local's Example rows).
* ``servers``: SeaweedFS, fake-gcs-server and the emulated cloud link (``netem.py``).
* ``remote``: the workers that several remote benchmarks run (link limit, upload).
* ``indexed``: indexed shard sets and the link set-up of the indexed-reading benchmarks.
* ``stats``: timings and per-run samples, best and median.
* ``report``: README sections, the source state, the machine, the command line.
* ``remote_report``: bench_remote.py's settings, targets, tables and notes.
* ``first_record``: bench_remote.py --first-only: time to the first record in fresh processes,
  old and new trees and a bare s3fs reference side by side, with a timestamped breakdown.
* ``link_shapes``: bench_remote.py --link-shape: streamrec and the link limit through several
  emulated link shapes (round trip, per-connection and aggregate rate) side by side.
* ``small_shards``: bench_remote.py --small-shards: 500 shards of ~130 KB read one at a time at
  the defaults, through the link and locally, old and new trees side by side.
* ``scale_probe``: bench_scale.py's probe: one consumer's first record in a fresh process.
* ``scale_s3``: bench_scale.py --s3: 2k-5k S3 shards behind the link, 1 and 8 consumers and a
  DataLoader, every request counted.
* ``counting_proxy``: an HTTP/1.1 proxy that counts requests by kind and object.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent.parent
REPO_ROOT = BENCH_DIR.parent
DATA_DIR = BENCH_DIR / "data"  # gitignored: inputs written once and reused

# the streamrec measured: this tree's, or another's for a before/after in one run
# (bench_remote.py --first-only --base, bench_cpu.py --base: their workers get
# STREAMREC_BENCH_TREE=<old tree>)
TREE = Path(os.environ.get("STREAMREC_BENCH_TREE") or REPO_ROOT)
if TREE != REPO_ROOT or str(TREE) not in sys.path:
    sys.path.insert(0, str(TREE))
if str(REPO_ROOT / "tests") not in sys.path:
    sys.path.append(str(REPO_ROOT / "tests"))

os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"  # before gcsfs is imported anywhere

KIB = 1 << 10
MIB = 1 << 20
MB = 10**6
BUCKET = "bench"  # the bucket the benchmarks write to (SeaweedFS creates it at start)

__all__ = ["BENCH_DIR", "BUCKET", "DATA_DIR", "KIB", "MB", "MIB", "REPO_ROOT", "TREE_UNDER_TEST"]
