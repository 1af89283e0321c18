"""Resume states are untrusted: a mutated state either loads and reads records of the dataset,
or raises StateError naming the field, never another exception, a hang or a huge allocation."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import json
import resource
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import streamrec
from streamrec.errors import StateError
from support.resume import as_version, payload, write_shards

SIZES = [23, 0, 31, 17, 29, 11]
MODES: dict[str, dict[str, Any]] = {
    "sequential": {},
    "interleaved": {"cycle_length": 3, "block_length": 2},
    "first-ready": {"cycle_length": 3, "deterministic": False},
    "shuffle-buffer": {"cycle_length": 2, "shuffle_buffer": 7, "seed": 3},
    "shuffle-buffer-v1": {"cycle_length": 2, "shuffle_buffer": 7, "seed": 3},
}
BAD_VALUES: list[Any] = [None, -1, -(2**62), 2**62, "x", 1.5, True, [], {}, [0, 0, 0], 1]
_PER_LIST = 3  # long lists (the generator state) have their first and last entries mutated


@contextlib.contextmanager
def memory_ceiling(extra: int = 2 << 30) -> Iterator[None]:
    """A huge allocation fails with MemoryError (the test fails) instead of taking the host."""
    with open("/proc/self/statm") as f:
        in_use = int(f.read().split()[0]) * resource.getpagesize()
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    ceiling = in_use + extra
    if hard != resource.RLIM_INFINITY:
        ceiling = min(ceiling, hard)
    resource.setrlimit(resource.RLIMIT_AS, (ceiling, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _pack(raw: bytes) -> str:
    return base64.b64encode(zlib.compress(raw)).decode()


def _packed_mutations(packed: str) -> Iterator[str]:
    """The packed shuffle buffer with every byte of its columns changed (each to 0, 255 and
    flipped in its lowest bit), cut short, lengthened, and not base64, zlib or one stream."""
    raw = zlib.decompress(base64.b64decode(packed))
    for k, byte in enumerate(raw):
        for bad in {0, 255, byte ^ 1} - {byte}:
            yield _pack(raw[:k] + bytes([bad]) + raw[k + 1 :])
    for cut in (raw[:-1], raw[: len(raw) // 2], raw[:8], b"", raw + b"\0", raw + raw):
        yield _pack(cut)
    yield from ("!" + packed[1:], "é" + packed, packed[:-4], _pack(raw) + "AAAA")
    yield base64.b64encode(b"not zlib").decode()
    yield base64.b64encode(zlib.compress(raw) + b"more").decode()
    yield _pack(bytes(1 << 20))  # inflates far beyond any buffer of 7 entries
    yield _pack(raw[:8] + bytes(1 << 16))


def _mutations(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """(path, replacement) pairs; replacement ``...`` deletes the key / entry."""
    if isinstance(value, str) and path == ("shuffle", "buffer"):
        for packed in _packed_mutations(value):
            yield path, packed
    if isinstance(value, dict):
        for key, item in value.items():
            if path == () and key in ("config", "version"):
                yield (*path, key), ...
                continue
            yield (*path, key), ...
            for bad in BAD_VALUES:
                yield (*path, key), bad
            yield from _mutations(item, (*path, key))
    elif isinstance(value, list):
        yield path, [*value, value[-1] if value else 0]  # one entry more
        indexes = range(len(value))
        if len(value) > _PER_LIST:
            indexes = [0, len(value) - 2, len(value) - 1]  # type: ignore[assignment]
        for k in indexes:
            yield (*path, k), ...
            for bad in BAD_VALUES:
                yield (*path, k), bad
            yield from _mutations(value[k], (*path, k))


def _apply(state: dict[str, Any], path: tuple[Any, ...], replacement: Any) -> dict[str, Any]:
    mutated = copy.deepcopy(state)
    if not path:
        return mutated
    target: Any = mutated
    for key in path[:-1]:
        target = target[key]
    if replacement is ...:
        del target[path[-1]]
    else:
        target[path[-1]] = copy.deepcopy(replacement)
    return mutated


async def _consume(ds: streamrec.Dataset, limit: int) -> list[bytes]:
    out: list[bytes] = []
    async for record in ds:
        out.append(record)
        assert len(out) <= limit, "more records than the dataset holds"
    return out


@pytest.mark.parametrize("mode", list(MODES))
async def test_every_mutated_state_loads_and_reads_or_is_a_state_error(
    tmp_path: Path, mode: str
) -> None:
    urls = write_shards(tmp_path, SIZES, compressed=frozenset({3}))
    every = {payload(s, i) for s, size in enumerate(SIZES) for i in range(size)}

    def make() -> streamrec.Dataset:
        return streamrec.open_dataset(urls, **MODES[mode])

    ds = make()
    taken = []
    async for record in ds:
        taken.append(record)
        if len(taken) == 40:
            break
    state = json.loads(json.dumps(ds.state_dict()))
    assert state["read"] is not None  # a position inside the epoch
    if mode.endswith("-v1"):
        state = as_version(state, 1, urls)
    rest = await _consume(_loaded(make, state), len(every))
    assert sorted(taken + rest) == sorted(every)  # the state itself is good

    checked = refused = 0
    with memory_ceiling():
        for path, replacement in _mutations(state):
            mutated = _apply(state, path, replacement)
            where = f"{mode}: {'.'.join(map(str, path))} -> {replacement!r}"
            try:
                fresh = _loaded(make, mutated)
                records = await asyncio.wait_for(_consume(fresh, len(every)), 30)
            except StateError:
                refused += 1
                continue
            except Exception as exc:  # pragma: no cover - the failure being tested for
                raise AssertionError(f"{where}: {type(exc).__name__}: {exc}") from exc
            assert set(records) <= every, where
            checked += 1
    assert refused > 100 and checked > 0


def _loaded(make: Any, state: Any) -> streamrec.Dataset:
    ds: streamrec.Dataset = make()
    ds.load_state_dict(state)
    return ds


def test_a_state_error_names_the_field(tmp_path: Path) -> None:
    urls = write_shards(tmp_path, [5, 5])
    ds = streamrec.open_dataset(urls)
    it = iter(ds)
    next(it)
    state = ds.state_dict()
    it.close()  # type: ignore[attr-defined]
    state["read"]["next"] = -(2**62)
    with pytest.raises(StateError, match=r"read\.next"):
        streamrec.open_dataset(urls).load_state_dict(state)
    state["read"]["next"] = 1
    state["read"]["slots"] = [[0, 1, 3]]  # no record starts at byte 3
    fresh = streamrec.open_dataset(urls)
    fresh.load_state_dict(state)
    with pytest.raises(StateError, match="byte 3 of shard 0"):
        list(fresh)
