"""The messages of the most common mistakes: a file that is not a TFRecord file (or not gzip),
a damaged gzip trailer, an HTTP 404, an unsupported scheme, an empty file to inspect."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

import streamrec
from integration.test_cli import cli, write_records
from streamrec.cli.common import cli_text
from streamrec.errors import CompressionError, CorruptRecordError, TruncatedRecordError
from streamrec.example import encode
from support.server_fixtures import HttpDir

PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x02"


def first_error(path: Path, **options: object) -> Exception:
    with pytest.raises(streamrec.errors.FormatError) as caught:
        list(streamrec.open_dataset(str(path), **options))  # type: ignore[arg-type]
    return caught.value


@pytest.mark.parametrize(
    ("name", "data", "options", "kind", "says"),
    [
        ("image.png", PNG, {}, CorruptRecordError, "not a TFRecord file (looks like a PNG image)"),
        ("notes.txt", b"just some notes\n" * 3, {}, CorruptRecordError, "(looks like text)"),
        ("hi.txt", b"hi\n", {}, TruncatedRecordError, "not a TFRecord file (looks like text)"),
        ("rows.jsonl", b'{"a": 1, "b": [2]}', {}, CorruptRecordError, "(looks like JSON)"),
        (
            "data.tfrecord.gz",
            None,  # gzip data read with compression=None
            {"compression": None},
            CorruptRecordError,
            "not a TFRecord file (looks like gzip: try compression='auto' or 'gzip')",
        ),
        (
            "data.tfrecord.zz",
            None,
            {"compression": None},
            CorruptRecordError,
            "not a TFRecord file (looks like zlib: try compression='auto' or 'zlib')",
        ),
        (
            "plain.tfrecord.gz",  # plain TFRecords named .gz
            b"plain",
            {},
            CompressionError,
            "gzip: the file is not gzip data (looks like an uncompressed TFRecord file: read it "
            "with compression=None)",
        ),
        (
            "readme.gz",
            b"# A title\n\ntext\n",
            {},
            CompressionError,
            "not gzip data (looks like text)",
        ),
    ],
)
def test_not_a_tfrecord_file_says_what_it_looks_like(
    tmp_path: Path,
    name: str,
    data: bytes | None,
    options: dict[str, object],
    kind: type[Exception],
    says: str,
) -> None:
    path = tmp_path / name
    if data is None:
        compression = "gzip" if name.endswith(".gz") else "zlib"
        write_records(path, [encode({"i": 1})], compression=compression)
    elif data == b"plain":
        write_records(tmp_path / "plain.tfrecord", [encode({"i": 1})])
        path.write_bytes((tmp_path / "plain.tfrecord").read_bytes())
    else:
        path.write_bytes(data)
    error = first_error(path, **options)
    assert type(error) is kind
    assert f"record 0 in {path} at byte offset 0: " in str(error)
    assert says in str(error)
    assert "after 0 compressed" not in str(error)
    run = cli("count", str(path), "--compression", "none" if options else "auto")
    assert run.rc == 1
    # the CLI spells the hints as its options: --compression none, not compression=None
    assert cli_text(says) in run.err and run.err.count("\n") == 1
    assert "compression=" not in run.err


def test_verify_reports_a_bad_gzip_trailer_once_and_where(tmp_path: Path) -> None:
    path = write_records(
        tmp_path / "bad.tfrecord.gz", [encode({"i": i}) for i in range(40)], "gzip"
    )
    data = bytearray(path.read_bytes())
    data[-6] ^= 0xFF  # the CRC32 of the gzip trailer
    path.write_bytes(bytes(data))
    with pytest.raises(gzip.BadGzipFile):
        gzip.decompress(bytes(data))  # really damaged there
    run = cli("verify", str(path))
    assert run.rc == 1
    lines = run.out.splitlines()
    assert lines[0].endswith(f"good records, 1 problem  {path}")
    assert len(lines) == 3  # the shard, its one problem, the summary
    assert "incorrect data check" in lines[1]
    # zlib checks the CRC32 once its last byte (data[-5]) is in, and says so there
    assert f"(at compressed byte {len(data) - 5}, after 1200 uncompressed bytes)" in lines[1]
    assert lines[2].startswith("DAMAGED: 1 problem in 1 of 1 shard")


def test_http_404_keeps_a_short_excerpt_of_the_page(http_dir: HttpDir) -> None:
    run = cli("count", f"{http_dir.url}/missing.tfrecord")
    assert run.rc == 1
    assert run.err.count("\n") == 1, run.err
    assert "<" not in run.err
    assert "failed with HTTP 404: " in run.err
    assert len(run.err) < 300


def test_an_unsupported_scheme_is_a_usage_error() -> None:
    for args in (
        ["count", "ftp://host/x.tfrecord"],
        ["reshard", "in.tfrecord", "ftp://h/o-{index}"],
    ):
        run = cli(*args)
        assert run.rc == 2, args
        assert "unsupported scheme ftp://" in run.err
        assert "Traceback" not in run.err


def test_recursive_globs_in_the_cli(tmp_path: Path) -> None:
    write_records(tmp_path / "nested" / "a.tfrecord", [b"a"])
    (tmp_path / "nested" / "sub").mkdir()
    write_records(tmp_path / "nested" / "sub" / "b.tfrecord", [b"b", b"b"])
    for pattern in ("nested/**", "nested/**/*.tfrecord"):
        run = cli("count", "--json", str(tmp_path / pattern))
        assert run.rc == 0, run.err
        assert [s["records"] for s in run.json()["shards"]] == [1, 2], pattern


def test_inspect_an_empty_file_and_unicode_names(tmp_path: Path) -> None:
    empty = tmp_path / "empty.tfrecord"
    empty.write_bytes(b"")
    run = cli("inspect", str(empty))
    assert (run.rc, run.out) == (0, "sampled 0 records from 1 shard: it holds no records\n")
    assert cli("inspect", "--json", str(empty)).json()["shards_sampled"] == 1

    path = write_records(tmp_path / "one.tfrecord", [encode({"größe_特徴": [1.0, 2.0], "x": 1})])
    lines = cli("inspect", str(path)).out.splitlines()
    assert lines[0] == "sampled 1 record from 1 shard: 1 example"
    assert lines[3] == "Example features (1 record)"
    table = lines[4:7]
    # every column starts at the same terminal column: "特徴" is 4 columns wide
    starts = [
        line.index("float") + 2 if "特徴" in line else line.index("int64") for line in table[1:]
    ]
    assert starts[0] == starts[1] == table[0].index("kind")
