"""The ``streamrec`` command line: ls, count, verify, head, inspect.

Most tests run the real command in a subprocess (``python -m streamrec.cli``) and check its
stdout, stderr, exit status and ``--json`` document against exact values: local files written
here, the TensorFlow-written corpus, and the S3 / GCS test servers.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest

import streamrec
from streamrec.cli import build_parser, main
from streamrec.example import decode_batch, encode, encode_sequence
from streamrec.format.framing import FOOTER_BYTES, HEADER_BYTES
from support.servers import FakeGcsServer, MotoS3Server

REPO = Path(streamrec.__file__).resolve().parents[1]
SHARD_COUNTS = [4, 0, 6, 2, 3]
SHARD_SIZES = [192, 0, 288, 96, 144]


@dataclass
class Run:
    """A finished ``streamrec`` process."""

    rc: int
    out: str
    err: str

    def json(self) -> Any:
        """stdout as JSON."""
        return json.loads(self.out)


def cli(*args: str) -> Run:
    """Run ``python -m streamrec.cli ARGS`` in a subprocess (stderr is a pipe, not a tty)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, "-m", "streamrec.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    return Run(done.returncode, done.stdout, done.stderr)


def frame_offsets(payloads: list[bytes]) -> list[int]:
    """Header offset of each record in an uncompressed TFRecord file."""
    offsets, at = [], 0
    for payload in payloads:
        offsets.append(at)
        at += HEADER_BYTES + len(payload) + FOOTER_BYTES
    return offsets


def write_records(path: Path, payloads: list[bytes], compression: str | None = None) -> Path:
    """One TFRecord file, written by streamrec."""
    with streamrec.sync.open_writer(str(path), compression=compression) as writer:
        for payload in payloads:
            writer.write(payload)
    return path


def corrupt_payload(data: bytearray, offset: int, at: int = 3) -> None:
    """Flip one bit of byte ``at`` of the payload of the record whose header is at ``offset``."""
    data[offset + HEADER_BYTES + at] ^= 0x20


def sharded(corpus_dir: Path) -> list[str]:
    return sorted(str(p) for p in (corpus_dir / "sharded").glob("*.tfrecord"))


# ------------------------------------------------------------------------- parser, help


def test_version_and_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert streamrec.__version__ in capsys.readouterr().out
    assert main([]) == 0
    out = capsys.readouterr().out
    for command in ("ls", "count", "verify", "head", "inspect", "index"):
        assert f"    {command} " in out


@pytest.mark.parametrize("command", ["ls", "count", "verify", "head", "inspect", "index"])
def test_every_command_help_shows_options_output_and_examples(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main([command, "--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    for part in ("--json", "--storage-options", "examples:", f"streamrec {command} ", "exit"):
        assert part in text, part
    assert ("--compression" in text) == (command != "ls")


def test_console_module_runs_and_usage_errors_exit_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    done = cli("--help")
    assert done.rc == 0
    assert "verify" in done.out
    done = cli("head", "-n", "-1", "x")
    assert (done.rc, done.out) == (2, "")
    assert done.err.startswith("usage: streamrec head")
    assert done.err.endswith("error: argument -n/--records: must be >= 0, not -1\n")
    for args, message in [
        (["ls", "x", "--storage-options", "{bad"], "argument --storage-options: not valid JSON"),
        (["ls", "x", "--storage-options", "[1]"], "must be a JSON object, not list"),
        (["count", "--compression", "lz4", "x"], "argument --compression: invalid choice"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        (["verify"], "the following arguments are required: URL"),
    ]:
        with pytest.raises(SystemExit) as info:
            main(args)
        assert info.value.code == 2, args
        captured = capsys.readouterr()
        assert captured.out == ""
        assert captured.err.startswith("usage: streamrec"), args
        assert message in captured.err, args


def test_every_command_is_registered() -> None:
    # one dispatch for all: a broken subcommand module fails loudly at import, never hides
    help_text = build_parser().format_help()
    for name in ("ls", "count", "verify", "head", "inspect", "index", "reshard", "cleanup"):
        assert f"    {name} " in help_text, name


# ---------------------------------------------------------------------------------- ls


def test_ls_lists_sizes_and_detected_compression(corpus_dir: Path, tmp_path: Path) -> None:
    # no suffix: the codec is sniffed from the first bytes
    (tmp_path / "a").write_bytes((corpus_dir / "gzip" / "features.tfrecord.gz").read_bytes())
    (tmp_path / "b").write_bytes((corpus_dir / "zlib" / "features.tfrecord.zlib").read_bytes())
    (tmp_path / "c").write_bytes((corpus_dir / "plain" / "features.tfrecord").read_bytes())
    done = cli("ls", str(corpus_dir / "sharded" / "*.tfrecord"), str(tmp_path))
    assert done.rc == 0, done.err
    assert done.err == ""
    expected = [
        f"{size:>15,}  none   {url}"
        for size, url in zip(SHARD_SIZES, sharded(corpus_dir), strict=True)
    ] + [
        f"          3,095  gzip   {tmp_path}/a",
        f"          3,083  zlib   {tmp_path}/b",
        f"          3,130  none   {tmp_path}/c",
        "         10,028  total  (8 shards, 9.8 KiB)",
    ]
    assert done.out.splitlines() == expected

    document = cli("ls", "--json", str(tmp_path / "?"), str(corpus_dir / "zlib/empty*")).json()
    assert document == {
        "shards": [
            {"url": f"{tmp_path}/a", "size": 3095, "compression": "gzip", "version": None},
            {"url": f"{tmp_path}/b", "size": 3083, "compression": "zlib", "version": None},
            {"url": f"{tmp_path}/c", "size": 3130, "compression": "none", "version": None},
            {
                "url": str(corpus_dir / "zlib" / "empty.tfrecord.zlib"),
                "size": 8,
                "compression": "zlib",
                "version": None,
            },
        ],
        "num_shards": 4,
        "total_bytes": 9316,
    }


def test_missing_objects_are_one_line_errors_with_status_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    done = cli("count", str(tmp_path / "nope.tfrecord"))
    assert (done.rc, done.out) == (1, "")
    assert done.err == f"streamrec: error: {tmp_path}/nope.tfrecord: no such object (stat)\n"
    (tmp_path / ".keep").write_text("")  # a directory holding no shard
    for args, message in [
        (["ls", str(tmp_path / "*.tfrecord")], f"{tmp_path}/*.tfrecord: the glob matched no file"),
        (["inspect", str(tmp_path)], f"{tmp_path}: the directory holds no shard files"),
        (["verify", str(tmp_path / "x"), "--json"], f"{tmp_path}/x: no such object"),
    ]:
        assert main(args) == 1, args
        captured = capsys.readouterr()
        assert captured.out == ""
        assert captured.err.startswith(f"streamrec: error: {message}"), (args, captured.err)
        assert captured.err.count("\n") == 1


# ------------------------------------------------------------------------------- count


def test_count_prints_per_file_and_total(
    corpus_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["count", str(corpus_dir / "sharded" / "*.tfrecord")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in out] == ["4", "0", "6", "2", "3", "15"]


def test_count_reports_damage_with_exit_status_1(
    corpus_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = corpus_dir / "corrupt" / "flipped_payload_bit_rec2.tfrecord"
    assert main(["count", str(path)]) == 1
    assert "at byte offset 507: payload CRC mismatch" in capsys.readouterr().err
    assert main(["count", "--skip-corrupt", str(path)]) == 0
    assert "1 corrupt skipped" in capsys.readouterr().out


def test_count_json_over_every_codec(corpus_dir: Path, manifest: dict[str, Any]) -> None:
    names = ["plain/tiny_20k.tfrecord", "gzip/concatenated_members.tfrecord.gz"]
    names += ["zlib/images.tfrecord.zlib", "gzip/empty.tfrecord.gz"]
    done = cli("count", "--json", "--jobs", "2", *(str(corpus_dir / n) for n in names))
    assert done.rc == 0, done.err
    document = done.json()
    assert document["shards"] == [
        {
            "url": str(corpus_dir / name),
            "size": manifest["files"][name]["file_size"],
            "compression": manifest["files"][name]["compression"].lower(),
            "records": manifest["files"][name]["num_records"],
            "corrupt_skipped": 0,
            "error": None,
        }
        for name in names
    ]
    assert document["total_records"] == 20000 + 58 + 50 + 0
    assert document["complete"] is True


def test_count_json_names_the_damage_and_forced_compression(
    corpus_dir: Path, tmp_path: Path
) -> None:
    bad = corpus_dir / "corrupt" / "truncated_in_payload_rec3.tfrecord"
    done = cli("count", "--json", str(bad), str(corpus_dir / "sharded" / "data-00000-*"))
    assert done.rc == 1
    document = done.json()
    assert [s["records"] for s in document["shards"]] == [3, 4]
    assert document["shards"][0]["error"] == (
        f"record 3 in {bad} at byte offset 852: stream ends inside a payload (130 of 390 bytes)"
    )
    assert document["complete"] is False
    assert done.err == f"streamrec: error: {document['shards'][0]['error']}\n"

    gz = tmp_path / "data.bin"
    gz.write_bytes((corpus_dir / "gzip" / "images.tfrecord.gz").read_bytes())
    assert cli("count", "--compression", "gzip", str(gz)).out.split()[0] == "50"
    done = cli("count", "--compression", "none", str(gz))
    assert done.rc == 1
    assert f"record 0 in {gz} at byte offset 0: not a TFRecord file (looks like gzip" in done.err


# ------------------------------------------------------------------------------ verify


def test_verify_clean_shards(corpus_dir: Path) -> None:
    done = cli("verify", str(corpus_dir / "sharded"))
    assert done.rc == 0, done.err
    lines = done.out.splitlines()
    assert lines[:-1] == [
        f"OK     {n:>10,} records  {url}"
        for n, url in zip(SHARD_COUNTS, sharded(corpus_dir), strict=True)
    ]
    assert lines[-1] == "all CRCs OK: 15 records in 5 shards"
    assert done.err == ""


def test_verify_lists_every_bad_record_and_keeps_going(tmp_path: Path) -> None:
    payloads = [encode({"i": i, "blob": bytes([i]) * (20 + i)}) for i in range(8)]
    offsets = frame_offsets(payloads)
    path = write_records(tmp_path / "bad.tfrecord", payloads)
    data = bytearray(path.read_bytes())
    corrupt_payload(data, offsets[1])
    corrupt_payload(data, offsets[4])
    path.write_bytes(bytes(data[: offsets[6] + 5]))  # and cut inside record 6's header
    good = write_records(tmp_path / "good.tfrecord", payloads[:3])

    done = cli("verify", str(good), str(path))
    assert done.rc == 1
    lines = done.out.splitlines()
    assert lines[0] == f"OK     {3:>10,} records  {good}"
    assert lines[1] == f"BAD    {4:>10,} good records, 3 problems  {path}"
    assert lines[2].startswith(f"         record 1 in {path} at byte offset {offsets[1]}: payload")
    assert lines[3].startswith(f"         record 4 in {path} at byte offset {offsets[4]}: payload")
    assert lines[4] == (
        f"         record 6 in {path} at byte offset {offsets[6]}: stream ends inside a record "
        "header (5 of 12 bytes); the rest of the shard cannot be read"
    )
    assert lines[5] == "DAMAGED: 3 problems in 1 of 2 shards; 7 good records"
    assert len(lines) == 6

    document = cli("verify", "--json", str(good), str(path)).json()
    problems = [
        (p["url"], p["record_index"], p["offset"], p["type"], p["rest_unreadable"])
        for p in document["problems"]
    ]
    assert problems == [
        (str(path), 1, offsets[1], "CorruptRecordError", False),
        (str(path), 4, offsets[4], "CorruptRecordError", False),
        (str(path), 6, offsets[6], "TruncatedRecordError", True),
    ]
    assert document["problems"][0]["problem"].startswith("payload CRC mismatch (stored 0x")
    assert document["ok"] is False
    assert document["good_records"] == 7  # 3 + records 0, 2, 3 and 5
    assert document["bad_shards"] == 1
    assert [s["good_records"] for s in document["shards"]] == [3, 4]
    assert [s["problems"] for s in document["shards"]] == [0, 3]


def test_verify_matches_tensorflows_damage_report(
    corpus_dir: Path, manifest: dict[str, Any]
) -> None:
    corrupt = {n: e for n, e in manifest["corrupt"].items() if "first_bad_record" in e}
    done = cli("verify", "--json", *(str(corpus_dir / name) for name in corrupt))
    assert done.rc == 1
    document = done.json()
    found = {p["url"]: (p["record_index"], p["offset"]) for p in document["problems"]}
    assert found == {
        str(corpus_dir / name): (e["first_bad_record"]["index"], e["first_bad_record"]["offset"])
        for name, e in corrupt.items()
    }
    assert len(document["problems"]) == len(corrupt)
    # a bad payload CRC loses one record; anything else loses the rest of the file
    assert {s["url"]: s["good_records"] for s in document["shards"]} == {
        str(corpus_dir / name): (
            4
            if e["first_bad_record"]["problem"] == "bad_data_crc"
            else e["valid_records_before_damage"]
        )
        for name, e in corrupt.items()
    }


# -------------------------------------------------------------------------------- head


def test_head_prints_length_sha256_and_preview(corpus_dir: Path, manifest: dict[str, Any]) -> None:
    done = cli("head", "-n", "6", str(corpus_dir / "sharded" / "*.tfrecord"))
    assert done.rc == 0, done.err
    urls = sharded(corpus_dir)
    records = manifest["files"]["sharded/data-00000-of-00005.tfrecord"]["records"]
    lines = done.out.splitlines()
    assert lines[0] == f"==> {urls[0]} <=="
    assert lines[1].split() == ["index", "offset", "length", "sha256[:16]", "preview"]
    first = lines[2].split()
    assert first[:4] == ["0", "0", "32", records[0]["sha256"][:16]]
    assert first[4] == (corpus_dir / "sharded" / Path(urls[0]).name).read_bytes()[12:28].hex()
    assert [line.split()[1] for line in lines[2:6]] == [str(r["offset"]) for r in records]
    assert lines[6] == ""
    assert lines[7] == f"==> {urls[2]} <=="  # the empty shard has nothing to show
    assert len(lines) == 11  # 4 + 2 records, 2 group headers, 2 column headers, 1 blank

    document = cli("head", "--json", "-n", "6", *urls).json()
    assert [(r["url"], r["index"]) for r in document["records"]] == [
        (urls[0], 0),
        (urls[0], 1),
        (urls[0], 2),
        (urls[0], 3),
        (urls[2], 0),
        (urls[2], 1),
    ]
    assert document["records"][3]["sha256"] == records[3]["sha256"]
    assert document["error"] is None


@pytest.mark.parametrize(
    "name",
    [
        "plain/features.tfrecord",
        "gzip/features.tfrecord.gz",
        "sequence/sequence_examples.tfrecord",
        "plain/images.tfrecord",
    ],
)
def test_head_decode_json_matches_the_corpus_manifest(
    corpus_dir: Path, manifest: dict[str, Any], name: str
) -> None:
    entry = manifest["files"][name]
    records = manifest["files"][entry.get("records_same_as", name)]["records"][:10]
    args = ["head", "--decode", "--json", "--max-inline-bytes", "1024", "-n", "10"]
    done = cli(*args, str(corpus_dir / name))
    assert done.rc == 0, done.err
    got = done.json()["records"]
    payloads = list(streamrec.open_dataset(str(corpus_dir / name)))[:10]
    for record, payload in zip(got, payloads, strict=True):
        assert record.pop("url") == str(corpus_dir / name)
        assert record.pop("kind") == entry["payload_kind"]
        assert record.pop("head_hex") == payload[:16].hex()
    assert got == records


def test_head_decode_text_shows_long_bytes_as_length_and_sha256(corpus_dir: Path) -> None:
    done = cli("head", "--decode", "-n", "2", str(corpus_dir / "plain" / "features.tfrecord"))
    assert done.rc == 0, done.err
    text = done.out
    assert text.startswith(f"==> {corpus_dir / 'plain' / 'features.tfrecord'} <==\n")
    assert "record 0 at byte offset 0: 107 bytes, sha256 387ec9fa" in text
    assert '"tags": {"bytes_list": ["c3Vu", "", "AP8=", "R3LDvMOfZSDimIAg6Zuo"]}' in text
    # 2,500 bytes > --max-inline-bytes 64
    assert '"length": 2500' in text
    assert "a9ca96a28898f872e5a38beae657defb071ec6bad42598321653ee0a7d11dd7c" in text
    assert "record 2" not in text


def test_head_stops_at_damage_after_printing_the_good_records(corpus_dir: Path) -> None:
    path = corpus_dir / "corrupt" / "flipped_payload_bit_rec2.tfrecord"
    done = cli("head", "--json", str(path))
    assert done.rc == 1
    document = done.json()
    assert [r["index"] for r in document["records"]] == [0, 1]
    message = f"record 2 in {path} at byte offset 507: payload CRC mismatch"
    assert document["error"].startswith(message)
    assert done.err.startswith(f"streamrec: error: {message}")
    assert "Traceback" not in done.err

    raw = corpus_dir / "plain" / "raw_lengths.tfrecord"
    done = cli("head", "--decode", "--kind", "example", str(raw))
    assert done.rc == 1
    assert done.err == (
        f"streamrec: error: record 1 in {raw} at byte offset 16: payload is not a valid "
        "serialized Example\n"
    )


# ----------------------------------------------------------------------------- inspect


def test_inspect_suggests_a_spec_that_decodes_the_data(corpus_dir: Path) -> None:
    path = corpus_dir / "zlib" / "images.tfrecord.zlib"
    done = cli("inspect", "--json", str(path))
    assert done.rc == 0, done.err
    report = done.json()
    assert report["spec"] == {
        "bbox": "FixedLenFeature(np.float32, (4,))",
        "image_raw": "RawFeature(np.uint8, (3072,))",
        "label": "FixedLenFeature(np.int64)",
    }
    assert report["records"] == 50
    assert report["kinds"] == {"example": 50, "sequence_example": 0, "raw": 0}
    image = report["features"][1]
    assert image["name"] == "image_raw"
    assert image["kind"] == "bytes"
    assert (image["records"], image["of_records"]) == (50, 50)
    assert image["values"] == {"min": 1, "max": 1, "mean": 1.0}
    assert image["value_bytes"] == {"min": 3072, "max": 3072, "mean": 3072.0}

    namespace: dict[str, Any] = {}
    exec(
        cli("inspect", str(path)).out.split("suggested spec (from 50 sampled records):\n")[1],
        namespace,
    )
    batch = decode_batch(list(streamrec.open_dataset(str(path))), namespace["spec"])
    assert np.shape(batch["image_raw"]) == (50, 3072)
    assert np.shape(batch["bbox"]) == (50, 4)
    assert np.shape(batch["label"]) == (50,)


def test_inspect_varying_missing_and_text_features(tmp_path: Path) -> None:
    payloads = [
        encode(
            {
                "id": i,
                "name": f"item-{i}",
                "tokens": list(range(i % 3 + 1)),
                "score": [0.5, 1.5, 2.5],
                **({"extra": b"\x00\xff"} if i % 2 else {}),
            }
        )
        for i in range(10)
    ]
    path = write_records(tmp_path / "mixed.tfrecord.gz", payloads, compression="gzip")
    done = cli("inspect", "-n", "6", str(path))
    assert done.rc == 0, done.err
    lines = done.out.splitlines()
    assert lines[0] == "sampled 6 records from 1 shard: 6 example"
    assert lines[4:11] == [
        "  name    kind   present  values/record  bytes/value  suggested spec",
        "  extra   bytes  3/6      1              2            VarLenFeature(bytes)",
        "  id      int64  6/6      1              -            FixedLenFeature(np.int64)",
        "  name    bytes  6/6      1              6            FixedLenFeature(bytes)",
        "  score   float  6/6      3              -            FixedLenFeature(np.float32, (3,))",
        "  tokens  int64  6/6      1..3 (mean 2)  -            VarLenFeature(np.int64)",
        "  note: extra: missing in 3 of 6 records",
    ]


def test_inspect_sequence_examples(tmp_path: Path, corpus_dir: Path) -> None:
    payloads = [
        encode_sequence({"clip": b"c"}, {"frames": [[1, 2], [3]], "words": [[b"a"], [], [b"b"]]})
        for _ in range(3)
    ]
    path = write_records(tmp_path / "seq.tfrecord", payloads)
    report = cli("inspect", "--json", str(path)).json()
    assert report["kinds"] == {"example": 0, "sequence_example": 3, "raw": 0}
    summary = {
        (f["section"], f["name"]): (f["kind"], f["steps"], f["values"], f["spec"])
        for f in report["features"]
    }
    assert summary == {
        ("context", "clip"): (
            "bytes",
            None,
            {"min": 1, "max": 1, "mean": 1.0},
            "FixedLenFeature(bytes)",
        ),
        ("feature_lists", "frames"): (
            "int64",
            {"min": 2, "max": 2, "mean": 2.0},
            {"min": 1, "max": 2, "mean": 1.5},
            None,
        ),
        ("feature_lists", "words"): (
            "bytes",
            {"min": 3, "max": 3, "mean": 3.0},
            {"min": 0, "max": 1, "mean": 0.667},
            None,
        ),
    }
    # the 0-byte record after a SequenceExample counts as one too
    corpus = cli("inspect", "--json", str(corpus_dir / "sequence" / "sequence_examples.tfrecord"))
    assert corpus.json()["kinds"] == {"example": 0, "sequence_example": 3, "raw": 0}


# ------------------------------------------------------------------ memory, S3 and GCS


@pytest.fixture
def memory_root() -> Iterator[str]:
    root = f"memory://streamrec-cli/{uuid.uuid4().hex}"
    yield root
    fsspec.filesystem("memory").rm(root.replace("memory://", "/"), recursive=True)


def test_memory_urls_in_process(memory_root: str, capsys: pytest.CaptureFixture[str]) -> None:
    with streamrec.sync.open_writer(f"{memory_root}/part-{{index}}.tfrecord", max_records=3) as w:
        for i in range(7):
            w.write(encode({"i": i}))
    assert main(["count", f"{memory_root}/part-*.tfrecord"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in out] == ["3", "3", "1", "7"]


def upload(put: Any, bucket: str, corpus_dir: Path) -> None:
    for path in (corpus_dir / "sharded").glob("*.tfrecord"):
        put(bucket, f"data/{path.name}", path.read_bytes())
    for name in ("corrupt/flipped_payload_bit_rec2.tfrecord", "gzip/images.tfrecord.gz"):
        put(bucket, name, (corpus_dir / name).read_bytes())


def check_remote(
    scheme: str, bucket: str, options: dict[str, Any], manifest: dict[str, Any], *, s3: bool
) -> None:
    """ls, count and verify against one object store; then head (S3) or inspect (GCS)."""
    storage = ["--storage-options", json.dumps(options)]
    data = f"{scheme}://{bucket}/data/*.tfrecord"
    urls = [f"{scheme}://{bucket}/data/data-0000{k}-of-00005.tfrecord" for k in range(5)]

    listing = cli("ls", "--json", data, f"{scheme}://{bucket}/gzip/*", *storage)
    assert listing.rc == 0, listing.err
    shards = listing.json()["shards"]
    assert [(s["url"], s["size"], s["compression"]) for s in shards] == [
        *((u, size, "none") for u, size in zip(urls, SHARD_SIZES, strict=True)),
        (f"{scheme}://{bucket}/gzip/images.tfrecord.gz", 87891, "gzip"),
    ]
    assert all(s["version"] for s in shards)  # ETag / generation

    count = cli("count", data, f"{scheme}://{bucket}/gzip/images.tfrecord.gz", *storage)
    assert count.rc == 0, count.err
    first_column = [line.split()[0] for line in count.out.splitlines()]
    assert first_column == ["4", "0", "6", "2", "3", "50", "65"]

    bad = f"{scheme}://{bucket}/corrupt/flipped_payload_bit_rec2.tfrecord"
    verify = cli("verify", "--json", bad, urls[0], *storage)
    assert verify.rc == 1
    problems = verify.json()["problems"]
    assert [(p["url"], p["record_index"], p["offset"]) for p in problems] == [(bad, 2, 507)]

    if s3:
        check_head_and_missing(scheme, bucket, storage, urls, manifest)
    else:
        check_inspect(data, storage)


def check_head_and_missing(
    scheme: str, bucket: str, storage: list[str], urls: list[str], manifest: dict[str, Any]
) -> None:
    data = f"{scheme}://{bucket}/data/*.tfrecord"
    head = cli("head", "--json", "--decode", "-n", "5", data, *storage)
    assert head.rc == 0, head.err
    got = [(r["url"], r["index"], r["example"]) for r in head.json()["records"]]
    records = manifest["files"]["sharded/data-00000-of-00005.tfrecord"]["records"]
    assert got[:4] == [(urls[0], i, r["example"]) for i, r in enumerate(records)]
    assert got[4][:2] == (urls[2], 0)

    missing = cli("count", f"{scheme}://{bucket}/nope/*.tfrecord", *storage)
    assert (missing.rc, missing.out) == (1, "")
    assert missing.err.startswith(f"streamrec: error: {scheme}://{bucket}/nope/*.tfrecord: ")
    assert missing.err.count("\n") == 1


def check_inspect(data: str, storage: list[str]) -> None:
    inspect = cli("inspect", data, *storage, "--json")
    assert inspect.rc == 0, inspect.err
    report = inspect.json()
    assert report["spec"] == {
        "idx": "FixedLenFeature(np.int64)",
        "shard": "FixedLenFeature(np.int64)",
    }
    assert report["records"] == 15
    assert report["shards_sampled"] == 5  # the empty shard was read too


def test_s3(
    s3_server: MotoS3Server, s3_bucket: str, corpus_dir: Path, manifest: dict[str, Any]
) -> None:
    upload(s3_server.put, s3_bucket, corpus_dir)
    check_remote("s3", s3_bucket, s3_server.storage_options, manifest, s3=True)


def test_gcs(
    gcs_server: FakeGcsServer, gcs_bucket: str, corpus_dir: Path, manifest: dict[str, Any]
) -> None:
    upload(gcs_server.put, gcs_bucket, corpus_dir)
    check_remote("gs", gcs_bucket, gcs_server.storage_options, manifest, s3=False)


def test_decoded_values_round_trip(tmp_path: Path) -> None:
    """--decode shows what was written: ints exactly, floats as float32, bytes as base64."""
    long, longer = b"x" * 64, b"y" * 65  # --max-inline-bytes defaults to 64
    payload = encode(
        {
            "b": [b"\x00hi", long, longer],
            "f": np.array([0.1, -0.0], np.float32),
            "i": [-(2**63)],
        }
    )
    path = write_records(tmp_path / "one.tfrecord", [payload])
    record = cli("head", "--decode", "--json", str(path)).json()["records"][0]
    assert record["sha256"] == hashlib.sha256(payload).hexdigest()
    assert record["example"]["features"] == {
        "b": {
            "bytes_list": [
                "AGhp",
                base64.b64encode(long).decode(),
                {"length": 65, "sha256": hashlib.sha256(longer).hexdigest()},
            ]
        },
        "f": {
            "float_list": ["0.10000000149011612", "-0.0"],
            "float_list_hex": ["3dcccccd", "80000000"],
        },
        "i": {"int64_list": [-(2**63)]},
    }
