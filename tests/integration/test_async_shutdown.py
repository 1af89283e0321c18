"""Returning from inside ``async for`` under ``asyncio.run`` closes everything, quietly.

A user who returns (or breaks and drops the iterator) inside ``async for`` leaves the public
generator open; ``asyncio.run`` then cancels the close task the loop made for it and closes
every async generator it tracks at once. Before ``_portal.Owned``/``owning`` that tore the
pipeline's nested generators apart: "async generator ignored GeneratorExit", "aclose(): asynchronous
generator is already running", "Event loop is closed", aiohttp's "Unclosed client session". The
subprocess runs what users write, one ``asyncio.run`` per pattern, and its stderr must hold
nothing but the pattern markers. In process: only the generator the user iterates is left to
the loop's hooks; every one inside it is closed by its owner.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from contextlib import aclosing
from pathlib import Path
from typing import Any

import pytest

import streamrec
from support.servers import FakeGcsServer, MotoS3Server

REPO = Path(__file__).resolve().parents[2]
RECORDS_PER_SHARD = 500

SCRIPT = r"""
import asyncio, json, sys
import streamrec

urls, options, patterns = json.loads(sys.argv[1])
opts = {"storage_options": options} if options else {}


def dataset(**kw):
    return streamrec.open_dataset(urls, block_bytes=16 << 10, **opts, **kw)


async def first_items(pattern):
    n = 0
    if pattern == "records":
        async for _ in dataset():
            n += 1
            if n == 10:
                return n
    if pattern == "first-ready":
        async for _ in dataset(cycle_length=3, deterministic=False):
            n += 1
            if n == 10:
                return n
    if pattern == "chunks":
        async for chunk in dataset().record_chunks():
            return len(chunk) > 0
    if pattern == "transforms":
        async for batch in dataset().map(len).batch(4):
            return len(batch)
    if pattern == "repeat":
        async for _ in dataset().repeat(2):
            n += 1
            if n == 10:
                return n
    if pattern == "mix":
        mixed = streamrec.mix([dataset(), dataset(seed=1, shuffle_shards=True)], seed=0)
        async for _ in mixed:
            n += 1
            if n == 10:
                return n
    if pattern == "raise":  # an exception out of the loop body, out of asyncio.run
        async for _ in dataset():
            raise LookupError("raised")
    if pattern == "break":
        records = dataset().__aiter__()
        async for _ in records:
            break
        del records  # the loop's finalizer closes it
        return 1


for pattern in patterns:
    print("==", pattern, file=sys.stderr, flush=True)
    try:
        print(pattern, asyncio.run(first_items(pattern)), flush=True)
    except LookupError as error:
        print(pattern, error, flush=True)
"""

EXPECTED = {
    "records": 10,
    "first-ready": 10,
    "chunks": True,
    "transforms": 4,
    "repeat": 10,
    "mix": 10,
    "raise": "raised",
    "break": 1,
}
EVERY_PATTERN = list(EXPECTED)
REMOTE_PATTERNS = ["records", "first-ready", "transforms", "raise", "break"]


def write_shards(
    urls: list[str], options: dict[str, Any] | None = None, *, index: bool = False
) -> None:
    for shard, url in enumerate(urls):
        with streamrec.sync.open_writer(url, storage_options=options, index=index) as w:
            w.write_many(b"r%06d" % (shard * RECORDS_PER_SHARD + i) * 40 for i in range(500))


def run_patterns(
    urls: list[str],
    options: dict[str, Any] | None,
    patterns: list[str],
    *,
    script: str = SCRIPT,
    expected: dict[str, Any] = EXPECTED,
) -> None:
    """Run ``script`` with each of ``patterns``: its stderr holds the markers only, and each
    pattern printed what ``expected`` says."""
    proc = subprocess.run(
        [sys.executable, "-c", script, json.dumps([urls, options, patterns])],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    markers = "".join(f"== {pattern}\n" for pattern in patterns)
    assert proc.stderr == markers, proc.stderr
    got = dict(line.split(" ", 1) for line in proc.stdout.splitlines())
    assert got == {pattern: str(expected[pattern]) for pattern in patterns}


def test_local(tmp_path: Path) -> None:
    urls = [str(tmp_path / f"shard-{i}.tfrecord") for i in range(3)]
    write_shards(urls)
    run_patterns(urls, None, EVERY_PATTERN)


@pytest.mark.parametrize("path", ["direct", "client"])
def test_s3(s3_server: MotoS3Server, s3_bucket: str, path: str) -> None:
    options = s3_server.storage_options if path == "direct" else s3_server.client_storage_options
    urls = [f"s3://{s3_bucket}/shard-{i}.tfrecord" for i in range(3)]
    write_shards(urls, options)
    run_patterns(urls, options, REMOTE_PATTERNS)


def test_gcs(gcs_server: FakeGcsServer, gcs_bucket: str) -> None:
    urls = [f"gs://{gcs_bucket}/shard-{i}.tfrecord" for i in range(3)]
    write_shards(urls, gcs_server.storage_options)
    run_patterns(urls, gcs_server.storage_options, REMOTE_PATTERNS)


# ------------------------------------------------------------------ the loop's hooks


async def tracked_while(consume: Any) -> list[str]:
    """The streamrec async generators the running loop's hooks saw while ``consume()`` ran."""
    hooks = sys.get_asyncgen_hooks()
    seen: list[str] = []

    def firstiter(agen: Any) -> None:
        if agen.ag_code.co_filename.startswith(str(REPO / "streamrec")):
            seen.append(agen.__qualname__)
        if hooks.firstiter is not None:
            hooks.firstiter(agen)

    sys.set_asyncgen_hooks(firstiter=firstiter, finalizer=hooks.finalizer)
    try:
        await consume()
    finally:
        sys.set_asyncgen_hooks(firstiter=hooks.firstiter, finalizer=hooks.finalizer)
    return seen


@pytest.mark.parametrize(
    ("pattern", "outer"),
    [
        ("records", ["Dataset.__aiter__"]),
        ("first-ready", ["Dataset.__aiter__"]),
        ("chunks", ["Dataset.record_chunks"]),
        ("transforms", ["handed_out_async"]),
        ("repeat", ["handed_out_async"]),
        ("mix", ["handed_out_async"]),
    ],
)
async def test_only_the_iterated_generator_is_the_loops(
    tmp_path: Path, pattern: str, outer: list[str]
) -> None:
    urls = [str(tmp_path / f"shard-{i}.tfrecord") for i in range(3)]
    write_shards(urls)

    def dataset(**kw: Any) -> streamrec.Dataset:
        return streamrec.open_dataset(urls, block_bytes=16 << 10, **kw)

    iterables: dict[str, Any] = {
        "records": lambda: dataset(),
        "first-ready": lambda: dataset(cycle_length=3, deterministic=False),
        "chunks": lambda: dataset().record_chunks(),
        "transforms": lambda: dataset().map(len).batch(4),
        "repeat": lambda: dataset().repeat(2),
        "mix": lambda: streamrec.mix([dataset(), dataset(seed=1)], seed=0),
    }

    async def consume() -> None:
        items = iterables[pattern]().__aiter__()
        async with aclosing(items):
            n = 0
            async for _ in items:
                n += 1
                if n == 700:  # past the first shard: the second shard's readers made too
                    break

    assert await tracked_while(consume) == outer
    assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []
