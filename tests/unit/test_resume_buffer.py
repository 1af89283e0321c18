"""The shuffle buffer on resume: a compact state, and its records fetched back with few bytes."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import streamrec
from streamrec.errors import StateError
from streamrec.format.framing import RecordEncoder
from support.resume import (
    as_version,
    payload,
    resume_rest,
    stop_after,
    with_full_rng,
    write_shards,
)

GAP = 256 << 10  # records further apart are fetched by separate reads (opener._GAP_BYTES)


def buffer_locations(state: dict[str, Any]) -> list[list[int]]:
    buffer = state["shuffle"]["buffer"]
    if isinstance(buffer, list):
        return buffer
    from streamrec.pipeline.position.buffer_codec import decode_buffer

    return decode_buffer(buffer, "shuffle.buffer")


def test_refetch_reads_only_the_neighbourhoods_of_buffered_records(tmp_path: Path) -> None:
    # ~100 KiB records, one shard read in order: the buffer's records are a few records apart,
    # some more than GAP (those gaps must not be read), some less (read in the same range)
    rng = random.Random(3)
    records = [payload(0, i) + bytes(rng.randint(60 << 10, 140 << 10)) for i in range(300)]
    path = tmp_path / "big.tfrecord"
    path.write_bytes(b"".join(RecordEncoder().encode(r) for r in records))
    config = {"shuffle_buffer": 24, "seed": 2}
    flat = list(streamrec.open_dataset(str(path), **config))
    first = streamrec.open_dataset(str(path), **config)
    taken = [r for _, r in zip(range(150), first, strict=False)]
    state = json.loads(json.dumps(first.state_dict()))
    places = sorted(buffer_locations(state), key=lambda loc: loc[2])
    gaps = [b[2] - (a[2] + a[3] + 16) for a, b in itertools.pairwise(places)]
    assert any(GAP < gap <= 1 << 20 for gap in gaps) and any(0 < gap <= GAP for gap in gaps)
    spans = places[-1][2] + places[-1][3] + 16 - places[0][2] - sum(g for g in gaps if g > GAP)
    again = streamrec.open_dataset(str(path), **config)
    again.load_state_dict(state)
    assert taken + list(again) == flat
    unread = path.stat().st_size - state["read"]["slots"][0][2]
    assert again.stats.bytes_read == unread + spans


def test_shuffle_buffer_state_is_compact(tmp_path: Path) -> None:
    files = write_shards(tmp_path, [3000] * 4)

    def make() -> streamrec.Dataset:
        return streamrec.open_dataset(files, cycle_length=4, shuffle_buffer=2000, seed=1)

    flat = list(make())
    taken, state = stop_after(make(), 1, 5000)
    assert len(buffer_locations(state)) == 2000
    # one entry per record as [ordinal, index, offset, length] took ~25 bytes per record
    assert len(json.dumps(state["shuffle"]["buffer"])) < 2000 * 6
    assert taken + resume_rest(make, state, 1) == flat


def test_states_of_version_1_still_resume(tmp_path: Path) -> None:
    files = write_shards(tmp_path, [40, 25, 31])

    def make() -> streamrec.Dataset:
        return streamrec.open_dataset(files, cycle_length=2, shuffle_buffer=9, seed=7)

    flat = list(make())
    taken, state = stop_after(make(), 1, 30)
    old = as_version(state, 1)
    assert isinstance(old["shuffle"]["buffer"], list)
    loaded = make()
    loaded.load_state_dict(old)
    # described anew, as version 3 (the generator in full: its words drawn are not known)
    assert loaded.state_dict() == with_full_rng(state)
    assert taken + resume_rest(make, old, 1) == flat
    with pytest.raises(StateError, match=r"shuffle\.buffer"):  # version 2 packs its buffer
        make().load_state_dict({**old, "version": 2})


locations = st.lists(
    st.tuples(
        st.integers(0, 2**63 - 1),
        st.integers(0, 2**63 - 1),
        st.integers(0, 2**63 - 1),
        st.integers(0, 2**63 - 1),
    ).map(list)
    | st.tuples(
        st.integers(0, 3), st.integers(0, 50), st.integers(0, 5000), st.integers(0, 99)
    ).map(list),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(buffer=locations)
def test_packed_buffer_round_trips(buffer: list[list[int]]) -> None:
    from streamrec.pipeline.position.buffer_codec import decode_buffer, encode_buffer

    packed = encode_buffer(buffer)
    assert packed == encode_buffer([list(loc) for loc in buffer])  # deterministic
    assert decode_buffer(json.loads(json.dumps(packed)), "f", most=len(buffer)) == buffer
    if buffer:
        with pytest.raises(StateError, match="more than the buffer"):
            decode_buffer(packed, "f", most=len(buffer) - 1)
