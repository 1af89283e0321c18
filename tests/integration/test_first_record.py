"""The start-up work ``open_dataset`` begins for S3 (storage/warmup.py, storage/s3_client.py):
it changes nothing a reader sees, raises nothing of its own, and leaves nothing running."""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import streamrec
from streamrec.errors import StorageError
from streamrec.format.framing import RecordEncoder
from streamrec.storage import s3_client, warmup
from streamrec.storage.retry import RetryPolicy
from support.servers import MotoS3Server

FAST = RetryPolicy(max_attempts=2, initial_backoff_s=0.01, max_backoff_s=0.02, timeout_s=2)
SHARDS = {
    f"part-{i:02d}.tfrecord": [b"%d-%d" % (i, j) * (j + 1) for j in range(50)] for i in range(3)
}


@pytest.fixture
def cold(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The process as if it had made no S3 client yet: the warm-up has work to do again (the
    parsed models stay: loading them twice is what the warm-up saves, not what it changes)."""
    warmup.wait()
    monkeypatch.setattr(s3_client, "_models_loaded", False)
    monkeypatch.setattr(s3_client, "_tls_contexts", {})
    monkeypatch.setattr(s3_client, "_parked", [])
    yield
    warmup.wait()


@pytest.fixture
def shards(s3_server: MotoS3Server, s3_bucket: str) -> str:
    for name, payloads in SHARDS.items():
        s3_server.put(s3_bucket, f"d/{name}", RecordEncoder().encode_many(payloads))
    return f"s3://{s3_bucket}/d/*.tfrecord"


def _warm_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("streamrec-warmup")]


def _no_prewarm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("streamrec.pipeline.dataset.prewarm", lambda urls, options: None)


EXPECTED = [p for name in sorted(SHARDS) for p in SHARDS[name]]


@pytest.mark.parametrize("when", ["after the warm-up", "during the warm-up", "without it"])
def test_records_and_state_are_the_same_with_the_warm_up(
    cold: None,
    shards: str,
    s3_server: MotoS3Server,
    monkeypatch: pytest.MonkeyPatch,
    when: str,
) -> None:
    if when == "without it":
        _no_prewarm(monkeypatch)
    ds = streamrec.open_dataset(shards, storage_options=s3_server.storage_options)
    if when == "after the warm-up":
        warmup.wait()
        assert s3_client._parked and s3_client._tls_contexts  # the work was done ahead
    records = iter(ds)
    got = [next(records) for _ in range(70)]
    state = ds.state_dict()
    got += list(records)
    assert got == EXPECTED
    if when != "without it":
        assert not s3_client._parked  # the first client took the session made for it
    again = streamrec.open_dataset(shards, storage_options=s3_server.storage_options)
    again.load_state_dict(state)
    assert list(again) == EXPECTED[70:]


def test_closing_a_dataset_never_iterated_leaves_no_thread(cold: None) -> None:
    ds = streamrec.open_dataset(
        "s3://no-bucket/d/*.tfrecord",
        storage_options={
            "key": "k",
            "secret": "s",
            "client_kwargs": {"endpoint_url": "http://127.0.0.1:9"},
        },
    )
    ds.close()
    assert _warm_threads() == []
    assert s3_client._parked  # close waited for the work, it did not skip it


@pytest.mark.parametrize("warm", [True, False])
@pytest.mark.parametrize(
    "problem", ["nothing listening at the endpoint", "a CA bundle that does not exist"]
)
def test_set_up_errors_surface_as_without_the_warm_up(
    cold: None, monkeypatch: pytest.MonkeyPatch, warm: bool, problem: str, tmp_path: Any
) -> None:
    client_kwargs: dict[str, Any] = {"endpoint_url": "http://127.0.0.1:9"}
    if problem == "a CA bundle that does not exist":
        client_kwargs["verify"] = str(tmp_path / "missing-ca.pem")
    options = {"key": "k", "secret": "s", "client_kwargs": client_kwargs}
    if not warm:
        _no_prewarm(monkeypatch)
    ds = streamrec.open_dataset("s3://bucket/d/*.tfrecord", storage_options=options, retry=FAST)
    warmup.wait()
    with pytest.raises(StorageError, match=r"s3://bucket/d/\*\.tfrecord") as raised:
        list(ds)
    assert not _warm_threads()
    assert not s3_client._tls_contexts.get(client_kwargs.get("verify"))  # no failure kept
    # the same error either way: its type and its words (the url, the cause)
    monkeypatch.setattr(s3_client, "_models_loaded", False)
    _no_prewarm(monkeypatch)
    with pytest.raises(type(raised.value)) as plain:
        list(
            streamrec.open_dataset("s3://bucket/d/*.tfrecord", storage_options=options, retry=FAST)
        )
    assert _untimed(str(plain.value)) == _untimed(str(raised.value))


def _untimed(message: str) -> str:
    return re.sub(r"\d+(\.\d+)? s\b", "<t> s", message)


def test_a_fork_waits_for_the_warm_up_jobs() -> None:
    """A child never inherits a half-done job (a lock held by a thread that is not there)."""
    started, finished = threading.Event(), threading.Event()

    def job() -> None:
        started.set()
        total = 0
        for i in range(2_000_000):  # ~0.1 s of bytecode: the GIL passes to the forker meanwhile
            total += i
        finished.set()

    warmup.start("test", job)
    started.wait()
    pid = os.fork()
    if pid == 0:  # the child: nothing to do
        os._exit(0)
    assert finished.is_set()
    assert os.waitpid(pid, 0)[1] == 0
    warmup.wait()
    assert not _warm_threads()


def test_a_failing_job_is_dropped_and_the_process_goes_on() -> None:
    def job() -> None:
        raise RuntimeError("broken warm-up")

    warmup.start("test", job)
    warmup.wait()
    assert warmup.pending() == 0
