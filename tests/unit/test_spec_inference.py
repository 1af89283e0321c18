"""Spec inference (streamrec.format.example.infer): the inferred spec parses the whole sample,
and is fixed-length exactly where every record has the same count."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamrec.example import (
    FixedLenFeature,
    RawFeature,
    VarLenFeature,
    decode,
    decode_batch,
    encode,
)
from streamrec.format.example.infer import (
    SpecInference,
    infer_spec,
    sample_positions,
    shard_quotas,
    spec_entry_source,
    spec_from_json,
    spec_to_json,
)
from streamrec.format.proto import example_pb2

KINDS = ("int64", "float32", "bytes")


def _values(kind: str, count: int, seed: int) -> Any:
    if kind == "int64":
        return np.arange(seed, seed + count, dtype=np.int64)
    if kind == "float32":
        return np.arange(count, dtype=np.float32) + np.float32(seed) / 3
    return [f"v{seed}-{i}".encode() for i in range(count)]


# each feature: a kind; each record: for each feature, None (missing) or a value count
records_strategy = st.integers(min_value=1, max_value=4).flatmap(
    lambda n_features: st.tuples(
        st.lists(st.sampled_from(KINDS), min_size=n_features, max_size=n_features),
        st.lists(
            st.lists(
                st.one_of(st.none(), st.integers(min_value=0, max_value=3)),
                min_size=n_features,
                max_size=n_features,
            ),
            min_size=1,
            max_size=12,
        ),
    )
)


@settings(max_examples=60, deadline=None)
@given(records_strategy)
def test_the_inferred_spec_parses_every_sampled_record(
    drawn: tuple[list[str], list[list[int | None]]],
) -> None:
    kinds, records = drawn
    payloads = []
    for r, counts in enumerate(records):
        features = {
            f"f{i}": _values(kinds[i], count, r)
            for i, count in enumerate(counts)
            if count is not None
        }
        payloads.append(encode(features))
    spec = infer_spec(payloads)
    for i, kind in enumerate(kinds):
        name = f"f{i}"
        seen = [counts[i] for counts in records]
        if all(c is None for c in seen):
            assert name not in spec
            continue
        entry = spec[name]
        constant = None not in seen and len(set(seen)) == 1 and seen[0] != 0
        if constant:
            assert isinstance(entry, FixedLenFeature)
            assert entry.shape == (() if seen[0] == 1 else (seen[0],))
        else:
            assert isinstance(entry, VarLenFeature)
        assert entry.dtype is {"int64": np.int64, "float32": np.float32, "bytes": bytes}[kind]
    # the test the spec is for: the whole sample parses, as numpy and as Arrow
    decode_batch(payloads, spec)
    batch = decode_batch(payloads, spec, to="arrow")
    assert batch.num_columns == len(spec)
    if spec:  # (a batch of no columns has no rows)
        assert batch.num_rows == len(payloads)


def test_a_feature_of_two_kinds_is_left_out_with_the_reason() -> None:
    inference = SpecInference()
    inference.add_all([encode({"a": 1, "b": 1}), encode({"a": b"x", "b": 2})])
    assert list(inference.spec()) == ["b"]
    assert inference.skipped == {"a": "seen with kinds bytes and int64"}


def test_a_kindless_feature_counts_as_zero_values_of_the_others_kind() -> None:
    message = example_pb2.Example()
    message.features.feature["a"].SetInParent()  # tf.train.Feature()
    kindless = message.SerializeToString()
    payloads = [kindless, encode({"a": [1, 2]})]
    spec = infer_spec(payloads)
    assert spec == {"a": VarLenFeature(np.int64)}
    assert decode_batch(payloads, spec, to="arrow").column(0).to_pylist() == [[], [1, 2]]


def test_decoded_dicts_infer_like_payloads() -> None:
    payloads = [encode({"x": [1.5, 2.5], "t": b"a"}), encode({"x": [0.5, 1.0], "t": b"bc"})]
    inference = SpecInference()
    for payload in payloads:
        inference.add(decode(payload))
    assert spec_to_json(inference.spec()) == spec_to_json(infer_spec(payloads))
    assert spec_to_json(inference.spec()) == {
        "t": {"type": "fixed", "dtype": "bytes", "shape": []},
        "x": {"type": "fixed", "dtype": "float32", "shape": [2]},
    }


def test_spec_json_round_trips_and_bad_entries_name_the_feature() -> None:
    spec = {
        "a": FixedLenFeature(np.int64),
        "b": FixedLenFeature(np.float32, (2, 3)),
        "c": VarLenFeature(bytes),
        "d": RawFeature("<f4", (4,)),
    }
    doc = json.loads(json.dumps(spec_to_json(spec)))
    again = spec_from_json(doc)
    assert spec_to_json(again) == doc
    assert [spec_entry_source(e) for e in again.values()] == [
        "FixedLenFeature(np.int64)",
        "FixedLenFeature(np.float32, (2, 3))",
        "VarLenFeature(bytes)",
        "RawFeature(np.dtype('<f4'), (4,))",
    ]
    with pytest.raises(ValueError, match="spec entry 'z': dtype must be"):
        spec_from_json({"z": {"type": "fixed", "dtype": "int32"}})
    with pytest.raises(ValueError, match="type must be fixed, varlen or raw"):
        spec_from_json({"z": {"type": "sparse", "dtype": "int64"}})


@given(st.integers(0, 500), st.integers(0, 600), st.integers(0, 3))
def test_sample_positions_are_distinct_in_range_and_seeded(total: int, n: int, seed: int) -> None:
    positions = sample_positions(total, n, seed)
    assert len(positions) == min(total, n)
    assert positions == sorted(set(positions))
    assert all(0 <= p < total for p in positions)
    assert positions == sample_positions(total, n, seed)


@given(st.integers(1, 300), st.integers(1, 1000))
def test_shard_quotas_spread_over_every_shard_or_evenly(num_shards: int, n: int) -> None:
    quotas = shard_quotas(num_shards, n)
    shards = [s for s, _ in quotas]
    assert shards == sorted(set(shards)) and all(0 <= s < num_shards for s in shards)
    assert sum(k for _, k in quotas) >= n
    if n >= num_shards:
        assert len(quotas) == num_shards
    else:
        assert len(quotas) == n
        # spread: the first and the last stretches of the listing are both sampled
        assert shards[0] < num_shards / n and shards[-1] >= num_shards - num_shards / n
