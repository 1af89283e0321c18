"""decode_sequence_batch: SequenceExamples as one Arrow batch, equal to decode_sequence of
every record (context through the C parser, steps through protobuf)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamrec.errors import ExampleError, FeatureError
from streamrec.example import (
    FeatureSpec,
    FixedLenFeature,
    RawFeature,
    VarLenFeature,
    decode_sequence,
    decode_sequence_batch,
    encode_sequence,
)

CONTEXT: dict[str, FeatureSpec] = {
    "label": FixedLenFeature(np.int64),
    "name": FixedLenFeature(bytes, (), default=b"?"),
}
SEQUENCE: dict[str, FeatureSpec] = {
    "frames": FixedLenFeature(np.float32, (2,)),
    "tokens": VarLenFeature(np.int64),
    "words": VarLenFeature(bytes),
    "pixels": RawFeature(np.uint8, (2,)),
}

floats = st.floats(width=32, allow_nan=False)


@st.composite
def sequence_example(draw: st.DrawFn) -> tuple[bytes, dict[str, Any]]:
    context: dict[str, Any] = {"label": draw(st.integers(-(2**63), 2**63 - 1))}
    if draw(st.booleans()):
        context["name"] = draw(st.binary(max_size=5))
    lists: dict[str, Any] = {}
    if draw(st.booleans()):
        lists["frames"] = draw(st.lists(st.lists(floats, min_size=2, max_size=2), max_size=3))
    if draw(st.booleans()):  # (an empty step of ints would be written as an empty bytes list)
        lists["tokens"] = [
            np.array(step, dtype=np.int64)
            for step in draw(st.lists(st.lists(st.integers(-5, 5), max_size=3), max_size=3))
        ]
    if draw(st.booleans()):
        lists["words"] = draw(st.lists(st.lists(st.binary(max_size=3), max_size=3), max_size=3))
    if draw(st.booleans()):
        lists["pixels"] = draw(st.lists(st.binary(min_size=2, max_size=2), max_size=3))
    return encode_sequence(context, lists), lists


def expected_steps(payload: bytes, name: str) -> list[Any]:
    _, lists = decode_sequence(payload)
    out = []
    for step in lists.get(name, []):
        if name == "pixels":
            out.append(list(step[0]))
        elif isinstance(step, list):
            out.append(step)
        else:
            out.append(step.tolist())
    return out


@settings(max_examples=60, deadline=None)
@given(st.lists(sequence_example(), max_size=4))
def test_a_batch_equals_each_record_decoded(records: list[tuple[bytes, dict[str, Any]]]) -> None:
    payloads = [payload for payload, _ in records]
    batch = decode_sequence_batch(payloads, CONTEXT, SEQUENCE)
    assert batch.num_rows == len(payloads)
    assert batch.schema.names == [*CONTEXT, *SEQUENCE]
    for index, payload in enumerate(payloads):
        context, _ = decode_sequence(payload)
        row = batch.slice(index, 1).to_pylist()[0]
        assert row["label"] == int(context["label"][0])
        assert row["name"] == (context["name"][0] if "name" in context else b"?")
        for name in SEQUENCE:
            assert row[name] == expected_steps(payload, name), name


def test_types_errors_and_names() -> None:
    payload = encode_sequence({"label": 1}, {"frames": [[1.0, 2.0]], "tokens": [[3, 4]]})
    batch = decode_sequence_batch([payload], CONTEXT, SEQUENCE)
    assert batch.schema.field("frames").type == pa.large_list(pa.list_(pa.float32(), 2))
    assert batch.schema.field("tokens").type == pa.large_list(pa.large_list(pa.int64()))
    assert batch.column("pixels").to_pylist() == [[]]  # no such feature list: no steps
    bad_step = encode_sequence({"label": 1}, {"frames": [[1.0, 2.0], [3.0]]})
    with pytest.raises(FeatureError, match=r"frames.*record 1 of the batch, step 1"):
        decode_sequence_batch([payload, bad_step], CONTEXT, SEQUENCE)
    with pytest.raises(ExampleError):
        decode_sequence_batch([b"\xff\xff"], {}, SEQUENCE)
    with pytest.raises(ValueError, match="both context and sequence"):
        decode_sequence_batch([payload], {"frames": VarLenFeature(np.float32)}, SEQUENCE)
    assert decode_sequence_batch([payload, payload]).num_rows == 2  # no features: rows kept
