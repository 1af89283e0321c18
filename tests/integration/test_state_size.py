"""A resume state stays small for any dataset: a list of thousands of shard urls gives a state
of a few hundred bytes in every mode (it listed every url: 840 KB at 20,000), and it still
resumes with exactly the records that would have come next, refuses other urls in words, and
loads and merges with the states earlier versions wrote."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import streamrec
from streamrec.errors import StateError
from support.resume import as_version, payload, write_shards

MANY = 5000  # shard urls (2 records each): the state must not grow from 10 to MANY
SOME = 400  # urls read whole (already named by a digest: their list is ~25 KB)
KIB = 1024

MODES: dict[str, dict[str, Any]] = {
    "sequential": {},
    "interleaved": {"cycle_length": 4, "block_length": 2},
    "first-ready": {"cycle_length": 4, "deterministic": False},
    "shuffle-buffer": {"cycle_length": 2, "shuffle_buffer": 4, "seed": 3},
    "shuffle-shards": {"shuffle_shards": True, "seed": 5},
    "global": {"shuffle": "global", "seed": 1},
    "block": {"shuffle": "block", "seed": 2, "window_records": 64},
    "even": {"even": "pad", "num_hosts": 3, "host_index": 1},
}
UNORDERED = {"first-ready"}  # records as reads complete: the same records, not one order


@pytest.fixture(scope="module")
def urls(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """MANY tiny shards, each with its sidecar (indexed reading needs their counts)."""
    root = tmp_path_factory.mktemp("many")
    paths = write_shards(root, [2] * MANY)
    for shard, path in enumerate(paths):
        lengths = [len(payload(shard, i)) + 16 for i in range(2)]
        Path(path + ".idx").write_text(f"0 {lengths[0]}\n{lengths[0]} {lengths[1]}\n")
    return paths


Make = Callable[[], Any]


def _maker(mode: str, urls: list[str]) -> Make:
    if mode == "mix":
        half = len(urls) // 2
        return lambda: streamrec.mix(
            [
                streamrec.open_dataset(urls[:half]),
                streamrec.open_dataset(urls[half:], **MODES["shuffle-buffer"]),
            ],
            [0.6, 0.4],
            seed=4,
            stop="all",
        )
    return lambda: streamrec.open_dataset(urls, **MODES[mode])


def _read(ds: Any, stop: int | None = None) -> list[bytes]:
    out: list[bytes] = []
    it = iter(ds)
    try:
        for record in it:
            out.append(record)
            if stop is not None and len(out) == stop:
                break
    finally:
        it.close()
    return out


def _stopped(make: Make, stop: int) -> tuple[list[bytes], dict[str, Any]]:
    ds = make()
    it = iter(ds)
    taken = [record for _, record in zip(range(stop), it, strict=False)]
    state = json.loads(json.dumps(ds.state_dict()))
    it.close()
    return taken, state


def _size(state: dict[str, Any]) -> int:
    return len(json.dumps(state))


@pytest.mark.parametrize("mode", [*MODES, "mix"])
def test_the_state_of_thousands_of_urls_is_as_small_as_of_ten(urls: list[str], mode: str) -> None:
    _, state = _stopped(_maker(mode, urls), 3)
    # (a mix's state holds each source's state: 1 KiB each)
    assert _size(state) <= KIB * len(state.get("sources", [0])), json.dumps(state)[:2000]
    _, few = _stopped(_maker(mode, urls[:10]), 3)
    assert _size(state) <= _size(few) + 16, (json.dumps(state), json.dumps(few))  # (digits)


@pytest.mark.parametrize("mode", [*MODES, "mix"])
def test_a_state_over_urls_named_by_digest_resumes_exactly(urls: list[str], mode: str) -> None:
    some = urls[:SOME]
    make = _maker(mode, some)
    stop = 301 if mode == "first-ready" else 37  # first-ready: 150 shards finished
    taken, state = _stopped(make, stop)
    for source in state.get("sources", [state]):
        assert source["config"]["urls"]["count"] in (SOME, SOME // 2)
    ds = make()
    ds.load_state_dict(state)
    rest = _read(ds)
    everything = _read(make())
    if mode in UNORDERED:
        assert Counter(taken) + Counter(rest) == Counter(everything)
    else:
        assert taken + rest == everything
    assert len(everything) == (2 * SOME + 2) // 3 if mode == "even" else 2 * SOME


def test_finished_shards_are_ranges(urls: list[str]) -> None:
    _, state = _stopped(_maker("first-ready", urls[:SOME]), 2 * SOME - 41)
    done = state["read"]["done"]
    assert sum(b - a for a, b in done) >= SOME - 30 and len(done) <= 8, done


def test_a_state_of_other_urls_is_refused_in_words(urls: list[str]) -> None:
    _, state = _stopped(lambda: streamrec.open_dataset(urls[:-1]), 5)
    assert state["config"]["urls"]["count"] == MANY - 1
    assert state["config"]["urls"]["first"] == urls[0]
    for others in (urls[1:], urls[-2::-1]):  # other urls; the same, in another order
        with pytest.raises(StateError) as refused:
            streamrec.open_dataset(others).load_state_dict(state)
        message = str(refused.value)
        assert f"the state was saved over {MANY - 1} other urls (the first {urls[0]!r}" in message
        assert f"the dataset reads {MANY - 1} urls (the first {others[0]!r}" in message
        assert len(message) < 600
    short = streamrec.open_dataset(urls[:1])
    with pytest.raises(StateError, match=rf"the dataset reads 1 url \[{urls[0]!r}\]"):
        short.load_state_dict(state)


def test_a_few_urls_stay_listed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    names = [Path(p).name for p in write_shards(tmp_path, [3, 3])]
    monkeypatch.chdir(tmp_path)
    _, state = _stopped(lambda: streamrec.open_dataset(names, seed=3), 2)
    assert state["config"] == {"urls": names, "seed": 3}  # the settings at defaults left out


@pytest.mark.parametrize("mode", ["sequential", "first-ready", "shuffle-buffer"])
def test_a_state_of_version_2_over_hundreds_of_urls_still_resumes(
    urls: list[str], mode: str
) -> None:
    some = urls[:SOME]
    make = _maker(mode, some)
    taken, state = _stopped(make, 401)
    old = as_version(state, 2, some)  # every url and finished shard listed, the generator full
    assert _size(old) > 20 * KIB
    ds = make()
    ds.load_state_dict(old)
    rest = _read(ds)
    if mode in UNORDERED:
        assert Counter(taken) + Counter(rest) == Counter(_read(make()))
    else:
        assert taken + rest == _read(make())
    again = make()
    again.load_state_dict(old)
    assert _size(again.state_dict()) <= 8 * KIB  # described anew in version 3 (a full generator)


def test_states_of_version_2_and_3_merge(urls: list[str]) -> None:
    urls = urls[:SOME]
    spec = {"shuffle": "global", "seed": 7}
    parts, heads = [], []
    for host, stop in ((0, 90), (1, 130)):
        taken, state = _stopped(
            lambda h=host: streamrec.open_dataset(urls, num_hosts=2, host_index=h, **spec), stop
        )
        parts.append(state)
        heads += taken
    mixed = [as_version(parts[0], 2, urls), parts[1]]
    merged = streamrec.merge_states(mixed)
    assert merged == streamrec.merge_states(parts) and _size(merged) <= KIB
    rest: list[bytes] = []
    for host in range(3):  # continued by another number of consumers
        ds = streamrec.open_dataset(urls, num_hosts=3, host_index=host, **spec)
        ds.load_state_dict(merged)
        rest += _read(ds)
    every = [payload(s, i) for s in range(SOME) for i in range(2)]
    assert Counter(heads) + Counter(rest) == Counter(every)
