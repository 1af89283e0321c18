"""``streamrec probe``: measurements through an emulated link, and the settings they give.

The link is the fault proxy in front of the moto S3 server: every request waits ``DELAY_S``
(a round trip) and every connection receives at most ``CAP`` bytes per second (a per-flow
bandwidth), so one connection cannot fill it and more connections move more. The test checks
what must hold on such a link, not numbers: the round trip measured is at least the delay, one
connection is held to the cap, the recommended concurrency is more than one and the
recommended settings follow the documented rule.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from integration.test_cli import REPO, cli
from streamrec.cli import build_parser
from support.fault_proxy import FaultProxy
from support.servers import MotoS3Server

pytestmark = pytest.mark.slow  # seconds a test: `pytest -m slow` (a CI step of its own)

MIB = 1 << 20
DELAY_S = 0.05
CAP = 2 * MIB  # bytes per second per connection
OBJECTS = 4
OBJECT_BYTES = 2 * MIB
PROBE = ["--concurrency", "1,2,4,8", "--block-sizes", "256KiB,1MiB"]

TOP_KEYS = {
    "url",
    "duration_s",
    "listing",
    "round_trip",
    "single_connection",
    "reads",
    "writes",
    "recommended",
    "explanation",
    "notes",
}
STEP_KEYS = {"concurrency", "block_bytes", "bytes", "seconds", "requests", "bytes_per_s"}


def _linked_store(
    s3_server: MotoS3Server,
    bucket: str,
    fault_proxy: Callable[..., FaultProxy],
) -> tuple[str, dict[str, Any]]:
    """Objects in ``bucket``, and storage options that reach them through the slow link."""
    for number in range(OBJECTS):
        data = bytes([number]) * OBJECT_BYTES
        s3_server.put(bucket, f"data/part-{number}.tfrecord", data)
    proxy = fault_proxy(s3_server.endpoint_url, bytes_per_s_per_connection=CAP)
    proxy.delay(DELAY_S)
    options = {**s3_server.storage_options, "client_kwargs": {"endpoint_url": proxy.url}}
    return f"s3://{bucket}/data/*.tfrecord", options


def _check_recommendation(document: dict[str, Any], cap_bytes: int = 1 << 30) -> None:
    dataset = document["recommended"]["open_dataset"]
    concurrency, block = dataset["max_concurrency"], dataset["block_bytes"]
    assert dataset["prefetch_bytes"] == min(cap_bytes, max(concurrency * block, 2 * block))
    # the setting recommended is one that was measured, within 1.1x of the best
    best = max(step["bytes_per_s"] for step in document["reads"])
    chosen = [
        s for s in document["reads"] if (s["concurrency"], s["block_bytes"]) == (concurrency, block)
    ]
    assert chosen and chosen[0]["bytes_per_s"] * 1.1 >= best
    assert document["recommended"]["expected_bytes_per_s"] == chosen[0]["bytes_per_s"]
    assert isinstance(document["explanation"], str) and "prefetch_bytes" in document["explanation"]


def test_a_capped_slow_link_is_measured_and_asks_for_concurrency(
    s3_server: MotoS3Server, s3_bucket: str, fault_proxy: Callable[..., FaultProxy]
) -> None:
    url, options = _linked_store(s3_server, s3_bucket, fault_proxy)
    before = s3_server.list(s3_bucket)
    run = cli("probe", url, "--storage-options", json.dumps(options), "--duration-s", "8",
              "--json", *PROBE)  # fmt: skip
    assert run.rc == 0, run.err
    document = run.json()
    assert set(document) == TOP_KEYS
    assert document["listing"]["objects"] == OBJECTS
    assert document["listing"]["total_bytes"] == OBJECTS * OBJECT_BYTES
    round_trip = document["round_trip"]
    assert round_trip["samples"] >= 3
    assert round_trip["p90_s"] >= round_trip["median_s"] >= DELAY_S
    single = document["single_connection"]
    assert set(single) == STEP_KEYS and single["concurrency"] == 1
    assert single["bytes_per_s"] <= CAP * 1.1  # one connection is held to the link's cap
    assert document["reads"] and all(set(step) == STEP_KEYS for step in document["reads"])
    assert document["writes"] == []
    recommended = document["recommended"]
    assert recommended["open_dataset"]["max_concurrency"] > 1, document
    assert recommended["expected_bytes_per_s"] > CAP  # more than one connection could give
    assert recommended["open_writer"]["part_bytes"] >= 5 * MIB  # S3's minimum part
    _check_recommendation(document)
    assert s3_server.list(s3_bucket) == before  # nothing written without --write


def test_write_measures_uploads_and_removes_them(
    s3_server: MotoS3Server,
    s3_bucket: str,
    fault_proxy: Callable[..., FaultProxy],
    s3_small_parts: int,
) -> None:
    url, options = _linked_store(s3_server, s3_bucket, fault_proxy)
    before = s3_server.list(s3_bucket)
    run = cli("probe", url, "--storage-options", json.dumps(options), "--duration-s", "4",
              "--json", "--write", "--part-bytes", "64KiB", *PROBE)  # fmt: skip
    assert run.rc == 0, run.err
    document = run.json()
    writes = document["writes"]
    assert writes and all(step["block_bytes"] == 64 << 10 for step in writes)
    assert all(step["bytes"] == step["requests"] * (64 << 10) for step in writes)
    assert document["recommended"]["open_writer"]["part_bytes"] == 64 << 10
    assert s3_server.list(s3_bucket) == before
    assert s3_server.list_multipart_uploads(s3_bucket) == []


def test_a_local_directory_is_probed_and_plotted(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    data = tmp_path / "data"
    data.mkdir()
    for number in range(3):
        (data / f"part-{number}.tfrecord").write_bytes(bytes([number]) * (3 * MIB))
    plot = tmp_path / "throughput.png"
    run = cli("probe", str(data), "--duration-s", "2", "--plot", str(plot), *PROBE)
    assert run.rc == 0, run.err
    lines = run.out.splitlines()
    assert lines[0].startswith(f"probe {data}: 3 objects, 9.0 MiB, listed in ")
    assert any(line.startswith("round trip      median ") for line in lines)
    assert any(line.startswith("reads, MiB/s") for line in lines)
    assert "recommended:" in lines
    assert any(line.startswith("  open_dataset(..., max_concurrency=") for line in lines)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in data.iterdir()) == [f"part-{n}.tfrecord" for n in range(3)]

    written = cli("probe", str(data), "--duration-s", "1", "--json", "--write",
                  "--part-bytes", "1MiB", *PROBE)  # fmt: skip
    assert written.rc == 0, written.err
    document = written.json()
    assert document["writes"]
    _check_recommendation(document)
    assert sorted(p.name for p in data.iterdir()) == [f"part-{n}.tfrecord" for n in range(3)]


def test_nothing_to_probe_is_one_clear_error(
    tmp_path: Path, s3_server: MotoS3Server, s3_bucket: str
) -> None:
    missing = tmp_path / "nothing-here"
    run = cli("probe", str(missing), "--duration-s", "1")
    assert run.rc == 1 and run.out == ""
    assert run.err.startswith("streamrec: error: ") and str(missing) in run.err
    assert len(run.err.strip().splitlines()) == 1, run.err

    url = f"s3://{s3_bucket}/no-such-prefix/*.tfrecord"
    options = json.dumps(s3_server.storage_options)
    run = cli("probe", url, "--storage-options", options, "--duration-s", "1")
    assert run.rc == 1 and run.out == ""
    assert run.err.startswith("streamrec: error: ") and url in run.err


def test_plot_without_matplotlib_says_so_before_measuring(tmp_path: Path) -> None:
    (tmp_path / "a.tfrecord").write_bytes(b"x" * 1024)
    # a matplotlib first on the path that cannot be imported, as when it is not installed
    hidden = tmp_path / "hidden" / "matplotlib"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text("raise ImportError('no matplotlib here')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(hidden.parent), str(REPO)]))
    done = subprocess.run(
        [sys.executable, "-m", "streamrec.cli", "probe", str(tmp_path / "a.tfrecord"),
         "--plot", str(tmp_path / "x.png")],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("streamrec: error: --plot needs matplotlib"), done.stderr
    assert done.stdout == ""  # refused before measuring anything
    assert not (tmp_path / "x.png").exists()


def test_probe_is_registered_and_its_help_explains_every_option() -> None:
    assert "    probe " in build_parser().format_help()
    run = cli("probe", "--help")
    assert run.rc == 0, run.err
    help_text = run.out
    for option in (
        "--duration-s",
        "--concurrency",
        "--block-sizes",
        "--memory-cap",
        "--write",
        "--part-bytes",
        "--plot",
        "--json",
        "--storage-options",
        "--timeout",
    ):
        assert option in help_text, option
    assert "matplotlib" in help_text
    assert "Nothing is written without --write" in help_text
