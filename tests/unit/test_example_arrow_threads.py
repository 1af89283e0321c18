"""decode_batch(..., to="arrow") on threads: the C parser's Arrow buffers byte for byte those of
one thread (any split of the records), the same errors naming the same record, and the default
number of threads (one in a PyTorch DataLoader worker)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch.utils.data
from hypothesis import given
from hypothesis import strategies as st

import streamrec
from streamrec.errors import ExampleError
from streamrec.format import example as ex
from streamrec.format.example import arrow as example_arrow
from streamrec.format.example import batch as example_batch
from streamrec.format.payload import RecordSpans
from unit.test_example_arrow import LABELLED, VAR_SPEC, var_records, write_labelled
from unit.test_example_batch import (
    CEXAMPLE,
    IMAGE_SPEC,
    PROPERTY,
    SPEC,
    damaged,
    read_payloads,
    wire_example,
)

needs_c = pytest.mark.skipif(CEXAMPLE is None, reason="the C accelerator is not built")

FEATURES_SPEC: dict[str, ex.FeatureSpec] = {
    "readings": ex.VarLenFeature(np.float32),
    "offsets": ex.VarLenFeature(np.int64),
    "tags": ex.VarLenFeature(bytes),
    "unset_kind": ex.VarLenFeature(np.float32),
}


def c_output(
    payloads: Sequence[Any], spec: Mapping[str, ex.FeatureSpec], threads: int
) -> list[bytes] | None:
    """The C parser's Arrow-mode output on ``threads`` threads as bytes: every fixed output
    array and every Arrow buffer, in order; None when it hands the batch back."""
    items = example_batch.check_spec(spec)
    parsed = example_batch._parse_c(payloads, items, example_arrow.allocate, threads)
    if parsed is None:
        return None
    outs, buffers = parsed
    found = [b"" if out is None else out.tobytes() for out in outs]
    for entry in buffers:
        found.extend(bytes(buffer) for buffer in entry) if isinstance(entry, tuple) else None
    return found


def outcome(payloads: Sequence[Any], spec: Mapping[str, ex.FeatureSpec], threads: int) -> Any:
    """decode_batch(to="arrow") on ``threads``: ("ok", batch) or ("error", type, words, index)."""
    try:
        return ("ok", ex.decode_batch(payloads, spec, to="arrow", num_threads=threads))
    except ExampleError as error:
        return ("error", type(error), str(error), error.batch_index)


def buffers_of(batch: Any) -> list[bytes | None]:
    """Every buffer of every column, as bytes (NaNs compare bit for bit, unlike ``equals``)."""
    return [
        None if buffer is None else buffer.to_pybytes()
        for column in batch.columns
        for buffer in column.buffers()
    ]


def assert_same(a: Any, b: Any) -> None:
    assert a[0] == b[0]
    if a[0] == "ok":
        assert a[1].schema == b[1].schema
        assert buffers_of(a[1]) == buffers_of(b[1])
    else:
        assert a[1:] == b[1:]


@needs_c
@pytest.mark.parametrize(
    ("corpus", "spec"),
    [("plain/images.tfrecord", IMAGE_SPEC), ("plain/features.tfrecord", FEATURES_SPEC)],
)
def test_the_corpus_on_threads_is_byte_identical(corpus: str, spec: dict[str, Any]) -> None:
    payloads = read_payloads(corpus)
    one = c_output(payloads, spec, 1)
    assert one is not None and any(one)
    for threads in (2, 3, 4, 7, 64):
        assert c_output(payloads, spec, threads) == one, threads


@needs_c
@pytest.mark.parametrize("form", ["bytes", "memoryview", "spans"])
def test_var_records_on_threads_in_every_form(form: str) -> None:
    records = var_records(500)
    payloads: Any = records
    if form == "memoryview":
        payloads = [memoryview(bytearray(record)) for record in records]
    elif form == "spans":  # records in place in one buffer
        offsets = np.cumsum([0] + [len(record) for record in records])
        triples = [(0, int(start), len(r)) for start, r in zip(offsets, records, strict=False)]
        payloads = RecordSpans([b"".join(records)], np.array(triples, dtype=np.int64))
    one = c_output(payloads, VAR_SPEC, 1)
    assert one is not None
    for threads in (2, 5, 16):
        assert c_output(payloads, VAR_SPEC, threads) == one
    batch = ex.decode_batch(payloads, VAR_SPEC, to="arrow", num_threads=3)
    batch.validate(full=True)
    assert batch.equals(ex.decode_batch(records, VAR_SPEC, to="arrow", num_threads=1))


@needs_c
def test_a_damaged_record_anywhere_is_named_as_on_one_thread() -> None:
    records = var_records(40)
    for at in (0, 1, 9, 10, 19, 20, 21, 38, 39):
        payloads = list(records)
        payloads[at] = records[at][:-1]  # cut short: a damaged length
        assert c_output(payloads, VAR_SPEC, 4) is None  # handed back to the Python path
        one = outcome(payloads, VAR_SPEC, 1)
        assert one[0] == "error" and one[3] == at
        for threads in (2, 4, 20):
            assert outcome(payloads, VAR_SPEC, threads) == one


@pytest.mark.slow  # (seconds: hypothesis's batches, each decoded four times)
@PROPERTY
@given(
    st.lists(wire_example() | damaged(), min_size=2, max_size=12),
    st.integers(2, 6),
)
def test_threads_equal_one_thread_on_any_batch(payloads: list[bytes], threads: int) -> None:
    if CEXAMPLE is not None:
        assert c_output(payloads, SPEC, threads) == c_output(payloads, SPEC, 1)
    assert_same(outcome(payloads, SPEC, threads), outcome(payloads, SPEC, 1))


def test_without_the_c_parser_threads_change_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    records = var_records(20)
    with_c = ex.decode_batch(records, VAR_SPEC, to="arrow", num_threads=2)
    monkeypatch.setattr(example_batch, "_cexample", None)  # the pure-Python path
    assert ex.decode_batch(records, VAR_SPEC, to="arrow", num_threads=2).equals(with_c)


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "2"])
def test_a_bad_thread_count_is_refused(bad: Any) -> None:
    with pytest.raises(ValueError, match="num_threads"):
        ex.decode_batch([ex.encode({"a": 1})], {"a": ex.FixedLenFeature(np.int64)}, num_threads=bad)


def test_the_default_threads() -> None:
    cores = len(os.sched_getaffinity(0))
    assert example_batch._arrow_threads(None, 2047) == (1, 0)  # a small batch: this thread
    threads, min_run_bytes = example_batch._arrow_threads(None, 8192)
    assert 1 <= threads <= cores and min_run_bytes == example_batch._MIN_RUN_BYTES
    assert example_batch._arrow_threads(3, 10) == (3, 0)  # asked for: exactly
    assert example_batch._arrow_threads(1, 8192) == (1, 0)
    default = example_batch._default_threads
    assert default(2, 2, 1.0) == 2  # only this thread busy: both cores
    assert default(2, 2, 1.3) == 2 and default(2, 2, 2.6) == 1  # a neighbour: this one only
    assert default(2, 2, 40.0) == 1 and default(8, 8, 5.0) == 4
    assert default(2, 64, 40.0) == 2  # a container's cores on a busy but big machine
    assert default(4, 4, None) == 4  # no load average (Windows): every core


class Threads(torch.utils.data.Dataset[tuple[int, int]]):
    def __len__(self) -> int:
        return 1

    def __getitem__(self, index: int) -> tuple[int, int]:
        return example_batch._arrow_threads(None, 8192)


@pytest.mark.slow
def test_a_dataloader_worker_decodes_on_its_own_thread() -> None:
    loader = torch.utils.data.DataLoader(Threads(), batch_size=None, num_workers=1)
    assert [tuple(threads) for threads in loader] == [(1, 0)]  # (collated: lists)


def test_to_arrow_takes_the_threads(tmp_path: Path) -> None:
    pattern = write_labelled(tmp_path, shards=1, per_shard=40)
    tables = [
        pa.Table.from_batches(
            list(streamrec.open_dataset(pattern).parse(LABELLED).to_arrow(32, num_threads=threads))
        )
        for threads in (1, 3)
    ]
    assert tables[0].column("n").to_pylist() == list(range(40))
    assert tables[1].equals(tables[0])
    with pytest.raises(ValueError, match="num_threads"):
        streamrec.open_dataset(pattern).parse(LABELLED).to_arrow(32, num_threads=0)
