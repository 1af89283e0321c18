"""Time to the first record through the emulated link, in fresh processes, with a timestamped
breakdown: ``bench_remote.py --first-only``'s workers, rounds and README section.

Cases (each a fresh process per sample; ``tree`` new is this repository's streamrec, old the
one ``--base`` names, imported through ``STREAMREC_BENCH_TREE``, see ``_harness/__init__``):

* ``glob``: ``open_dataset(glob)`` then at once ``next(iter(ds))``: timed from the call to
  ``open_dataset`` to the first record;
* ``glob, start-up gap``: ``open_dataset(glob)``, then ``gap`` seconds of other start-up work
  (a busy pure-Python loop: it holds the GIL as much as model-building Python does), then
  ``next(iter(ds))``: timed from the ``iter`` (what the caller waits for);
* ``glob, 2,500 objects``: ``glob`` over :data:`MANY` small objects (one 100 KiB record
  each): a listing of three pages (S3 lists 1,000 keys a page), timed like ``glob``;
* ``one object``: the first shard named exactly, timed like ``glob``;
* ``bare``: plain s3fs / aiobotocore, the named peer: ``S3FileSystem(asynchronous=True)``,
  ``set_session()`` (the client), one ``list_objects_v2`` of the glob's prefix, one 256 KiB
  range GET of the first key (the reader's first block), body read; timed from the
  filesystem's creation to the end of the body.

Every process first imports what the job needs (s3fs, aiohttp, streamrec: not timed), and
records timestamps of the requests: the client's creation (``AioSession._create_client``),
each request sent and its answer's headers (aiobotocore's ``AIOHTTPSession.send``, and
streamrec's own range GETs, ``storage/http/range_get.py``, where the tree has them), the first
new TCP connection (aiohttp's connector). ``again`` is a second iteration in the same
process (a new client; botocore's parsed data reused).
"""

from __future__ import annotations

import asyncio
import fnmatch
import json
import os
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .procs import rotated, run_script
from .report import now, replace_section
from .servers import RTT, Store, storage_options

__all__ = ["CASES", "FIRST_WORKERS", "measure_first_record", "render_first", "write_first"]

START_MARK = "<!-- bench_remote_first:start -->"
END_MARK = "<!-- bench_remote_first:end -->"
FIRST_BLOCK = 256 << 10
MARKS = ("client start", "client end", "LIST sent", "LIST answered", "GET sent", "GET answered")
MANY = 2500
MANY_PREFIX = f"many-{MANY}"
CASES = ("glob", "glob, start-up gap", f"glob, {MANY:,} objects", "one object", "bare")


class Timeline:
    """First-occurrence timestamps of the request path (patched into aiobotocore/aiohttp)."""

    def __init__(self) -> None:
        self.marks: dict[str, float] = {}
        import aiobotocore.httpsession as http  # type: ignore[import-untyped]
        import aiobotocore.session as session  # type: ignore[import-untyped]
        import aiohttp

        create, send = session.AioSession._create_client, http.AIOHTTPSession.send
        connect = aiohttp.TCPConnector._create_connection
        timeline = self

        async def timed_create(self: Any, *args: Any, **kwargs: Any) -> Any:
            timeline.mark("client start")
            try:
                return await create(self, *args, **kwargs)
            finally:
                timeline.mark("client end")

        async def timed_send(self: Any, request: Any) -> Any:
            kind = "LIST" if "list-type" in request.url or "delimiter" in request.url else "GET"
            timeline.mark(f"{kind} sent")
            response = await send(self, request)
            timeline.mark(f"{kind} answered")
            return response

        async def timed_connect(self: Any, *args: Any, **kwargs: Any) -> Any:
            timeline.mark("connect start")
            try:
                return await connect(self, *args, **kwargs)
            finally:
                timeline.mark("connect end")

        session.AioSession._create_client = timed_create
        http.AIOHTTPSession.send = timed_send
        aiohttp.TCPConnector._create_connection = timed_connect
        self._patch_range_client()

    def _patch_range_client(self) -> None:
        """The range GETs streamrec sends on its own connections (storage/http/range_get.py), if
        the tree has them: sent, answered (the head parsed), connected."""
        try:
            from streamrec.storage.http import range_get as http_range
        except ImportError:  # an older tree
            return
        timeline = self
        get, parse, connect = (
            http_range.RangeClient.get,
            http_range._parse_head,
            http_range.RangeClient._connect,
        )

        async def timed_get(self: Any, url: str, *args: Any, **kwargs: Any) -> Any:
            if "list-type" not in url:
                timeline.mark("GET sent")
                return await get(self, url, *args, **kwargs)
            timeline.mark("LIST sent")  # a glob's first page, listed early (storage/s3/listing.py)
            try:
                return await get(self, url, *args, **kwargs)
            finally:
                timeline.mark("LIST answered")

        def timed_parse(head: bytes) -> Any:
            if "LIST sent" not in timeline.marks or "LIST answered" in timeline.marks:
                timeline.mark("GET answered")  # (not the early LIST's answer)
            return parse(head)

        async def timed_range_connect(self: Any, *args: Any, **kwargs: Any) -> Any:
            timeline.mark("range connect start")
            try:
                return await connect(self, *args, **kwargs)
            finally:
                timeline.mark("range connect end")

        http_range.RangeClient.get = timed_get  # type: ignore[method-assign]
        http_range._parse_head = timed_parse
        http_range.RangeClient._connect = timed_range_connect  # type: ignore[method-assign]

    def mark(self, what: str) -> None:
        self.marks.setdefault(what, time.perf_counter())

    def since(self, t0: float) -> dict[str, float]:
        return {what: t - t0 for what, t in self.marks.items()}


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        sum(range(1000))


def work_first_record(job: dict[str, Any]) -> dict[str, Any]:
    """One case of :data:`CASES` (``job["case"]``) in this fresh process."""
    options = storage_options("s3", job["endpoint"])
    timeline = Timeline()
    if job["case"] == "bare":
        t0 = time.perf_counter()
        asyncio.run(_bare(job["url"], options, timeline))
        first = time.perf_counter() - t0
        return {"first": first, "again": None, "marks": timeline.since(t0)}
    import streamrec

    tree = os.environ.get("STREAMREC_BENCH_TREE")
    if tree and not streamrec.__file__.startswith(tree):
        raise RuntimeError(f"streamrec came from {streamrec.__file__}, not {tree}")
    t_open = time.perf_counter()
    ds = streamrec.open_dataset(job["url"], storage_options=options)
    if job["case"] == "glob, start-up gap":
        _busy(job["gap"])
    t_iter = time.perf_counter()
    records = iter(ds)
    next(records)
    t_first = time.perf_counter()
    records.close()  # type: ignore[attr-defined]
    t0 = t_iter if job["case"] == "glob, start-up gap" else t_open
    marks = timeline.since(t0)
    marks["first record"] = t_first - t0
    t = time.perf_counter()
    records = iter(ds)
    next(records)
    again = time.perf_counter() - t
    records.close()  # type: ignore[attr-defined]
    return {"first": t_first - t0, "again": again, "marks": marks}


async def _bare(url: str, options: dict[str, Any], timeline: Timeline) -> None:
    import s3fs

    fs = s3fs.S3FileSystem(asynchronous=True, skip_instance_cache=True, **options)
    await fs.set_session()
    client = fs._s3
    try:
        bucket, pattern = url.split("://", 1)[1].split("/", 1)
        prefix = pattern.split("*", 1)[0]
        listed = await client.list_objects_v2(Bucket=bucket, Prefix=prefix, Delimiter="/")
        keys = sorted(c["Key"] for c in listed.get("Contents", []))
        key = next(k for k in keys if fnmatch.fnmatchcase(k, pattern))
        last = FIRST_BLOCK - 1
        response = await client.get_object(Bucket=bucket, Key=key, Range=f"bytes=0-{last}")
        async with response["Body"] as body:
            data = await body.read()
        if len(data) != FIRST_BLOCK:
            raise RuntimeError(f"bare GET: {len(data)} bytes")
    finally:
        await client.__aexit__(None, None, None)


def work_upload_many(job: dict[str, Any]) -> dict[str, Any]:
    """Put :data:`MANY` objects of one 100 KiB record under ``many-2500/`` (16 at a time)."""
    from streamrec.format.framing import RecordEncoder

    body = RecordEncoder().encode_many([os.urandom(100 << 10)])

    async def upload() -> None:
        import s3fs

        options = storage_options("s3", job["endpoint"])
        fs = s3fs.S3FileSystem(asynchronous=True, skip_instance_cache=True, **options)
        await fs.set_session()
        client = fs._s3
        limit = asyncio.Semaphore(16)

        async def put(i: int) -> None:
            async with limit:
                key = f"{MANY_PREFIX}/shard-{i:05d}.tfrecord"
                await client.put_object(Bucket=job["bucket"], Key=key, Body=body)

        try:
            await asyncio.gather(*(put(i) for i in range(MANY)))
        finally:
            await client.__aexit__(None, None, None)

    t0 = time.perf_counter()
    asyncio.run(upload())
    return {"seconds": time.perf_counter() - t0}


FIRST_WORKERS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "first-record": work_first_record,
    "upload-many": work_upload_many,
}


def measure_first_record(
    script: str,
    store: Store,
    loopback_endpoint: str,
    glob: str,
    samples: int,
    trees: dict[str, str | None],
    gap: float,
) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """``samples`` fresh processes per (tree, case) (bare: once per sample), order rotated per
    sample: ``{(tree, case): [result, ...]}``; ``trees``: label -> tree path (None: this
    one)."""
    one = glob.replace("shard-*", "shard-00000")
    bucket = glob.split("://", 1)[1].split("/", 1)[0]
    many = f"s3://{bucket}/{MANY_PREFIX}/shard-*.tfrecord"
    loopback = {"kind": "upload-many", "endpoint": loopback_endpoint, "bucket": bucket}
    uploaded = run_script(script, "--worker", json.dumps(loopback), 600, "upload-many")
    print(f"  uploaded {MANY} objects in {uploaded['seconds']:.1f} s", flush=True)
    urls = {"one object": one, f"glob, {MANY:,} objects": many}
    jobs: list[tuple[str, str, str | None]] = [
        (label, case, path) for label, path in trees.items() for case in CASES if case != "bare"
    ]
    jobs.append(("-", "bare", None))
    results: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for sample in range(samples):
        for label, case, path in rotated(jobs, sample):
            job = {
                "kind": "first-record",
                "case": case,
                "endpoint": store.endpoint,
                "url": urls.get(case, glob),
                "gap": gap,
            }
            prefix = ["env", f"STREAMREC_BENCH_TREE={path}"] if path else []
            result = run_script(script, "--worker", json.dumps(job), 60, case, prefix)
            results.setdefault((label, case), []).append(result)
        print(f"  sample {sample + 1}/{samples}: load {os.getloadavg()[0]:.2f}", flush=True)
    return results


def _ms(seconds: float | None) -> str:
    return "" if seconds is None else f"{seconds * 1000:.0f}"


def render_first(
    results: dict[tuple[str, str], list[dict[str, Any]]],
    *,
    command: str,
    trees: dict[str, str | None],
    gap: float,
    loads: Sequence[float],
    source: str,
    handshake: bool,
) -> str:
    """The README section: medians per (tree, case), RTTs, the breakdown of the marks."""
    samples = min(len(runs) for runs in results.values())
    lines = [
        f"Command: `{command}` ({now()}, {samples} fresh processes per row, medians; load "
        f"average {min(loads):.2f}-{max(loads):.2f} during the run; new: {source}"
        + "".join(f"; {label}: `{path}`" for label, path in trees.items() if path)
        + ").",
        "",
        f"Link: 60 ms round trips, 25 MB/s per connection"
        f"{', a round trip per new connection (--handshake)' if handshake else ''}. "
        f"`start-up gap`: {gap:g} s of busy Python between `open_dataset` and the first "
        "`next()`, timed from the `next()`. Target: <= 3 RTTs.",
        "",
        "| tree | case | first record ms | RTTs | again ms | met? |",
        "|---|---|--:|--:|--:|---|",
    ]
    for (label, case), runs in results.items():
        first = statistics.median(r["first"] for r in runs)
        agains = [r["again"] for r in runs if r["again"] is not None]
        again = statistics.median(agains) if agains else None
        met = "yes" if first <= 3 * RTT else "no"
        lines.append(
            f"| {label} | {case} | {_ms(first)} | {first / RTT:.1f} | {_ms(again)} | "
            f"{met if case != 'bare' else ''} |"
        )
    lines += [
        "",
        "Where the time goes (median ms from the start of the timing to each first occurrence):",
        "",
        "| tree | case | " + " | ".join(MARKS) + " | first record |",
        "|---|---|" + "--:|" * (len(MARKS) + 1),
    ]
    for (label, case), runs in results.items():
        cells = []
        for mark in (*MARKS, "first record"):
            values = [r["marks"][mark] for r in runs if mark in r["marks"]]
            cells.append(_ms(statistics.median(values)) if values else "")
        if case == "bare":
            cells[-1] = _ms(statistics.median(r["first"] for r in runs))
        lines.append(f"| {label} | {case} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_first(path: Path, section: str) -> None:
    """Replace the first-record section of ``path`` (appended if missing)."""
    intro = "### First record (bench_remote.py --first-only)\n\n"
    replace_section(path, START_MARK, END_MARK, section, intro)
