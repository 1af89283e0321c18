"""Shared fixtures: the TensorFlow-written reference corpus and both framing back ends."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from streamrec.format import framing
from streamrec.storage.local import records, store
from support.corpus import CORPUS_DIR, MANIFEST

pytest_plugins = ["support.server_fixtures"]


@pytest.fixture(scope="session")
def corpus_dir() -> Path:
    """Directory of the TensorFlow-written reference corpus."""
    return CORPUS_DIR


@pytest.fixture(scope="session")
def manifest() -> dict[str, Any]:
    """The corpus manifest: exact contents and TensorFlow's behaviour on every file."""
    return MANIFEST


SCANNERS = ["c", "python"] if framing.accelerated else ["python"]


@pytest.fixture(params=SCANNERS)
def scanner(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Run the test with the C frame scanner and again with the pure-Python fallback (the
    scan and the fused copy + CRC of big records, the direct reads of local large records)."""
    if request.param == "python":
        monkeypatch.setattr(records, "_cread", None)
        monkeypatch.setattr(store, "_CREAD", [None])  # local range reads into a bytearray
        monkeypatch.setattr(framing, "_scan", framing._scan_python)
        monkeypatch.setattr(framing, "_new_payload", framing._new_payload_python)
        monkeypatch.setattr(framing, "_fill", framing._fill_python)
        monkeypatch.setattr(framing, "_finish", bytes)
    yield request.param


@pytest.fixture(autouse=True)
def _fresh_link_memory() -> Iterator[None]:
    """Every test starts with no store's tuning learned (the reader's process-local memory,
    streamrec.pipeline.stream.tune.LINKS): a server on a port an earlier test's used never
    starts from what that one learned."""
    from streamrec.pipeline.stream.tune import LINKS

    LINKS.forget()
    yield
