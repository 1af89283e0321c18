"""Azurite, the Azure Storage emulator (blob service only), for tests and benchmarks.

Azurite is an npm package. :func:`azurite_main` installs it on first use into
``<repo>/.cache/azurite`` (``npm install --prefix ... azurite``, under a file lock so that
parallel pytest workers do not race; .ci/run pre-installs it the same way), and
:class:`AzuriteServer` runs its blob service with Node on a free loopback port, in memory::

    with AzuriteServer() as azure:
        azure.create_container("c"); azure.put("c", "k", b"data")
        storage_options = azure.storage_options   # adlfs: a connection string

Ready when the port accepts connections and a list-containers call answers; stopped by its
PID. Setup helpers use the synchronous ``azure.storage.blob`` client, never adlfs or the aio
client streamrec uses.
"""

from __future__ import annotations

import builtins
import contextlib
import fcntl
import shutil
import subprocess
import tempfile
import weakref
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from support.servers import (
    LOOPBACK,
    ServerError,
    end_process,
    free_port,
    http_request,
    kill_process,
    wait_until,
)

__all__ = ["ACCOUNT", "ACCOUNT_KEY", "AzuriteServer", "azurite_main"]

ACCOUNT = "devstoreaccount1"
"""The emulator's well-known development account (published by Microsoft)."""
ACCOUNT_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
REPO = Path(__file__).resolve().parents[2]
INSTALL_DIR = REPO / ".cache" / "azurite"
NPM_FLAGS = ("--no-audit", "--no-fund")
MAIN_JS = Path("node_modules/azurite/dist/src/blob/main.js")


def azurite_main(install_dir: Path = INSTALL_DIR) -> Path:
    """The path of Azurite's blob service script, installing Azurite with npm on first use."""
    main = install_dir / MAIN_JS
    if main.is_file():
        return main
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        raise ServerError("Azurite needs Node.js and npm on PATH (apt-get install nodejs npm)")
    install_dir.mkdir(parents=True, exist_ok=True)
    with open(install_dir.parent / "azurite.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another worker may be installing it right now
        if not main.is_file():
            result = subprocess.run(
                [npm, "install", "--prefix", str(install_dir), "azurite", *NPM_FLAGS],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=600,
            )
            if result.returncode != 0 or not main.is_file():
                raise ServerError(f"npm install azurite failed: {result.stderr[-2000:]}")
    return main


class AzuriteServer:
    """Azurite's blob service (in-memory) as a Node subprocess on a free loopback port.

    Output goes to ``self.log_path``. The port is probed first (Node is told which one to
    bind) and the start retried on a fresh port if the process exits early.
    """

    def __init__(self, *, log_dir: Path | None = None, start_timeout: float = 30.0) -> None:
        self._own_log_dir = log_dir is None
        self.log_dir = Path(tempfile.mkdtemp(prefix="azurite-")) if log_dir is None else log_dir
        self.log_path = self.log_dir / "azurite.log"
        self.start_timeout = start_timeout
        self.host = LOOPBACK
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._client: Any = None

    # lifecycle ---------------------------------------------------------------------------
    def start(self, *, host: str = LOOPBACK, port: int | None = None) -> AzuriteServer:
        if self.process is not None:
            raise ServerError("AzuriteServer already started")
        main = azurite_main()
        last_error = ""
        for _attempt in range(3):
            self.host, self.port = host, port or free_port(host)
            self._log = self.log_path.open("ab")
            process = subprocess.Popen(
                [
                    shutil.which("node") or "node",
                    str(main),
                    "--blobHost",
                    self.host,
                    "--blobPort",
                    str(self.port),
                    "--inMemoryPersistence",
                    "--skipApiVersionCheck",
                    "--loose",
                    "--disableTelemetry",
                ],
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
            )
            self.process = process
            weakref.finalize(self, kill_process, process)  # never leave Node behind
            try:
                wait_until(
                    lambda: self._exited() or self._answers(),
                    timeout=self.start_timeout,
                    what="Azurite",
                )
            except BaseException:
                self.stop()
                raise
            if process.poll() is None:
                return self
            last_error = self.log_path.read_text(errors="replace")[-2000:]
            self.stop()
        raise ServerError(f"Azurite did not start: {last_error}")

    def _exited(self) -> bool:
        return self.process is None or self.process.poll() is not None

    def _answers(self) -> bool:
        """The list-containers call answers (anonymously: 403 says the service is up)."""
        try:
            url = f"{self.endpoint_url}/?comp=list"
            return http_request("GET", url, timeout=2).status in (200, 403)
        except OSError:
            return False

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
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

    def __enter__(self) -> AzuriteServer:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.cleanup()

    # configuration -----------------------------------------------------------------------
    @property
    def endpoint_url(self) -> str:
        """The account's blob endpoint, ``http://127.0.0.1:PORT/devstoreaccount1``."""
        if not self.port:
            raise ServerError("AzuriteServer not started")
        return f"http://{self.host}:{self.port}/{ACCOUNT}"

    @property
    def server_url(self) -> str:
        """``http://host:port`` (for a proxy in front of it)."""
        return f"http://{self.host}:{self.port}"

    def connection_string(self, endpoint: str | None = None) -> str:
        """The development account's connection string, for this server or ``endpoint``
        (``http://host:port``, e.g. a proxy in front of it)."""
        return self.connection_string_for(endpoint or self.server_url)

    @staticmethod
    def connection_string_for(endpoint: str) -> str:
        """The development account's connection string for a server at ``endpoint``
        (``http://host:port``: Azurite, or a proxy in front of it)."""
        base = endpoint.rstrip("/")
        return (
            f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={ACCOUNT_KEY};"
            f"BlobEndpoint={base}/{ACCOUNT};"
        )

    @property
    def storage_options(self) -> dict[str, Any]:
        """adlfs options that point at this server (only a connection string works)."""
        return {"connection_string": self.connection_string()}

    # blob helpers (the synchronous SDK client) ------------------------------------------
    @property
    def client(self) -> Any:
        if self._client is None:
            from azure.storage.blob import BlobServiceClient

            self._client = BlobServiceClient.from_connection_string(self.connection_string())
        return self._client

    def create_container(self, name: str) -> str:
        self.client.create_container(name)
        return name

    def put(self, container: str, name: str, data: bytes) -> None:
        self.client.get_blob_client(container, name).upload_blob(data, overwrite=True)

    def get(self, container: str, name: str) -> bytes:
        data: bytes = self.client.get_blob_client(container, name).download_blob().readall()
        return data

    def list(self, container: str, prefix: str = "") -> builtins.list[str]:
        """Every committed blob name in the container under ``prefix``, sorted."""
        blobs = self.client.get_container_client(container).list_blobs(name_starts_with=prefix)
        return sorted(blob.name for blob in blobs)

    def uncommitted(self, container: str, prefix: str = "") -> builtins.list[str]:
        """Names of blobs that have staged blocks but no committed content."""
        client = self.client.get_container_client(container)
        every = client.list_blobs(name_starts_with=prefix, include=["uncommittedblobs"])
        return sorted({blob.name for blob in every} - set(self.list(container, prefix)))

    def delete(self, container: str, name: str) -> None:
        with contextlib.suppress(Exception):
            self.client.get_blob_client(container, name).delete_blob()

    def etag(self, container: str, name: str) -> str:
        etag: str = self.client.get_blob_client(container, name).get_blob_properties().etag
        return etag
