"""Saying what it is doing: retries logged as warnings, ``-v`` (requests, timings),
``--timeout`` named in the final error, ``--version`` and the pure-Python fallback."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import streamrec
from integration.test_cli import cli, write_records
from streamrec.format import framing
from support.fault_proxy import FaultProxy
from support.server_fixtures import HttpDir


def test_a_hung_endpoint_logs_every_retry_and_names_the_timeout(
    http_dir: HttpDir, fault_proxy: Callable[..., FaultProxy]
) -> None:
    url = http_dir.write("data.tfrecord", b"")
    proxy = fault_proxy(url.split("/dir-")[0])
    proxy.stall(60, method="GET")  # nothing ever comes back (stop() ends the stall)
    proxied = proxy.url + "/" + url.split("/", 3)[3]
    run = cli("count", "--timeout", "0.3", proxied)
    assert run.rc == 1
    lines = run.err.splitlines()
    retries = [line for line in lines if line.startswith("streamrec: warning: ")]
    assert len(retries) == 5, run.err  # 6 attempts: 5 retries, each said at once
    for number, line in enumerate(retries, 1):
        assert re.fullmatch(
            rf"streamrec: warning: listing {re.escape(proxied)}: attempt {number} of 6 failed "
            r"\(.*no answer within 0\.3 s\); retrying in \d+\.\d\d s",
            line,
        ), line
    assert lines[-1].startswith(f"streamrec: error: listing {proxied}: gave up after 6 attempt(s)")
    assert "RetryPolicy timeout_s=0.3 per attempt" in lines[-1]


def test_verbose_logs_requests_and_the_time_taken(tmp_path: Path) -> None:
    path = write_records(tmp_path / "a.tfrecord", [b"x" * 10])
    run = cli("count", "-v", str(path))
    assert run.rc == 0
    lines = run.err.splitlines()
    assert re.fullmatch(
        rf"streamrec: debug: listing {re.escape(str(path))}: \d+\.\d{{3}} s", lines[0]
    )
    assert any(
        re.fullmatch(r"streamrec: debug: .*a\.tfrecord bytes 0-25: .* s", line) for line in lines
    )
    assert re.fullmatch(r"streamrec: info: count took \d+\.\d{3} s", lines[-1])
    assert cli("count", str(path)).err == ""  # quiet without -v
    assert "-v, --verbose" in cli("reshard", "--help").out


def test_version_says_whether_the_c_accelerators_are_used() -> None:
    from streamrec.format import accel as accelerators

    run = cli("--version")
    lines = run.out.splitlines()
    assert lines[0] == f"streamrec {streamrec.__version__}"
    assert lines[1] == accelerators.describe()
    used = "framing" if framing.accelerated else "none"
    assert lines[1].startswith(f"C accelerators: {used}")
    if accelerators.status()["local_reads"]:
        assert "large local records" in lines[1].split(";")[0]
    else:
        assert "pure Python (slower) for" in lines[1] and "large local records" in lines[1]


def test_a_pure_python_build_is_logged_once_at_info(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    from streamrec.format import accel as accelerators

    monkeypatch.setenv("STREAMREC_PURE_PYTHON", "1")  # as in an install without the C code
    monkeypatch.setattr(accelerators, "_logged", False)
    path = write_records(tmp_path / "a.tfrecord", [b"x"])
    with caplog.at_level(logging.INFO, logger="streamrec"):
        for _ in range(2):
            assert list(streamrec.open_dataset(str(path))) == [b"x"]
    said: list[Any] = [r for r in caplog.records if "C accelerators" in r.getMessage()]
    assert len(said) == 1
    assert said[0].levelno == logging.INFO
    assert "pure Python (slower) for framing" in said[0].getMessage()
