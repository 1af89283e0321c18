"""Emulate a cloud object-store link on one machine: a network namespace and a TCP proxy.

Used by the remote benchmarks (through ``_harness/servers.py``); usable on its own (as root,
Linux, ``ip`` and ``tc`` present)::

    python benchmarks/netem.py selftest        # build a namespace + proxy, measure, tear down
    python benchmarks/netem.py proxy --listen 10.213.77.2:8333 --upstream 127.0.0.1:8333

What makes object storage slow is the shape of each request, not the pipe: every connection
gets a limited share of bandwidth and every request pays a round trip, while many connections
add up to the machine's bandwidth. Two pieces model exactly that (``tc netem`` is not in this
kernel):

* :class:`Namespace`: ``ip netns add``, a veth pair addressed with a /30 from a private range
  that exists only between this host and the namespace, lo up inside, and
  ``tbf rate 1gbit burst 256kb latency 100ms`` on both ends: the aggregate cap of the link.
  The namespace is deleted on exit (which also deletes the veth pair).
* :func:`serve_proxy` (the ``proxy`` subcommand, started inside the namespace in front of the
  S3 server on the namespace's loopback): each direction of each connection is

  - rate-capped by a per-connection token bucket (25 MB/s by default): the bucket is charged
    as bytes are read from the sender, so back-pressure reaches the sender as on a real link;
  - delayed by ``delay`` seconds (30 ms by default, so 60 ms round trips): every chunk is
    stamped with the time it passed the cap and written once that time plus the delay has
    come, so chunks in flight overlap (a pipe, not a per-chunk sleep in series);
  - with ``--handshake``, a new connection's first client bytes are held until one round trip
    after the accept: the TCP handshake a real link charges, which the ``connect()`` to the
    proxy would otherwise skip (off by default, as in the set-up shared/INFRA.md measured).

  The proxy process runs on the host and only its listening socket lives in the namespace
  (``--netns``, via ``setns(2)``), so it can forward to a server on the host's loopback: the
  client's bytes cross the veth pair and its ``tbf`` both ways, then the proxy's delay and cap.

  Each closed connection is logged as ``conn <opened> <closed> <bytes up> <bytes down>``
  (wall-clock seconds) to the log file, so a benchmark can count the connections a run used.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TextIO

CHUNK = 64 << 10
QUEUE_CHUNKS = 64  # chunks stamped and not yet delivered, per direction (back-pressure bound)
DEFAULT_SUBNET = "10.213.77.0/30"  # host end .1, namespace end .2


# ---------------------------------------------------------------- the proxy


class TokenBucket:
    """A per-connection rate cap: ``take(n)`` returns once ``n`` bytes fit under ``rate``."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = float(burst)
        self.last = time.monotonic()

    async def take(self, n: int) -> None:
        now = time.monotonic()
        self.tokens = min(float(self.burst), self.tokens + (now - self.last) * self.rate)
        self.last = now
        self.tokens -= n
        if self.tokens < 0:
            await asyncio.sleep(-self.tokens / self.rate)


@dataclass(frozen=True)
class LinkShape:
    """What the proxy does to each connection."""

    delay: float = 0.030
    """One-way delay in seconds (the round trip is twice this)."""
    rate: float = 25e6
    """Per-connection cap in bytes/s, each direction."""
    handshake: bool = False
    """Hold a new connection's first client bytes for one round trip (the TCP handshake)."""
    link_rate: str = "1gbit"
    """The aggregate cap of the veth pair (``tbf``), both ways (used by :class:`Namespace`)."""

    @property
    def label(self) -> str:
        """``"60ms/25MBps/1gbit"``: round trip, per-connection rate, aggregate rate."""
        return f"{2 * self.delay * 1000:g}ms/{self.rate / 1e6:g}MBps/{self.link_rate}"

    @classmethod
    def parse(cls, text: str) -> LinkShape:
        """``"10ms/100MBps/2.5gbit"``: round trip, per-connection MB/s, ``tbf`` rate."""
        try:
            rtt, rate, link = text.split("/")
            return cls(
                delay=float(rtt.removesuffix("ms")) / 2000,
                rate=float(rate.lower().removesuffix("mbps")) * 1e6,
                link_rate=link.lower(),
            )
        except ValueError:
            raise ValueError(
                f"{text!r}: want RTTms/MBps/tbf-rate, e.g. 60ms/25MBps/1gbit"
            ) from None


async def _pump(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    shape: LinkShape,
    not_before: float,
    counter: list[int],
) -> None:
    """Copy one direction: cap, stamp, deliver after the delay; half-close at the end."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue(QUEUE_CHUNKS)
    bucket = TokenBucket(shape.rate, CHUNK)

    async def receive() -> None:
        try:
            while True:
                data = await reader.read(CHUNK)
                if not data:
                    break
                await bucket.take(len(data))
                due = max(loop.time() + shape.delay, not_before)
                await queue.put((due, data))
        finally:
            await queue.put(None)

    async def deliver() -> None:
        while True:
            item = await queue.get()
            if item is None:
                if writer.can_write_eof():
                    writer.write_eof()
                return
            due, data = item
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            counter[0] += len(data)
            await writer.drain()

    receiving = asyncio.ensure_future(receive())
    try:
        await deliver()
    finally:
        receiving.cancel()
        with contextlib.suppress(BaseException):
            await receiving


def _nodelay(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


async def _handle(
    client_r: asyncio.StreamReader,
    client_w: asyncio.StreamWriter,
    upstream: tuple[str, int],
    shape: LinkShape,
    log: TextIO | None,
) -> None:
    loop = asyncio.get_running_loop()
    opened_wall = time.time()
    accepted = loop.time()
    up = [0]
    down = [0]
    server_w: asyncio.StreamWriter | None = None
    try:
        server_r, server_w = await asyncio.open_connection(*upstream)
        _nodelay(client_w)
        _nodelay(server_w)
        # client bytes reach the server at the earliest after SYN, SYN-ACK and the data's own
        # trip: three one-way delays after the accept
        first_up = accepted + (3 * shape.delay if shape.handshake else 0.0)
        pumps = [
            asyncio.ensure_future(_pump(client_r, server_w, shape, first_up, up)),
            asyncio.ensure_future(_pump(server_r, client_w, shape, 0.0, down)),
        ]
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_EXCEPTION)
        finally:
            for pump in pumps:
                pump.cancel()  # a reset in one direction ends the other too
            await asyncio.gather(*pumps, return_exceptions=True)
    except OSError:
        pass
    finally:
        for w in (client_w, server_w):
            if w is not None:
                w.close()
                with contextlib.suppress(BaseException):
                    await w.wait_closed()
        if log is not None:
            log.write(f"conn {opened_wall:.3f} {time.time():.3f} {up[0]} {down[0]}\n")
            log.flush()


def listening_socket(host: str, port: int, netns: str | None = None) -> socket.socket:
    """A listening TCP socket on host:port, created inside network namespace ``netns``.

    A socket stays in the namespace it was created in: the calling thread enters ``netns``
    (``setns(2)``, which changes only that thread), creates and binds the socket, and returns
    to its own namespace. So one process accepts inside the namespace and connects upstream
    from the host's (to a server on the host's loopback).
    """
    if netns is None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(512)
        return sock
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    clone_newnet = 0x40000000

    def setns(fd: int) -> None:
        if libc.setns(fd, clone_newnet) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns: {os.strerror(err)}")

    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        target = os.open(f"/run/netns/{netns}", os.O_RDONLY)
        try:
            setns(target)
            try:
                return listening_socket(host, port)
            finally:
                setns(own)
        finally:
            os.close(target)
    finally:
        os.close(own)


async def serve_proxy(
    listen: tuple[str, int],
    upstream: tuple[str, int],
    shape: LinkShape,
    log_path: str | None = None,
    netns: str | None = None,
) -> None:
    """Run the proxy until SIGTERM/SIGINT (listening inside ``netns`` if given)."""
    log = open(log_path, "a", buffering=1) if log_path else None  # noqa: SIM115
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    sock = listening_socket(*listen, netns=netns)
    server = await asyncio.start_server(lambda r, w: _handle(r, w, upstream, shape, log), sock=sock)
    try:
        if log is not None:
            where = f" in netns {netns}" if netns else ""
            log.write(
                f"ready {listen[0]}:{listen[1]}{where} -> {upstream[0]}:{upstream[1]} {shape}\n"
            )
        await stop.wait()
    finally:
        server.close()
        if log is not None:
            log.close()


def connections_between(log_path: Path, start: float, end: float) -> list[tuple[int, int]]:
    """(bytes up, bytes down) of the connections a proxy log shows opened in [start, end]."""
    found: list[tuple[int, int]] = []
    if not log_path.exists():
        return found
    for line in log_path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 5 and parts[0] == "conn" and start <= float(parts[1]) <= end:
            found.append((int(parts[3]), int(parts[4])))
    return found


# ---------------------------------------------------------------- the namespace


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, check=check)


class Namespace:
    """A network namespace joined to this host by a veth pair with ``tbf`` on both ends.

    ``host_ip`` is this side's address, ``ns_ip`` the namespace's; both come from ``subnet``
    (a /30 in a private range that no other interface here uses). Only traffic to ``ns_ip``
    crosses the pair. Use as a context manager; :meth:`popen` starts a process inside.
    """

    def __init__(
        self,
        name: str | None = None,
        subnet: str = DEFAULT_SUBNET,
        rate: str = "1gbit",
        index: int = 0,
    ) -> None:
        for tool in ("ip", "tc"):
            if shutil.which(tool) is None:
                raise RuntimeError(f"{tool} not found (apt-get install -y iproute2)")
        # several namespaces of one process (one per link shape) differ by ``index``
        tag = f"{os.getpid() % 100000}" + (f"x{index}" if index else "")
        self.name = name or f"srbench{tag}"
        self.veth_host = f"srb{tag}h"
        self.veth_ns = f"srb{tag}n"
        net = ipaddress.ip_network(subnet)
        if net.prefixlen != 30 or not net.is_private:
            raise ValueError(f"{subnet}: need a private /30")
        hosts = list(net.hosts())
        self.host_ip, self.ns_ip = str(hosts[0]), str(hosts[1])
        self.prefix = net.prefixlen
        self.subnet = net
        self.rate = rate
        self._up = False

    def _check_free(self) -> None:
        routes = _run("ip", "-4", "route", "show").stdout
        for line in routes.splitlines():
            dest = line.split()[0]
            if dest == "default":
                continue
            with contextlib.suppress(ValueError):
                if ipaddress.ip_network(dest, strict=False).overlaps(self.subnet):
                    raise RuntimeError(f"{self.subnet} overlaps an existing route: {line}")
        if self.name in _run("ip", "netns", "list").stdout.split():
            raise RuntimeError(f"network namespace {self.name} exists already")

    def up(self) -> None:
        self._check_free()
        self._up = True  # from here on, down() cleans whatever was made
        ns = ("ip", "netns", "exec", self.name)
        tbf = ("root", "tbf", "rate", self.rate, "burst", "256kb", "latency", "100ms")
        _run("ip", "netns", "add", self.name)
        _run("ip", "link", "add", self.veth_host, "type", "veth", "peer", "name", self.veth_ns)
        _run("ip", "link", "set", self.veth_ns, "netns", self.name)
        _run("ip", "addr", "add", f"{self.host_ip}/{self.prefix}", "dev", self.veth_host)
        _run("ip", "link", "set", self.veth_host, "up")
        _run(*ns, "ip", "addr", "add", f"{self.ns_ip}/{self.prefix}", "dev", self.veth_ns)
        _run(*ns, "ip", "link", "set", self.veth_ns, "up")
        _run(*ns, "ip", "link", "set", "lo", "up")
        _run("tc", "qdisc", "add", "dev", self.veth_host, *tbf)
        _run(*ns, "tc", "qdisc", "add", "dev", self.veth_ns, *tbf)

    def down(self) -> None:
        if not self._up:
            return
        self._up = False
        _run("ip", "netns", "del", self.name, check=False)
        _run("ip", "link", "del", self.veth_host, check=False)  # gone with the netns, normally

    def popen(self, args: Sequence[str], **kwargs: object) -> subprocess.Popen[bytes]:
        """Start ``args`` inside the namespace."""
        return subprocess.Popen(["ip", "netns", "exec", self.name, *args], **kwargs)  # type: ignore[call-overload, no-any-return]

    def run(self, args: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
        """Run ``args`` inside the namespace to completion."""
        return subprocess.run(
            ["ip", "netns", "exec", self.name, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def __enter__(self) -> Namespace:
        try:
            self.up()
        except BaseException:
            self.down()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.down()


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    """SIGTERM the process we started (by its pid), SIGKILL it if it lingers."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def wait_listening(host: str, port: int, timeout: float) -> None:
    """Poll until a TCP connect to host:port succeeds (bounded by ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listens on {host}:{port} after {timeout} s") from None
            time.sleep(0.05)


def start_proxy(
    ns: Namespace,
    listen_port: int,
    upstream: tuple[str, int],
    shape: LinkShape,
    log_path: Path,
    upstream_in_ns: bool = False,
) -> subprocess.Popen[bytes]:
    """Start the proxy listening on ``ns.ns_ip:listen_port`` inside ``ns``; return once it listens.

    ``upstream`` is on the host's side (its loopback, say), unless ``upstream_in_ns``: then
    the whole proxy process runs inside the namespace.
    """
    args = [
        sys.executable,
        str(Path(__file__).resolve()),
        "proxy",
        "--listen",
        f"{ns.ns_ip}:{listen_port}",
        "--upstream",
        f"{upstream[0]}:{upstream[1]}",
        "--delay-ms",
        str(shape.delay * 1000),
        "--rate-mbs",
        str(shape.rate / 1e6),
        "--log",
        str(log_path),
    ]
    if shape.handshake:
        args.append("--handshake")
    if upstream_in_ns:
        proc = ns.popen(args, stdin=subprocess.DEVNULL)
    else:
        proc = subprocess.Popen([*args, "--netns", ns.name], stdin=subprocess.DEVNULL)
    try:
        wait_listening(ns.ns_ip, listen_port, timeout=10.0)
    except BaseException:
        stop_process(proc)
        raise
    return proc


# ---------------------------------------------------------------- self-test


def _selftest() -> int:
    """Namespace + proxy in front of a tiny sink/source server in the namespace: RTT, rates."""
    shape = LinkShape()
    server_code = (
        "import socket,threading\n"
        "s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
        "s.bind(('127.0.0.1',int(__import__('sys').argv[1])));s.listen(64)\n"
        "def h(c):\n"
        "    n=int(c.recv(32).strip() or 0);b=bytes(1<<16)\n"
        "    while n>0:\n"
        "        c.sendall(b[:min(n,len(b))]);n-=min(n,len(b))\n"
        "    c.close()\n"
        "while True:\n"
        "    c,_=s.accept();threading.Thread(target=h,args=(c,),daemon=True).start()\n"
    )
    from _harness.servers import free_port

    port = free_port()
    with Namespace() as ns:
        server = subprocess.Popen([sys.executable, "-c", server_code, str(port)])
        log = Path(f"/tmp/netem-selftest-{os.getpid()}.log")
        proxy = None
        try:
            wait_listening("127.0.0.1", port, timeout=10.0)
            proxy = start_proxy(ns, 9412, ("127.0.0.1", port), shape, log)

            def fetch(n: int) -> tuple[float, float]:
                t0 = time.perf_counter()
                with socket.create_connection((ns.ns_ip, 9412), timeout=30) as c:
                    c.sendall(f"{n}\n".encode())
                    first = None
                    got = 0
                    while got < n:
                        data = c.recv(1 << 20)
                        if not data:
                            break
                        first = first or time.perf_counter()
                        got += len(data)
                return (first or t0) - t0, time.perf_counter() - t0

            ttfb, _ = fetch(1)
            print(
                f"first byte on a new connection: {ttfb * 1000:.0f} ms "
                f"(expect ~{2 * shape.delay * 1000:.0f}: request + response)"
            )
            _, total = fetch(50_000_000)
            print(f"one connection, 50 MB: {50 / total:.1f} MB/s (cap {shape.rate / 1e6:.0f})")

            async def many(k: int) -> float:
                t0 = time.perf_counter()
                await asyncio.gather(*(asyncio.to_thread(fetch, 25_000_000) for _ in range(k)))
                return 25 * k / (time.perf_counter() - t0)

            print(f"16 connections x 25 MB: {asyncio.run(many(16)):.1f} MB/s (link 1 Gbit)")
        finally:
            if proxy is not None:
                stop_process(proxy)
            stop_process(server)
            log.unlink(missing_ok=True)
    return 0


def _hostport(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="cloud-link emulation (see module docstring)")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("proxy", help="run the delaying, rate-capping TCP proxy")
    p.add_argument("--listen", type=_hostport, required=True)
    p.add_argument("--upstream", type=_hostport, required=True)
    p.add_argument("--delay-ms", type=float, default=30.0)
    p.add_argument("--rate-mbs", type=float, default=25.0, help="per connection, MB/s")
    p.add_argument(
        "--handshake",
        action="store_true",
        help="hold a new connection's first bytes one round trip (TCP handshake)",
    )
    p.add_argument("--netns", help="listen inside this network namespace (upstream: here)")
    p.add_argument("--log")
    sub.add_parser("selftest", help="namespace + proxy round trip and rate check")
    args = parser.parse_args(argv)
    if args.cmd == "selftest":
        return _selftest()
    shape = LinkShape(args.delay_ms / 1000, args.rate_mbs * 1e6, args.handshake)
    asyncio.run(serve_proxy(args.listen, args.upstream, shape, args.log, args.netns))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
