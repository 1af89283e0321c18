"""The start-up work ``open_dataset`` begins for S3 (storage/warmup.py, storage/s3/tls.py):
it changes nothing a reader sees, raises nothing of its own, and leaves nothing running."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import threading
from collections.abc import Iterator
from contextlib import aclosing
from typing import Any

import pytest

import streamrec
from streamrec.errors import (
    ObjectNotFoundError,
    PermissionDeniedError,
    StorageError,
    TransientStorageError,
)
from streamrec.format.framing import RecordEncoder
from streamrec.pipeline.stream.engine import ReadEngine, _EarlyStart
from streamrec.pipeline.stream.prefetch import ObjectReader
from streamrec.storage import warmup
from streamrec.storage.http.range_get import RangeClient
from streamrec.storage.retry import RetryPolicy
from streamrec.storage.s3 import tls as s3_tls
from streamrec.storage.s3.store import S3Store
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
    monkeypatch.setattr(s3_tls, "_tls_contexts", {})
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
    ds = streamrec.open_dataset(shards, storage_options=s3_server.client_storage_options)
    if when == "after the warm-up":
        warmup.wait()
    records = iter(ds)
    got = [next(records) for _ in range(70)]
    state = ds.state_dict()
    got += list(records)
    assert got == EXPECTED
    again = streamrec.open_dataset(shards, storage_options=s3_server.client_storage_options)
    again.load_state_dict(state)
    assert list(again) == EXPECTED[70:]


def test_closing_a_dataset_never_iterated_leaves_no_thread(cold: None) -> None:
    ds = streamrec.open_dataset(
        "s3://no-bucket/d/*.tfrecord",
        storage_options={
            "key": "k",
            "secret": "s",
            "client_kwargs": {"endpoint_url": "http://127.0.0.1:9"},
            "config_kwargs": {"signature_version": "s3v4"},  # a client to warm up for
        },
    )
    ds.close()
    assert _warm_threads() == []


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
    assert not s3_tls._tls_contexts.get(client_kwargs.get("verify", True))  # no failure kept
    # the same error either way: its type and its words (the url, the cause)
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


@pytest.mark.parametrize("left", ["a TLS context being built", "the set-up lock held"])
def test_a_forked_child_waits_for_none_of_its_parents_threads(
    monkeypatch: pytest.MonkeyPatch, left: str
) -> None:
    """A child forked while a thread of the parent (a client's set-up, in an executor thread)
    builds a TLS context, or holds the set-up lock: that thread is not in the child, whose
    clients build their own context instead of waiting for it forever."""
    monkeypatch.setattr(s3_tls, "_tls_contexts", {})
    verify = "/no/such/ca-bundle.pem"
    held, release = threading.Event(), threading.Event()
    holder = None
    if left == "a TLS context being built":
        claimed = s3_tls._claim(verify)  # its builder: a thread the child will not have
        assert claimed[1]
    else:

        def hold() -> None:
            with s3_tls._lock:
                held.set()
                release.wait()

        holder = threading.Thread(target=hold)
        holder.start()
        held.wait()
    pid = os.fork()
    if pid == 0:  # the child
        signal.alarm(20)  # a bound, not a pace: a child stuck on the lock is killed
        again = s3_tls._claim(verify)
        os._exit(0 if again[1] else 1)  # its own to build
    release.set()
    if holder is not None:
        holder.join()
    status = os.waitpid(pid, 0)[1]
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status


def test_a_job_is_waited_for_when_the_jobs_were_looked_at_as_it_started(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Another thread looks at the jobs (a fork's wait, a store's settled()) while start() is
    between listing a job and starting its thread: the job is not forgotten."""
    release = threading.Event()

    class LookedAtAsItStarts(threading.Thread):
        def start(self) -> None:
            warmup.pending()  # (what another thread may do at this very moment)
            super().start()

    monkeypatch.setattr(warmup.threading, "Thread", LookedAtAsItStarts)
    warmup.start("test", release.wait)
    monkeypatch.undo()
    try:
        assert warmup.pending() == 1  # running: fork and close still wait for it
    finally:
        release.set()
        warmup.wait()
    assert warmup.pending() == 0 and not _warm_threads()


def test_a_failing_job_is_dropped_and_the_process_goes_on() -> None:
    def job() -> None:
        raise RuntimeError("broken warm-up")

    warmup.start("test", job)
    warmup.wait()
    assert warmup.pending() == 0


# ---------------------------------------------------------------- the first GET before the
# listing's end (engine._EarlyStart, S3Store.glob_pages, sources._list_glob)

MANY = {f"s-{i:02d}.tfrecord": [b"%d:%d" % (i, j) for j in range(5 + i)] for i in range(7)}
MANY_EXPECTED = [p for name in sorted(MANY) for p in MANY[name]]


@pytest.fixture
def many(s3_server: MotoS3Server, s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Seven shards (and hidden names a glob skips) listed two keys a page."""
    for name, payloads in MANY.items():
        s3_server.put(s3_bucket, f"m/{name}", RecordEncoder().encode_many(payloads))
    s3_server.put(s3_bucket, "m/_a-hidden.tfrecord", RecordEncoder().encode_many([b"no"]))
    s3_server.put(s3_bucket, "m/_b-hidden.tfrecord", RecordEncoder().encode_many([b"no"]))
    s3_server.put(s3_bucket, "m/_c-hidden.tfrecord", RecordEncoder().encode_many([b"no"]))
    monkeypatch.setattr(S3Store, "list_page_keys", 2)
    return f"s3://{s3_bucket}/m/*.tfrecord"


class Spy:
    """Which listing page was in when the first shard's reader started."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.pages = 0
        self.started_after: list[int] = []
        self.fail_after: int | None = None  # pages, then an error
        self.failures = 1_000  # that many times (then the listing succeeds)
        self.error: Exception = PermissionDeniedError("s3://x: listing: denied")
        pages, start = S3Store._glob_pages, _EarlyStart.start
        spy = self

        async def glob_pages(store: S3Store, *args: Any) -> Any:
            async with aclosing(pages(store, *args)) as each:
                async for page in each:
                    if spy.fail_after is not None and spy.pages >= spy.fail_after:
                        spy.failures -= 1
                        if spy.failures == 0:
                            spy.fail_after = None
                        raise spy.error
                    spy.pages += 1
                    yield page

        def early_start(early: _EarlyStart, shard: Any) -> None:
            spy.started_after.append(spy.pages)
            start(early, shard)

        monkeypatch.setattr(S3Store, "_glob_pages", glob_pages)
        monkeypatch.setattr(_EarlyStart, "start", early_start)


def _late(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ReadEngine, "_starts_early", lambda self, resume: False)


def test_first_get_starts_with_the_first_page_and_reads_the_same(
    many: str, s3_server: MotoS3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = Spy(monkeypatch)
    ds = streamrec.open_dataset(many, storage_options=s3_server.storage_options)
    records = iter(ds)
    got = [next(records) for _ in range(20)]
    state = ds.state_dict()
    got += list(records)
    assert got == MANY_EXPECTED
    # 10 names two a page: the first visible one (s-00) is on page 2 (after 3 hidden names)
    assert spy.pages == 5 and spy.started_after == [2]
    _late(monkeypatch)  # the same reader without the early start: the same records, state
    late = streamrec.open_dataset(many, storage_options=s3_server.storage_options)
    late_records = iter(late)
    assert [next(late_records) for _ in range(20)] == MANY_EXPECTED[:20]
    assert late.state_dict() == state
    assert spy.started_after == [2]  # (not called again)
    again = streamrec.open_dataset(many, storage_options=s3_server.storage_options)
    again.load_state_dict(state)  # resuming: no early start, the same continuation
    assert list(again) == MANY_EXPECTED[20:]
    assert spy.started_after == [2]


@pytest.mark.parametrize(
    "options", [{"shuffle_shards": True}, {"num_hosts": 2}, {"cycle_length": 2}]
)
def test_no_early_start_where_the_first_listed_may_not_be_first(
    many: str, s3_server: MotoS3Server, monkeypatch: pytest.MonkeyPatch, options: dict[str, Any]
) -> None:
    spy = Spy(monkeypatch)
    got = list(streamrec.open_dataset(many, storage_options=s3_server.storage_options, **options))
    _late(monkeypatch)
    assert got == list(
        streamrec.open_dataset(many, storage_options=s3_server.storage_options, **options)
    )
    assert spy.started_after == []


def test_an_empty_glob_is_the_same_clear_error(
    s3_server: MotoS3Server, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"s3://{s3_bucket}/none/*.tfrecord"
    with pytest.raises(ObjectNotFoundError, match="matched no object") as early:
        list(streamrec.open_dataset(url, storage_options=s3_server.storage_options))
    _late(monkeypatch)
    with pytest.raises(ObjectNotFoundError) as late:
        list(streamrec.open_dataset(url, storage_options=s3_server.storage_options))
    assert str(early.value) == str(late.value)


def _tasks_left() -> set[asyncio.Task[Any]]:
    return {t for t in asyncio.all_tasks() if t is not asyncio.current_task()}


def test_a_listing_error_after_the_first_page_cancels_the_started_get(
    many: str, s3_server: MotoS3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = Spy(monkeypatch)
    spy.fail_after = 3  # the reader started after page 2; page 4 fails

    async def run() -> None:
        ds = streamrec.open_dataset(many, storage_options=s3_server.storage_options)
        with pytest.raises(PermissionDeniedError, match="denied"):
            async for _ in ds:
                pass
        assert _tasks_left() == set()

    asyncio.run(run())
    assert spy.started_after == [2]


def test_a_transient_listing_error_lists_that_page_again_with_the_same_records(
    many: str, s3_server: MotoS3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = Spy(monkeypatch)
    list_page, failed = S3Store._list_page, []

    async def failing_page(store: S3Store, *args: Any, **kwargs: Any) -> Any:
        if args[-1] == 3 and not failed:  # the fourth page, once
            failed.append(args)
            raise TransientStorageError("s3://x: listing: try again")
        return await list_page(store, *args, **kwargs)

    monkeypatch.setattr(S3Store, "_list_page", failing_page)
    ds = streamrec.open_dataset(many, storage_options=s3_server.storage_options, retry=FAST)
    assert [record for record in ds] == MANY_EXPECTED  # (list() would count first)
    assert ds.stats.retries >= 1 and failed
    # that page retried alone: the first three listed once, the reader started once
    assert spy.pages == 5 and spy.started_after == [2]
    assert ds.stats.shards_opened == len(MANY)


def test_closing_before_the_first_record_cancels_the_started_get(
    many: str, s3_server: MotoS3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = Spy(monkeypatch)

    async def run() -> None:
        started = asyncio.Event()
        start = _EarlyStart.start

        def early_start(early: _EarlyStart, shard: Any) -> None:
            start(early, shard)
            started.set()

        monkeypatch.setattr(_EarlyStart, "start", early_start)
        ds = streamrec.open_dataset(many, storage_options=s3_server.storage_options)
        records = ds.__aiter__()
        first = asyncio.ensure_future(records.__anext__())
        await started.wait()  # the GET is in flight, the listing goes on
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        await records.aclose()
        assert _tasks_left() == set()

    asyncio.run(run())
    assert spy.started_after == [2]


def test_a_listing_out_of_order_starts_a_reader_that_is_dropped(
    many: str, s3_server: MotoS3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unsorted pages (S3 Express directory buckets list so): the shard told first is not
    the plan's first; its reader is cancelled and shard 0 read as usual."""
    spy = Spy(monkeypatch)
    pages = S3Store._glob_pages

    async def backwards(store: S3Store, *args: Any) -> Any:
        listed = [page async for page in pages(store, *args)]
        for page in reversed(listed):
            yield page

    monkeypatch.setattr(S3Store, "_glob_pages", backwards)
    closed: list[str] = []
    aclose = ObjectReader.aclose

    async def spied_aclose(reader: ObjectReader) -> None:
        closed.append(reader.obj.url)
        await aclose(reader)

    monkeypatch.setattr(ObjectReader, "aclose", spied_aclose)
    ds = streamrec.open_dataset(many, storage_options=s3_server.storage_options)
    assert list(ds) == MANY_EXPECTED
    assert len(spy.started_after) == 1
    assert closed[0].endswith("/s-05.tfrecord")  # told first (last page first), dropped first


KEYS = [
    "g/a.tfrecord",
    "g/a.tfrecord.idx",
    "g/b c.tfrecord",
    "g/é-3.tfrecord",
    "g/_hidden.tfrecord",
    "g/sub/d.tfrecord",
    "g/sub.tfrecord",
    "g/x.json",
    "g2/a.tfrecord",
    "top.tfrecord",
]


@pytest.mark.parametrize(
    "pattern",
    ["g/*", "g/*.tfrecord", "g/[ab]*", "g/?.tfrecord", "g/*.idx", "*.tfrecord", "g/sub*"],
)
def test_paged_glob_lists_what_expand_lists(
    s3_server: MotoS3Server, s3_bucket: str, monkeypatch: pytest.MonkeyPatch, pattern: str
) -> None:
    for key in KEYS:
        s3_server.put(s3_bucket, key, b"x" * (len(key) % 7 + 1))
    monkeypatch.setattr(S3Store, "list_page_keys", 2)
    url = f"s3://{s3_bucket}/{pattern}"

    async def both() -> tuple[list[Any], list[Any], int]:
        store = S3Store(s3_server.storage_options)
        try:
            pages = store.glob_pages(url)
            assert pages is not None
            paged = [page async for page in pages]
            assert store._client is None  # listed through the door: no client made
            listed = sorted((o for page in paged for o in page), key=lambda o: o.url)
            return listed, await store.expand(url), len(paged)
        finally:
            await store.close()

    paged, expanded, count = asyncio.run(both())
    assert [(o.url, o.size, o.version) for o in paged] == [
        (o.url, o.size, o.version) for o in expanded
    ]
    assert count > 1 or pattern in ("*.tfrecord", "g/sub*")  # (a page or two of keys)


@pytest.mark.parametrize("url", ["s3://bucket/g/a.tfrecord", "s3://b*/g/a", "s3://b?/*"])
def test_globs_not_listed_page_by_page(url: str) -> None:
    # no wildcard, a wildcard in the bucket: the filesystem's (deep globs are paged:
    # tests/integration/test_listing_pages.py)
    store = S3Store({"key": "k", "secret": "s"})
    assert store.glob_pages(url) is None


def test_a_warm_up_that_cannot_start_leaves_nothing_to_wait_for(
    cold: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No thread to spare: the TLS context the warm-up claimed is given up, not waited for;
    the store's first request builds its own."""

    def no_thread(name: str, job: Any, **kwargs: Any) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(warmup, "start", no_thread)
    options = {"key": "k", "secret": "s", "client_kwargs": {"endpoint_url": "https://h:9"}}
    with pytest.raises(RuntimeError):
        s3_tls.prewarm(options)
    assert s3_tls._tls_contexts == {}  # nothing claimed is left unbuilt

    async def built() -> Any:
        return await asyncio.wait_for(s3_tls.start_tls_context(True), 60)

    assert asyncio.run(built()) is not None
    assert s3_tls._tls_contexts  # the reader built and kept its own


@pytest.mark.parametrize("early", [True, False], ids=["early-start", "after-listing"])
def test_the_first_reader_asks_for_its_first_block_alone(
    s3_server: MotoS3Server, s3_bucket: str, monkeypatch: pytest.MonkeyPatch, early: bool
) -> None:
    """The consumer waits for the first shard's first block: it goes out alone, the rest of
    that shard's ramp once a piece of it was handed on; later shards ramp at once."""
    shards = {f"r-{i}.tfrecord": [b"%d:%03d|" % (i, j) * 40 for j in range(60)] for i in range(2)}
    for name, payloads in shards.items():
        s3_server.put(s3_bucket, f"ramp/{name}", RecordEncoder().encode_many(payloads))
    requests: list[tuple[str, int, bool]] = []  # (object, first byte, a piece handed on yet)
    request = ObjectReader._request

    def spying(reader: ObjectReader, length: int) -> None:
        requests.append((reader.obj.url.rsplit("/", 1)[-1], reader._next, reader._handed))
        request(reader, length)

    monkeypatch.setattr(ObjectReader, "_request", spying)
    if not early:
        _late(monkeypatch)
    ds = streamrec.open_dataset(
        f"s3://{s3_bucket}/ramp/*.tfrecord",
        storage_options=s3_server.storage_options,
        block_bytes=2048,  # a shard of ~24 KB: a dozen blocks
    )
    assert list(ds) == [p for name in sorted(shards) for p in shards[name]]
    first = [(start, handed) for name, start, handed in requests if name == "r-0.tfrecord"]
    assert first[0] == (0, False)
    assert len(first) > 2 and all(handed for _, handed in first[1:])
    second = [handed for name, _, handed in requests if name == "r-1.tfrecord"]
    assert second.count(False) > 1  # primed ahead, its whole ramp at once


def test_a_glob_opens_the_first_gets_connection_beside_its_listing(
    s3_server: MotoS3Server, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    payloads = [b"warm %d" % i for i in range(30)]
    s3_server.put(s3_bucket, "warm/only.tfrecord", RecordEncoder().encode_many(payloads))
    warmed: list[str] = []
    found: list[tuple[RangeClient, bool]] = []  # per connection taken: was one pooled
    warm, take = RangeClient.warm, RangeClient._take

    def spying_warm(client: RangeClient, url: str) -> None:
        warmed.append(url)
        warm(client, url)

    def spying_take(client: RangeClient, key: Any) -> Any:
        conn = take(client, key)
        found.append((client, conn is not None))
        return conn

    monkeypatch.setattr(RangeClient, "warm", spying_warm)
    monkeypatch.setattr(RangeClient, "_take", spying_take)
    url = f"s3://{s3_bucket}/warm/*.tfrecord"
    options = s3_server.storage_options  # (the door: a store reading through its client
    # sends get_object on the client's own pool)
    assert list(streamrec.open_dataset(url, storage_options=options)) == payloads
    assert len(warmed) == 1  # as the listing started
    takes: dict[RangeClient, list[bool]] = {}  # per client, in order: was one pooled
    for client, taken in found:
        takes.setdefault(client, []).append(taken)
    # the listing's page opened one, the GET found the warmed one
    assert [False, True] in [taken[:2] for taken in takes.values()]
