"""Review of the Owned/owning change (c693977): cases it does not close cleanly."""

from __future__ import annotations

import asyncio
import gc
import sys
from contextlib import aclosing
from pathlib import Path
from typing import Any

import pytest

import streamrec
from integration.test_async_shutdown import run_patterns as run_shutdown
from integration.test_async_shutdown import tracked_while
from integration.test_async_shutdown import write_shards as write_indexed
from support.servers import MotoS3Server

REPO = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import asyncio, gc, json, sys
import streamrec

urls, options, patterns = json.loads(sys.argv[1])
opts = {"storage_options": options} if options else {}
sys.unraisablehook = lambda u: print(
    "UNRAISABLE", u.exc_type.__name__, u.exc_value, u.object, file=sys.stderr
)


def dataset(**kw):
    return streamrec.open_dataset(urls, block_bytes=16 << 10, **opts, **kw)


async def body(pattern):
    if pattern.startswith("sleep"):  # break, drop the iterator, a few more steps, return
        it = dataset().__aiter__()
        async for _ in it:
            break
        del it
        for _ in range(int(pattern[5:])):
            await asyncio.sleep(0)
        return 1
    if pattern == "cancel-outside":  # the consumer is cancelled in its loop body
        async def consume():
            async for _ in dataset():
                await asyncio.sleep(0.001)
        task = asyncio.ensure_future(consume())
        await asyncio.sleep(0.3)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return 1
    if pattern == "wait-for":
        async def consume():
            async for _ in dataset():
                await asyncio.sleep(0.001)
        try:
            await asyncio.wait_for(consume(), 0.3)
        except asyncio.TimeoutError:
            return 1
    if pattern == "indexed":
        n = 0
        async for _ in dataset(shuffle="global", prefetch_bytes=64 << 10):
            n += 1
            if n == 700:
                return 1
    if pattern == "kept":  # the iterator outlives main: shutdown_asyncgens closes it
        global KEPT
        KEPT = dataset().__aiter__()
        await anext(KEPT)
        return 1


for pattern in patterns:
    print("==", pattern, file=sys.stderr, flush=True)
    print(pattern, asyncio.run(body(pattern)), flush=True)
    gc.collect()
"""


def run_patterns(urls: list[str], options: dict[str, Any] | None, patterns: list[str]) -> None:
    run_review = {pattern: 1 for pattern in patterns}
    run_shutdown(urls, options, patterns, script=SCRIPT, expected=run_review)


def write_shards(urls: list[str], options: dict[str, Any] | None = None) -> None:
    write_indexed(urls, options, index=True)


def test_s3_close_begun_before_shutdown(s3_server: MotoS3Server, s3_bucket: str) -> None:
    """The loop's close of the iterator began (GeneratorExit) just before asyncio.run's
    shutdown cancelled every task, owning's close task among them before its first step:
    its aclose() then took CancelledError and GeneratorExit half-way, _sequential was left
    open and collected ("async generator ignored GeneratorExit")."""
    options = s3_server.storage_options
    urls = [f"s3://{s3_bucket}/shard-{i}.tfrecord" for i in range(3)]
    write_shards(urls, options)
    run_patterns(
        urls, options, ["sleep1", "cancel-outside", "sleep0", "sleep3", "wait-for", "kept"]
    )


def test_s3_indexed(s3_server: MotoS3Server, s3_bucket: str) -> None:
    options = s3_server.storage_options
    urls = [f"s3://{s3_bucket}/shard-{i}.tfrecord" for i in range(3)]
    write_shards(urls, options)
    run_patterns(urls, options, ["indexed"])


@pytest.mark.parametrize("shuffle", ["global", "block"])
async def test_indexed_break_closes_its_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shuffle: str
) -> None:
    """IndexedEngine.pieces iterated its Owned _read without closing it: left early, _read
    (a fetch task pending, awaited in its finally) was closed by the garbage collector."""
    urls = [str(tmp_path / f"shard-{i}.tfrecord") for i in range(3)]
    write_shards(urls)
    unraisable: list[str] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: unraisable.append(repr(u.exc_value)))
    ds = streamrec.open_dataset(urls, shuffle=shuffle, prefetch_bytes=64 << 10)
    async with aclosing(ds.__aiter__()) as records:
        n = 0
        async for _ in records:
            n += 1
            if n == 700:  # several chunks: the next one is being fetched
                break
    gc.collect()
    assert unraisable == []
    assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []


# --------------------------------------------- a new internal generator left to the loop

# the async generators a user iterates (left to the loop's hooks), and Dataset._pieces,
# which every caller wraps (owning / owned); every other one must be @owned_generator
PUBLIC_GENERATORS = {
    "streamrec/pipeline/dataset.py:Dataset._pieces",
    "streamrec/pipeline/dataset.py:Dataset.record_chunks",
    "streamrec/pipeline/dataset.py:Dataset.__aiter__",
    "streamrec/pipeline/stream/views.py:RecordViews._async_views",
    "streamrec/pipeline/transforms/ledger.py:handed_out_async",
    "streamrec/pipeline/mix/mixed.py:MixedDataset.record_chunks",
    "streamrec/pipeline/transforms/repeat.py:RepeatStage.record_chunks",
    "streamrec/pipeline/transforms/stage.py:Stage.record_chunks",
}


def _async_generators() -> dict[str, list[str]]:
    import ast

    def yields(node: ast.AST) -> bool:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(child, (ast.Yield, ast.YieldFrom)) or yields(child):
                return True
        return False

    found: dict[str, list[str]] = {}
    for path in sorted((REPO / "streamrec").rglob("*.py")):
        tree = ast.parse(path.read_text())
        scopes: list[tuple[ast.AST, str]] = [(tree, "")]
        while scopes:
            scope, prefix = scopes.pop()
            for node in ast.iter_child_nodes(scope):
                if isinstance(node, ast.ClassDef):
                    scopes.append((node, f"{prefix}{node.name}."))
                elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    scopes.append((node, f"{prefix}{node.name}.<locals>."))
                    if isinstance(node, ast.AsyncFunctionDef) and yields(node):
                        name = f"{path.relative_to(REPO)}:{prefix}{node.name}"
                        found[name] = [ast.unparse(d) for d in node.decorator_list]
    return found


def test_every_internal_async_generator_is_owned() -> None:
    """A generator function added inside the pipeline without @owned_generator is tracked
    by the loop again (and closed by asyncio.run's shutdown against its owner); the
    behaviour tests only see the pipeline shapes they build."""
    found = _async_generators()
    assert set(found) >= PUBLIC_GENERATORS
    unowned = [
        n
        for n, decs in found.items()
        if n not in PUBLIC_GENERATORS and "owned_generator" not in decs
    ]
    assert unowned == []


SHAPES: dict[str, Any] = {
    "indexed-global": lambda ds: ds(shuffle="global", prefetch_bytes=64 << 10),
    "indexed-block": lambda ds: ds(shuffle="block", prefetch_bytes=64 << 10),
    "shuffle-buffer": lambda ds: ds(shuffle_buffer=64),
    "interleave": lambda ds: ds(cycle_length=2, block_length=3),
    "strided": lambda ds: ds(num_hosts=2, host_index=1),
    "cache": lambda ds: ds(cache_dir=str(ds.tmp / "cache"), cache_bytes=1 << 30),
    "filter-take-skip": lambda ds: ds().filter(lambda r: True).skip(3).take(1000),
    "unbatch": lambda ds: ds().batch(7).unbatch(),
    "map-workers": lambda ds: ds().map(len, num_workers=2),
    "mix-never": lambda ds: streamrec.mix([ds(), ds(seed=1)], seed=0, stop="never"),
    "repeat-chunks": lambda ds: ds().repeat(2).record_chunks(),
}


@pytest.mark.parametrize("shape", list(SHAPES))
async def test_only_the_outer_generator_is_the_loops_in_every_shape(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shape: str
) -> None:
    urls = [str(tmp_path / f"shard-{i}.tfrecord") for i in range(3)]
    write_shards(urls)
    unraisable: list[str] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: unraisable.append(repr(u.exc_value)))

    def ds(**kw: Any) -> Any:
        return streamrec.open_dataset(urls, block_bytes=16 << 10, **kw)

    ds.tmp = tmp_path  # type: ignore[attr-defined]

    async def consume() -> None:
        items = SHAPES[shape](ds).__aiter__()
        async with aclosing(items):
            n = 0
            async for _ in items:
                n += 1
                if n == 700:
                    break

    seen = await tracked_while(consume)
    gc.collect()
    assert len(seen) == 1, seen
    assert unraisable == []
    assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []


async def test_timeout_around_a_stalled_read(
    s3_server: MotoS3Server, s3_bucket: str, fault_proxy: Any
) -> None:
    """asyncio.timeout around ``async for`` waiting on a stalled server: TimeoutError promptly,
    everything closed (owning waits for the close through the cancellation)."""
    import time

    options = s3_server.storage_options
    urls = [f"s3://{s3_bucket}/shard-{i}.tfrecord" for i in range(3)]
    write_shards(urls, options)
    proxy = fault_proxy(s3_server.endpoint_url)
    proxy.stall(30, method="GET", range_only=True)
    via = {**options, "client_kwargs": {"endpoint_url": proxy.url}}
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.5):
            async for _ in streamrec.open_dataset(urls, storage_options=via):
                pass
    assert time.monotonic() - started < 3
    gc.collect()
    assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []
