"""ds.parse_sequence(context, sequence).to_arrow(n): SequenceExample shards as Arrow batches,
equal to decode_sequence_batch over the same records, on the C parser and on the pure-Python
path (``batch._cexample = None``, as STREAMREC_PURE_PYTHON=1 leaves it)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import streamrec
from streamrec.cli import main
from streamrec.errors import ExampleError, FeatureError
from streamrec.example import (
    FeatureSpec,
    FixedLenFeature,
    RawFeature,
    VarLenFeature,
    decode_sequence_batch,
    encode_sequence,
)
from streamrec.format.example import batch as example_batch
from streamrec.format.example.infer import spec_to_json

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
PATHS = ["c", "python"] if example_batch._cexample is not None else ["python"]


@pytest.fixture(params=PATHS)
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "python":
        monkeypatch.setattr(example_batch, "_cexample", None)
    return str(request.param)


def record(n: int, bad_at: int | None = None) -> bytes:
    """SequenceExample ``n``: ``n % 4`` steps of each list (a wrong-length frame at step 0 for
    ``bad_at``)."""
    context: dict[str, Any] = {"label": n}
    if n % 3:
        context["name"] = b"r%d" % n
    steps = n % 4
    lists: dict[str, Any] = {
        "frames": [[n + 0.5, -float(k)] for k in range(steps)],
        "tokens": [np.arange(k + 1, dtype=np.int64) + n for k in range(steps)],
        "words": [[b"w%d" % k] * (k % 2) for k in range(steps)],
    }
    if n % 2:
        lists["pixels"] = [bytes([n % 256, k]) for k in range(steps)]
    if n == bad_at:
        lists["frames"] = [[1.0]]
    return encode_sequence(context, lists)


def write_shards(
    directory: Path, shards: int, per_shard: int, bad_at: int | None = None
) -> tuple[str, list[bytes]]:
    payloads: list[bytes] = []
    for shard in range(shards):
        with streamrec.sync.open_writer(str(directory / f"part-{shard:02d}.tfrecord")) as writer:
            for i in range(per_shard):
                payloads.append(record(shard * per_shard + i, bad_at))
                writer.write(payloads[-1])
    return str(directory / "part-*.tfrecord"), payloads


def batches_of(
    pattern: str, batch_size: int, drop_remainder: bool = False, block_bytes: int = 512
) -> Any:
    dataset = streamrec.open_dataset(pattern, block_bytes=block_bytes)  # 512: a few records
    return dataset.parse_sequence(context=CONTEXT, sequence=SEQUENCE).to_arrow(
        batch_size, drop_remainder=drop_remainder
    )


def test_batches_equal_decode_sequence_batch(tmp_path: Path, path: str) -> None:
    pattern, payloads = write_shards(tmp_path, shards=3, per_shard=70)
    expected = decode_sequence_batch(payloads, CONTEXT, SEQUENCE)
    batches = batches_of(pattern, 64)
    assert batches.schema == expected.schema
    got = list(batches)
    assert [len(b) for b in got] == [64, 64, 64, 18]
    assert all(b.schema == expected.schema for b in got)
    assert pa.Table.from_batches(got).equals(pa.Table.from_batches([expected]))
    assert pa.Table.from_batches(got).column("tokens").to_pylist()[6] == [[6], [6, 7]]

    async def read_async() -> list[Any]:
        return [b async for b in batches_of(pattern, 50, drop_remainder=True)]

    dropped = asyncio.run(read_async())
    assert [len(b) for b in dropped] == [50] * 4
    assert pa.Table.from_batches(dropped).equals(pa.Table.from_batches([expected.slice(0, 200)]))


def test_resume_on_a_batch_boundary(tmp_path: Path, path: str) -> None:
    pattern, payloads = write_shards(tmp_path, shards=3, per_shard=50)
    batches = batches_of(pattern, 32)
    first = iter(batches)
    taken = [next(first), next(first), next(first)]  # the third spans shards 0 and 1
    state = batches.state_dict()
    first.close()  # type: ignore[attr-defined]
    resumed = batches_of(pattern, 32)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert [len(b) for b in rest] == [32, 22]
    expected = decode_sequence_batch(payloads, CONTEXT, SEQUENCE)
    assert pa.Table.from_batches([*taken, *rest]).equals(pa.Table.from_batches([expected]))


def test_chains_and_queries_as_a_stream(tmp_path: Path) -> None:
    pattern, _ = write_shards(tmp_path, shards=2, per_shard=40)
    assert list(batches_of(pattern, 16).map(lambda b: b.num_rows).take(3)) == [16, 16, 16]
    taken = streamrec.open_dataset(pattern).take(20).parse_sequence(CONTEXT, SEQUENCE)
    assert [b.column("label").to_pylist() for b in taken.to_arrow(8)][2] == [16, 17, 18, 19]
    connection = duckdb.connect()
    connection.register("records", batches_of(pattern, 16).reader())
    query = "SELECT count(*), sum(label), sum(len(tokens)) FROM records WHERE name = '?'"
    got = connection.execute(query).fetchall()[0]
    unnamed = [n for n in range(80) if n % 3 == 0]
    assert got == (len(unnamed), sum(unnamed), sum(n % 4 for n in unnamed))


@pytest.mark.parametrize("block_bytes", [512, 1 << 20])  # 1 MiB: a shard a chunk, decoded whole
def test_a_bad_record_is_named_after_the_good_batches(
    tmp_path: Path, path: str, block_bytes: int
) -> None:
    pattern, _ = write_shards(tmp_path, shards=2, per_shard=30, bad_at=45)
    seen: list[int] = []
    with pytest.raises(FeatureError) as raised:
        for got in batches_of(pattern, 10, block_bytes=block_bytes):
            seen.append(len(got))
    assert seen == [10, 10, 10, 10]  # records 0..39; record 45 is in the fifth batch
    error = raised.value
    assert error.feature == "frames"
    assert error.url is not None and error.url.endswith("part-01.tfrecord")
    assert error.record_index == 15 and error.offset is not None and error.offset > 0
    assert str(error).startswith(f"record 15 in {error.url} at byte offset {error.offset}: ")
    assert "step 0" in str(error) and "of the batch" not in str(error)

    (tmp_path / "junk").mkdir()
    with streamrec.sync.open_writer(str(tmp_path / "junk" / "a.tfrecord")) as writer:
        writer.write(record(0))
        writer.write(b"\xff\xff")
    junk = str(tmp_path / "junk" / "*.tfrecord")
    at = 12 + len(record(0)) + 4  # (header, payload, footer)
    with pytest.raises(ExampleError, match=rf"^record 1 in .*a\.tfrecord at byte offset {at}: "):
        list(batches_of(junk, 4))


def test_specs_are_checked_and_records_need_to_arrow(tmp_path: Path) -> None:
    pattern, _ = write_shards(tmp_path, shards=1, per_shard=3)
    dataset = streamrec.open_dataset(pattern)
    with pytest.raises(ValueError, match="both context and sequence"):
        dataset.parse_sequence({"frames": VarLenFeature(np.float32)}, SEQUENCE)
    with pytest.raises(TypeError, match="no Arrow type"):  # before any read
        dataset.parse_sequence(sequence={"c": RawFeature("c8", (1,))}).to_arrow()
    parsed = dataset.parse_sequence(CONTEXT, SEQUENCE)
    with pytest.raises(TypeError, match=r"to_arrow\(batch_size\)"):
        iter(parsed)
    with pytest.raises(TypeError, match=r"to_arrow\(batch_size\)"):
        parsed.__aiter__()
    no_features = dataset.parse_sequence().to_arrow(2)
    assert [b.num_rows for b in no_features] == [2, 1]  # rows kept, no column
    assert len(no_features.schema) == 0


def test_convert_to_parquet_writes_the_same_columns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pattern, payloads = write_shards(tmp_path, shards=2, per_shard=40)
    context = {"label": CONTEXT["label"]}  # (a JSON spec keeps no default)
    (tmp_path / "context.json").write_text(json.dumps(spec_to_json(context)))
    (tmp_path / "steps.json").write_text(json.dumps(spec_to_json(SEQUENCE)))
    specs = ["--spec", str(tmp_path / "context.json"), "--sequence", str(tmp_path / "steps.json")]
    out = str(tmp_path / "parquet")
    assert main(["convert", pattern, out, "--to", "parquet", *specs, "--row-group-rows", "32"]) == 0
    written = pq.read_table(sorted((tmp_path / "parquet").glob("*.parquet")))
    expected = decode_sequence_batch(payloads, context, SEQUENCE)
    assert written.equals(pa.Table.from_batches([expected]))
    capsys.readouterr()

    bad = tmp_path / "bad"
    bad.mkdir()
    bad_pattern, _ = write_shards(bad, shards=1, per_shard=10, bad_at=7)
    assert main(["convert", bad_pattern, str(bad / "out"), "--to", "parquet", *specs]) == 1
    assert "record 7 in " in capsys.readouterr().err
    both = ["--spec", str(tmp_path / "context.json"), "--sequence", str(tmp_path / "context.json")]
    assert main(["convert", pattern, str(bad / "o2"), "--to", "parquet", *both]) == 1
    assert "named in both" in capsys.readouterr().err
    assert main(["convert", out, str(bad / "x.tfrecord"), "--from", "parquet", *specs[2:]]) == 2
    assert "--sequence is for --to parquet" in capsys.readouterr().err
