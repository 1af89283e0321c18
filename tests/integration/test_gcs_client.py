"""GCS client behaviour: process-wide state left alone, refused connections, requester pays.

Against fake-gcs-server (the ``gcs_server`` fixture), a loopback port that refuses
connections, and a recording proxy in front of the server.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import streamrec
from support.azurite import AzuriteServer
from support.fault_proxy import FaultProxy
from support.servers import FakeGcsServer

REPO = Path(streamrec.__file__).resolve().parents[1]
ZB_VARIABLE = "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"


def _shard(records: list[bytes]) -> bytes:
    with streamrec.sync.open_writer("memory://gcs-client/one.tfrecord") as writer:
        writer.write_many(records)
    import fsspec

    data: bytes = fsspec.filesystem("memory").cat_file("/gcs-client/one.tfrecord")
    return data


def _python(
    code: str, env: dict[str, str], timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter with exactly ``env`` (plus this tree on the path)."""
    env = dict(env, PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=timeout
    )


# -- C.22: the library leaves the environment alone -----------------------------------------

_READ_AND_COMPARE = """
import json, os
before = dict(os.environ)
import streamrec
url, options = json.loads(os.environ["CASE"])
records = list(streamrec.open_dataset(url, storage_options=options))
changed = {k: os.environ.get(k) for k in set(before) | set(os.environ)
           if before.get(k) != os.environ.get(k)}
print(json.dumps({"records": len(records), "changed": changed}))
"""


def test_reading_a_gs_dataset_leaves_the_environment_unchanged(
    gcs_server: FakeGcsServer, gcs_bucket: str
) -> None:
    """streamrec once set GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false for the whole process (and
    every other gcsfs user in it): a library never changes global state. The read runs in a
    clean interpreter whose environment lacks the variable; a single object is read on the
    store's own requests, so gcsfs's probe (which the variable turns off) is not in its way."""
    gcs_server.put(gcs_bucket, "one.tfrecord", _shard([b"a", b"bc", b"def"]))
    url = f"gs://{gcs_bucket}/one.tfrecord"
    env = {k: v for k, v in os.environ.items() if k != ZB_VARIABLE}
    env["CASE"] = json.dumps([url, gcs_server.storage_options])
    done = _python(_READ_AND_COMPARE, env)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"records": 3, "changed": {}}


# -- A.2: a refused connection is reported as refused, on every store ----------------------

_ITERATE = """
import json, os
import streamrec
url, options = json.loads(os.environ["CASE"])
try:
    for _ in streamrec.open_dataset(url, storage_options=options):
        pass
except Exception as exc:
    cause = exc.__cause__
    print(json.dumps({"type": type(exc).__name__, "message": str(exc),
                      "cause": type(cause).__name__ if cause is not None else None}))
else:
    print(json.dumps({"type": None}))
"""


@pytest.fixture
def refusing_endpoint() -> Iterator[str]:
    """``http://127.0.0.1:PORT`` where connections are refused: a socket bound there and
    never listening, held for the test (a port closed instead could be taken meanwhile by
    another server, or become a client's own source port: a self-connection)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


def _refused_case(store: str, name: str, endpoint: str) -> tuple[str, dict[str, Any] | None]:
    """The url of ``name`` on ``store`` at a refusing ``endpoint``, and its storage options."""
    if store == "gcs":
        options = {"token": "anon", "project": "test", "endpoint_url": endpoint}
        return f"gs://bucket/{name}", options
    if store == "s3":
        options = {"key": "k", "secret": "s", "client_kwargs": {"endpoint_url": endpoint}}
        return f"s3://bucket/{name}", options
    if store == "azure":
        return f"az://container/{name}", {
            "connection_string": AzuriteServer.connection_string_for(endpoint)
        }
    return f"{endpoint}/{name}", None


STORES = ["gcs", "s3", "azure", "http"]
NAMES = ["one.tfrecord", "shard-*.tfrecord"]  # one object (its first bytes), a listing


@pytest.mark.parametrize("name", NAMES, ids=["object", "glob"])
@pytest.mark.parametrize("store", STORES)
def test_a_refused_connection_is_reported_as_refused(
    store: str, name: str, refusing_endpoint: str
) -> None:
    """gcsfs retried a refused listing 6 times over ~35 s inside each of streamrec's attempts
    (123 s, then "no answer within 29.8 s"); the other stores said "Connect call failed". Now
    every store says "connection refused" with the url, after streamrec's own retries (the
    60 s limit of the child is the failure of a store that waits instead)."""
    url, options = _refused_case(store, name, refusing_endpoint)
    env = dict(os.environ, CASE=json.dumps([url, options]))
    done = _python(_ITERATE, env)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["type"] == "RetriesExhaustedError", result
    assert result["cause"] == "TransientStorageError", result
    assert "connection refused by 127.0.0.1:" in result["message"], result
    assert url in result["message"], result


@pytest.mark.parametrize("store", STORES)
def test_the_cli_reports_a_refused_connection_as_refused(
    store: str, refusing_endpoint: str
) -> None:
    url, options = _refused_case(store, "shard-*.tfrecord", refusing_endpoint)
    args = ["count", url, "--timeout", "2"]
    if options is not None:
        args += ["--storage-options", json.dumps(options)]
    done = subprocess.run(
        [sys.executable, "-m", "streamrec.cli", *args],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("streamrec: error: ")]
    assert len(errors) == 1, done.stderr
    assert "connection refused by 127.0.0.1:" in errors[0] and url in errors[0], done.stderr


@pytest.mark.slow  # waits for the credential look-up to time out
def test_gs_without_a_token_says_it_is_looking_for_credentials(refusing_endpoint: str) -> None:
    """Without a ``token`` gcsfs looks for Google credentials, the Compute Engine metadata
    server last, in blocking calls that take 15-90 s off Google Cloud: streamrec sat silent
    meanwhile (and its event loop with it). Now a warning says what it waits for, and the
    wait is bounded by the retry policy (``--timeout``). The metadata server here accepts
    connections and never answers; the GCS endpoint refuses."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as metadata:
        metadata.bind(("127.0.0.1", 0))
        metadata.listen(64)  # (never accepted: every request to it waits)
        host = f"127.0.0.1:{metadata.getsockname()[1]}"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GOOGLE_", "GCE_"))}
        env.update(
            GCE_METADATA_HOST=host,
            GCE_METADATA_IP=host,
            CLOUDSDK_CONFIG=os.path.join(os.sep, "nonexistent", "gcloud"),
            PYTHONPATH=str(REPO),
        )
        options = json.dumps({"project": "test", "endpoint_url": refusing_endpoint})
        args = ["count", "gs://bucket/one.tfrecord", "--timeout", "2", "--storage-options", options]
        done = subprocess.run(
            [sys.executable, "-m", "streamrec.cli", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
    assert done.returncode == 1, done.stderr
    assert "warning: gs://: looking for Google credentials" in done.stderr, done.stderr
    assert "metadata server" in done.stderr, done.stderr
    # the first attempt (2 s) times out on the lookup (google-auth waits 3 s per metadata try)
    assert "no answer within 2.0 s (waiting for Google credentials" in done.stderr, done.stderr
    assert "\nstreamrec: error: " in done.stderr, done.stderr


# -- C.21: requester pays on every request ---------------------------------------------------


@pytest.mark.parametrize(
    ("requester_pays", "billed"), [(True, "test"), ("payer-project", "payer-project")]
)
def test_requester_pays_reaches_every_request(
    gcs_server: FakeGcsServer,
    gcs_bucket: str,
    fault_proxy: Callable[..., FaultProxy],
    requester_pays: bool | str,
    billed: str,
) -> None:
    """gcsfs adds ``userProject`` to its own calls only (listing); streamrec's range reads
    (``fs.url()``), first-bytes reads, sidecar reads and uploads went without it, so a
    requester-pays bucket could be listed but not read or written. A recording proxy in front
    of fake-gcs-server checks every request: listing, reading, sidecars and writing."""
    proxy = fault_proxy(gcs_server.endpoint_url)
    options = {
        **gcs_server.storage_options,
        "endpoint_url": proxy.url,
        "requester_pays": requester_pays,
    }
    small = [b"small-%d" % i for i in range(20)]
    large = [bytes([i % 251]) * 2000 for i in range(300)]  # > 256 KiB: a resumable upload
    for name, records in (("a", small), ("b", large)):
        with streamrec.sync.open_writer(
            f"gs://{gcs_bucket}/{name}.tfrecord",
            storage_options=options,
            part_bytes=256 << 10,
            index=True,
        ) as writer:
            writer.write_many(records)
    pattern = f"gs://{gcs_bucket}/*.tfrecord"
    ds = streamrec.open_dataset(pattern, storage_options=options)
    assert len(ds) == len(small) + len(large)  # from the sidecars
    assert list(ds) == small + large
    one = streamrec.open_dataset(f"gs://{gcs_bucket}/a.tfrecord", storage_options=options)
    assert list(one) == small  # a single object: its first bytes read directly

    records = proxy.records
    unbilled = [
        f"{r.method} {r.target}" for r in records if f"userProject={billed}" not in r.target
    ]
    assert not unbilled, unbilled
    kinds = {
        "listing": lambda r: r.method == "GET" and f"/b/{gcs_bucket}/o?" in r.target,
        "reading": lambda r: r.method == "GET" and "/download/" in r.target,
        "sidecar": lambda r: "/download/" in r.target and ".idx" in r.target,
        "media upload": lambda r: r.method == "POST" and "uploadType=media" in r.target,
        "resumable upload": lambda r: r.method == "POST" and "uploadType=resumable" in r.target,
        "chunk": lambda r: r.method == "PUT",
    }
    missing = [kind for kind, seen in kinds.items() if not any(map(seen, records))]
    assert not missing, [f"{r.method} {r.target}" for r in records]
