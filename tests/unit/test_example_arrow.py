"""decode_batch(..., to="arrow") and ds.parse(spec).to_arrow(): the same values as the numpy
batch, on the C parser and the Python path, and a dataset of RecordBatches that resumes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

import streamrec
from streamrec.errors import ExampleError
from streamrec.format import example as ex
from streamrec.format.example import arrow as example_arrow
from streamrec.format.example import batch as example_batch
from streamrec.format.payload import RecordSpans
from unit.test_example_batch import (
    CEXAMPLE,
    IMAGE_SPEC,
    PROPERTY,
    SPEC,
    damaged,
    delimited,
    read_payloads,
    wire_example,
)

PATHS = ["c", "python"] if CEXAMPLE is not None else ["python"]


def on_path(
    use_c: bool, payloads: Sequence[Any], spec: Mapping[str, ex.FeatureSpec], to: str
) -> Any:
    """decode_batch on one path: ("ok", result) or ("error", type, message)."""
    saved = example_batch._cexample
    example_batch._cexample = CEXAMPLE if use_c else None
    try:
        return ("ok", ex.decode_batch(payloads, spec, to=to))
    except (ExampleError, TypeError, ValueError) as error:
        return ("error", type(error), str(error))
    finally:
        example_batch._cexample = saved


def flat_values(column: Any, depth: int) -> Any:
    for _ in range(depth):
        column = column.flatten()
    return column


def assert_matches_numpy(batch: Any, decoded: Mapping[str, Any], spec: Mapping[str, Any]) -> None:
    """Every column holds the numpy batch's values bit for bit, typed as the schema says."""
    assert batch.schema == example_arrow.arrow_schema(spec)
    assert batch.schema.names == list(spec)
    for name, entry in spec.items():
        column, want = batch.column(name), decoded[name]
        assert len(column) == len(want)
        if isinstance(entry, ex.VarLenFeature):
            counts = np.diff(column.offsets.to_numpy())
            assert counts.tolist() == [len(row) for row in want]
            if entry._kind == "bytes":
                assert column.to_pylist() == want
            else:
                values = column.values.to_numpy(zero_copy_only=False)
                joined = np.concatenate([np.empty(0, values.dtype), *want])
                assert values.tobytes() == joined.tobytes()
        elif isinstance(entry, ex.FixedLenFeature) and entry._kind == "bytes":
            values = flat_values(column, len(entry.shape)).to_pylist()
            assert values == want.reshape(-1).tolist()
        else:
            values = flat_values(column, len(entry.shape)).to_numpy(zero_copy_only=False)
            native = want.astype(want.dtype.newbyteorder("="), copy=False)
            assert values.tobytes() == np.ascontiguousarray(native).reshape(-1).tobytes()


@pytest.mark.parametrize("path", PATHS)
def test_corpus_images_as_arrow(path: str) -> None:
    payloads = read_payloads("plain/images.tfrecord")
    decoded = on_path(path == "c", payloads, IMAGE_SPEC, "numpy")[1]
    batch = on_path(path == "c", payloads, IMAGE_SPEC, "arrow")[1]
    assert isinstance(batch, pa.RecordBatch) and batch.num_rows == 50
    assert_matches_numpy(batch, decoded, IMAGE_SPEC)
    image = flat_values(batch.column("image_raw").slice(9, 1), 3).to_numpy()
    assert image.tobytes() == decoded["image_raw"][9].tobytes()  # (32, 32, 3) nested lists
    assert batch.column("absent_b").to_pylist() == [b"d"] * 50  # a default, per record
    assert batch.column("absent_vb").to_pylist() == [[]] * 50


@PROPERTY
@given(st.lists(wire_example(), min_size=0, max_size=4))
def test_arrow_equals_numpy_on_wire_variants(payloads: list[bytes]) -> None:
    for use_c in [path == "c" for path in PATHS]:
        numpy_outcome = on_path(use_c, payloads, SPEC, "numpy")
        arrow_outcome = on_path(use_c, payloads, SPEC, "arrow")
        assert numpy_outcome[0] == arrow_outcome[0]
        if numpy_outcome[0] == "error":
            assert numpy_outcome[1:] == arrow_outcome[1:]  # the same error, the same words
        else:
            assert_matches_numpy(arrow_outcome[1], numpy_outcome[1], SPEC)


@PROPERTY
@given(st.lists(damaged() | st.binary(max_size=40), min_size=1, max_size=3))
def test_damaged_bytes_raise_as_numpy_does(payloads: list[bytes]) -> None:
    for use_c in [path == "c" for path in PATHS]:
        numpy_outcome = on_path(use_c, payloads, SPEC, "numpy")
        arrow_outcome = on_path(use_c, payloads, SPEC, "arrow")
        assert numpy_outcome[0] == arrow_outcome[0]
        if numpy_outcome[0] == "error":
            assert numpy_outcome[1:] == arrow_outcome[1:]


def test_without_the_c_gather_the_values_are_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    payloads = read_payloads("plain/features.tfrecord")
    spec = {"tags": ex.VarLenFeature(bytes), "readings": ex.VarLenFeature(np.float32)}
    with_c = ex.decode_batch(payloads, spec, to="arrow")
    monkeypatch.setattr(example_arrow, "_gather_spans", None)  # an extension built before it
    without = ex.decode_batch(payloads, spec, to="arrow")
    assert without.column("tags").equals(with_c.column("tags"))
    assert_matches_numpy(without, ex.decode_batch(payloads, spec), spec)  # readings has NaNs


def test_the_c_gather_checks_every_span() -> None:
    gather = example_arrow._gather_spans
    if gather is None:
        pytest.skip("the C accelerator is not built")
    payloads = [b"abcdef", b"xyz"]

    def spans(*pairs: tuple[int, int]) -> Any:
        return np.array(pairs, dtype=np.int64)

    rows = np.array([1, 0], dtype=np.int64)
    assert bytes(gather(payloads, rows, spans((1, 2), (0, 3)))) == b"yzabc"
    with pytest.raises(ValueError, match="outside its payload"):
        gather(payloads, rows, spans((1, 3), (0, 3)))
    with pytest.raises(ValueError, match="outside its payload"):
        gather(payloads, rows, spans((-1, 1), (0, 3)))
    with pytest.raises(ValueError, match="row out of range"):
        gather(payloads, np.array([2, 0], dtype=np.int64), spans((0, 1), (0, 1)))
    with pytest.raises(ValueError, match="bad span length"):
        gather(payloads, rows, spans((0, -1), (0, 1)))
    with pytest.raises(ValueError, match="disagree"):
        gather(payloads, rows, spans((0, 1)))
    with pytest.raises(ValueError, match="outside its payload"):  # refused before allocating
        gather(payloads, rows, spans((0, 1), (0, 1 << 62)))


class ArrowSpy:
    """The C parser, counting the batches its Arrow mode decoded itself (did not hand back)."""

    def __init__(self) -> None:
        self.decoded = 0

    def parse_examples_arrow(self, *args: Any) -> Any:
        result = CEXAMPLE.parse_examples_arrow(*args)
        self.decoded += result is not None
        return result


VAR_SPEC: dict[str, ex.FeatureSpec] = {
    "ids": ex.VarLenFeature(np.int64),
    "scores": ex.VarLenFeature(np.float32),
    "tags": ex.VarLenFeature(bytes),
    "text": ex.FixedLenFeature(bytes, (2,), default=[b"none", b""]),
    "label": ex.FixedLenFeature(np.int64),
}


def var_records(n: int) -> list[bytes]:
    """Records with lists of 0-5 values, some features missing, empty and NUL bytes."""
    records = []
    for i in range(n):
        features: dict[str, Any] = {"label": i}
        if i % 3:
            features["ids"] = np.arange(i % 6, dtype=np.int64) * (1 << (i % 60)) - 3
        if i % 4:
            features["scores"] = np.linspace(-1, 1, i % 5, dtype=np.float32)
        features["tags"] = [b"t\x00%d" % k for k in range(i % 4)]
        if i % 5:
            features["text"] = [b"x" * (i % 7), b""]
        records.append(ex.encode(features))
    return records


@pytest.mark.parametrize("form", ["bytes", "memoryview", "spans"])
def test_the_c_parser_writes_arrow_buffers_itself(
    form: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if CEXAMPLE is None:
        pytest.skip("the C accelerator is not built")
    records = var_records(300)
    payloads: Any = records
    if form == "memoryview":
        payloads = [memoryview(bytearray(record)) for record in records]
    elif form == "spans":  # records in place in one buffer
        offsets = np.cumsum([0] + [len(record) for record in records])
        triples = [(0, int(start), len(r)) for start, r in zip(offsets, records, strict=False)]
        payloads = RecordSpans([b"".join(records)], np.array(triples, dtype=np.int64))
    spy = ArrowSpy()
    monkeypatch.setattr(example_batch, "_cexample", spy)
    batch = ex.decode_batch(payloads, VAR_SPEC, to="arrow")
    assert spy.decoded == 1
    batch.validate(full=True)
    python = on_path(False, records, VAR_SPEC, "arrow")[1]
    assert batch.equals(python)
    assert_matches_numpy(batch, on_path(False, records, VAR_SPEC, "numpy")[1], VAR_SPEC)
    assert batch.column("text")[0].as_py() == [b"none", b""]  # the default, from C


def test_a_replaced_entry_is_checked_all_the_same() -> None:
    """The last entry of a key wins, but protobuf refuses the Example for a bad varint in an
    earlier one: so does the C parser's Arrow mode (which does not write the earlier one)."""
    bad_ids = delimited(3, delimited(1, b"\xff" * 10 + b"\x01"))  # an 11-byte varint
    good_ids = delimited(3, delimited(1, b"\x05"))
    entries = [delimited(1, delimited(1, b"ids") + delimited(2, f)) for f in (bad_ids, good_ids)]
    payloads = [ex.encode({"ids": [1]}), delimited(1, b"".join(entries))]
    spec = {"ids": ex.VarLenFeature(np.int64)}
    outcomes = [on_path(path == "c", payloads, spec, "arrow") for path in PATHS]
    assert outcomes[0][0] == "error" and outcomes[0][1] is ExampleError
    assert all(outcome == outcomes[0] for outcome in outcomes)


def test_raw_features_in_any_byte_order_and_unsupported_dtypes() -> None:
    values = np.arange(6, dtype=">i2").reshape(2, 3)
    payloads = [ex.encode({"r": values.tobytes()})]
    batch = ex.decode_batch(payloads, {"r": ex.RawFeature(">i2", (2, 3))}, to="arrow")
    assert batch.column("r").to_pylist() == [values.tolist()]
    assert batch.schema.field("r").type == pa.list_(pa.list_(pa.int16(), 3), 2)
    with pytest.raises(TypeError, match="no Arrow type"):
        ex.decode_batch(payloads, {"r": ex.RawFeature("V12", (1,))}, to="arrow")


def test_fixed_size_bytes_keep_their_nuls_and_an_empty_spec_keeps_the_rows() -> None:
    payloads = [ex.encode({"r": b"ab\x00\x00cd\x00\x00"}), ex.encode({"r": b"\x00" * 8})]
    for use_c in [path == "c" for path in PATHS]:
        got = on_path(use_c, payloads, {"r": ex.RawFeature("S8", ())}, "arrow")[1]
        assert got.schema.field("r").type == pa.binary(8)
        assert got.column("r").to_pylist() == [b"ab\x00\x00cd\x00\x00", b"\x00" * 8]
        assert on_path(use_c, payloads, {}, "arrow")[1].num_rows == 2
    with pytest.raises(TypeError, match="no Arrow type"):
        ex.decode_batch(payloads, {"r": ex.RawFeature("U2", ())}, to="arrow")


def test_a_bad_target_is_refused() -> None:
    with pytest.raises(ValueError, match="to must be"):
        ex.decode_batch([], {}, to="pandas")


# ------------------------------------------------------------------ the dataset of batches


def write_labelled(directory: Path, shards: int, per_shard: int) -> str:
    for shard in range(shards):
        with streamrec.sync.open_writer(str(directory / f"part-{shard:02d}.tfrecord")) as w:
            for i in range(per_shard):
                n = shard * per_shard + i
                w.write(ex.encode({"n": n, "tags": [b"t%d" % k for k in range(n % 3)]}))
    return str(directory / "part-*.tfrecord")


LABELLED: dict[str, ex.FeatureSpec] = {
    "n": ex.FixedLenFeature(np.int64),
    "tags": ex.VarLenFeature(bytes),
}


def test_to_arrow_batches_resume_exactly(tmp_path: Path) -> None:
    pattern = write_labelled(tmp_path, shards=3, per_shard=70)
    batches = streamrec.open_dataset(pattern, block_bytes=512).parse(LABELLED).to_arrow(64)
    whole = pa.Table.from_batches(list(batches), schema=batches.schema)
    assert whole.column("n").to_pylist() == list(range(210))
    assert whole.column("tags").to_pylist()[5] == [b"t0", b"t1"]
    assert [len(b) for b in batches] == [64, 64, 64, 18]

    first = iter(batches)
    taken = [next(first), next(first)]
    state = batches.state_dict()
    first.close()  # type: ignore[attr-defined]
    resumed = streamrec.open_dataset(pattern, block_bytes=512).parse(LABELLED).to_arrow(64)
    resumed.load_state_dict(state)
    rest = list(resumed)
    got = pa.Table.from_batches([*taken, *rest]).column("n").to_pylist()
    assert got == list(range(210))


def test_duckdb_reads_the_stream(tmp_path: Path) -> None:
    pattern = write_labelled(tmp_path, shards=2, per_shard=50)
    connection = duckdb.connect()
    connection.register(
        "records", streamrec.open_dataset(pattern).parse(LABELLED).to_arrow(16).reader()
    )
    got = connection.execute("SELECT count(*), sum(n), sum(len(tags)) FROM records").fetchall()[0]
    assert got == (100, sum(range(100)), sum(n % 3 for n in range(100)))


def test_arrow_batches_need_a_spec(tmp_path: Path) -> None:
    from streamrec.pipeline.transforms.chainable import ArrowDataset

    pattern = write_labelled(tmp_path, shards=1, per_shard=3)
    with pytest.raises(TypeError, match=r"parse\(spec\)"):
        ArrowDataset(streamrec.open_dataset(pattern), 4, to="arrow")
    parsed = streamrec.open_dataset(pattern).parse({"c": ex.RawFeature("c8", (1,))})
    with pytest.raises(TypeError, match="no Arrow type"):  # before any read
        parsed.to_arrow()
