"""An HTTP server that ignores ``Range`` (Python's own ``http.server``): a clear error, not
every block reading the whole object."""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

import streamrec
from streamrec.errors import RetriesExhaustedError, StorageError
from streamrec.storage.retry import RetryPolicy

FAST = RetryPolicy(max_attempts=3, initial_backoff_s=0.01, max_backoff_s=0.02, timeout_s=10)


class _Handler(SimpleHTTPRequestHandler):
    """The standard library's static file handler (it never answers 206); quiet, counted."""

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.server.gets += 1  # type: ignore[attr-defined]
        super().do_GET()


@pytest.fixture
def plain_server(tmp_path: Path) -> Iterator[tuple[Path, str, ThreadingHTTPServer]]:
    server = ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_Handler, directory=str(tmp_path))
    )
    server.gets = 0  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield tmp_path, f"http://127.0.0.1:{server.server_address[1]}", server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _write_shard(path: Path, records: list[bytes]) -> None:
    with streamrec.sync.open_writer(str(path)) as w:
        w.write_many(records)


def test_a_server_ignoring_range_is_a_clear_error_naming_it(
    plain_server: tuple[Path, str, ThreadingHTTPServer],
) -> None:
    root, base, server = plain_server
    records = [bytes([i % 256]) * 1000 for i in range(3000)]  # ~3 MB: many blocks
    _write_shard(root / "big.tfrecord", records)
    ds = streamrec.open_dataset(
        f"{base}/big.tfrecord", retry=FAST, block_bytes=256 << 10, max_concurrency=8
    )
    with pytest.raises(StorageError, match="ignored the Range header") as caught:
        list(ds)
    assert not isinstance(caught.value, RetriesExhaustedError)  # not retried: it will not heal
    assert "206" in str(caught.value) and f"{base}/big.tfrecord" in str(caught.value)
    # list() asks len(ds) first: a lookup of the object and of its index sidecar; then the
    # first read and one wave of blocks at most, never one whole object per block read
    assert server.gets <= 2 + 1 + 8  # type: ignore[attr-defined]


def test_a_small_object_in_one_answer_still_reads(
    plain_server: tuple[Path, str, ThreadingHTTPServer],
) -> None:
    root, base, _ = plain_server
    records = [b"x" * 100 for _ in range(50)]
    _write_shard(root / "small.tfrecord", records)
    assert list(streamrec.open_dataset(f"{base}/small.tfrecord", retry=FAST)) == records
