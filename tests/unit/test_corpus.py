"""Every file TensorFlow wrote into the reference corpus reads back exactly."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

import streamrec
from streamrec.errors import CompressionError, CorruptRecordError, TruncatedRecordError
from support.corpus import MANIFEST as _MANIFEST

VALID_FILES = sorted(_MANIFEST["files"])
CORRUPT_FILES = sorted(_MANIFEST["corrupt"])


def _expected_records(manifest: dict[str, Any], name: str) -> list[dict[str, Any]]:
    entry = manifest["files"][name]
    source = entry.get("records_same_as")
    if source is not None:
        return list(manifest["files"][source]["records"])
    if "records" in entry:
        return list(entry["records"])
    raise AssertionError(f"{name}: manifest lists no records")


def _concatenated_records(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    # gzip/concatenated_members = gzip/images then gzip/features, joined with `cat`
    files = manifest["files"]
    return list(files["plain/images.tfrecord"]["records"]) + list(
        files["plain/features.tfrecord"]["records"]
    )


@pytest.mark.parametrize("name", VALID_FILES)
def test_valid_file_reads_back_exactly(
    name: str, manifest: dict[str, Any], corpus_dir: Path, scanner: str
) -> None:
    entry = manifest["files"][name]
    if name == "gzip/concatenated_members.tfrecord.gz":
        expected = _concatenated_records(manifest)
    else:
        expected = _expected_records(manifest, name)
    payloads = list(streamrec.open_dataset(str(corpus_dir / name)))
    assert len(payloads) == entry["num_records"] == len(expected)
    assert [hashlib.sha256(p).hexdigest() for p in payloads] == [r["sha256"] for r in expected]
    assert [len(p) for p in payloads] == [r["length"] for r in expected]


@pytest.mark.parametrize("name", VALID_FILES)
async def test_async_iteration_matches_sync(name: str, corpus_dir: Path) -> None:
    ds = streamrec.open_dataset(str(corpus_dir / name))
    via_async = [p async for p in ds]
    assert via_async == list(ds)


def test_sharded_glob_reads_shards_in_name_order(
    manifest: dict[str, Any], corpus_dir: Path
) -> None:
    pattern = corpus_dir / "sharded" / "data-*-of-00005.tfrecord"
    payloads = list(streamrec.open_dataset(str(pattern)))
    expected = [
        r["sha256"]
        for k in sorted(n for n in manifest["files"] if n.startswith("sharded/"))
        for r in manifest["files"][k]["records"]
    ]
    assert [hashlib.sha256(p).hexdigest() for p in payloads] == expected
    assert len(payloads) == 15


def test_tf_reference_order_without_interleave(manifest: dict[str, Any], corpus_dir: Path) -> None:
    # TFRecordDataset(files) reads files one after another; so do we.
    from streamrec.example import decode

    reference = manifest["interleave_reference"]
    files = [str(corpus_dir / f) for f in reference["files"]]
    order = [int(decode(p)["idx"][0]) for p in streamrec.open_dataset(files)]
    expected = reference["tfrecorddataset_filenames_sequential"]
    if isinstance(expected, dict):
        expected = expected["idx_sequence"]
    assert order == expected


def _base_records(manifest: dict[str, Any], entry: dict[str, Any]) -> list[str]:
    return [r["sha256"] for r in _expected_records(manifest, entry["base"])]


@pytest.mark.parametrize("name", CORRUPT_FILES)
def test_damaged_file_yields_good_prefix_then_raises(
    name: str, manifest: dict[str, Any], corpus_dir: Path, scanner: str
) -> None:
    entry = manifest["corrupt"][name]
    bad = entry.get("first_bad_record")
    expected_good = entry["tf_behaviour"]["records_yielded"]
    if bad is not None:
        expected_good = bad["index"]
    got: list[bytes] = []
    url = str(corpus_dir / name)
    with pytest.raises((CorruptRecordError, TruncatedRecordError, CompressionError)) as info:
        for payload in streamrec.open_dataset(url):
            got.append(payload)
    base = _base_records(manifest, entry)
    assert [hashlib.sha256(p).hexdigest() for p in got] == base[:expected_good]
    assert len(got) == entry["tf_behaviour"]["records_yielded"]
    error = info.value
    assert error.url == url
    assert url in str(error)
    if bad is not None:
        assert error.record_index == bad["index"]
        assert error.offset == bad["offset"]
        assert f"byte offset {bad['offset']}" in str(error)
        expected_type = {
            "bad_data_crc": CorruptRecordError,
            "bad_length_crc": CorruptRecordError,
            "truncated_data": TruncatedRecordError,
            "truncated_header": TruncatedRecordError,
        }[bad["problem"]]
        assert type(error) is expected_type
        if bad["problem"] == "bad_data_crc":
            assert isinstance(error, CorruptRecordError) and error.which == "payload"
        if bad["problem"] == "bad_length_crc":
            assert isinstance(error, CorruptRecordError) and error.which == "length"
    else:
        # The truncated gzip file: the two records TF read, then a compression error that
        # names the record it interrupted.
        assert isinstance(error, CompressionError)
        assert error.record_index == expected_good


@pytest.mark.parametrize("name", CORRUPT_FILES)
def test_damaged_file_skip_mode_drops_only_the_damage(
    name: str, manifest: dict[str, Any], corpus_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    entry = manifest["corrupt"][name]
    bad = entry.get("first_bad_record")
    base = _base_records(manifest, entry)
    ds = streamrec.open_dataset(str(corpus_dir / name), on_corrupt="skip")
    with caplog.at_level("WARNING", logger="streamrec"):
        got = [hashlib.sha256(p).hexdigest() for p in ds]
    if bad is not None and bad["problem"] == "bad_data_crc":
        # a bad payload under a good header: that record only
        assert got == base[: bad["index"]] + base[bad["index"] + 1 :]
    else:
        # the framing is broken: the rest of the file is dropped
        assert got == base[: entry["tf_behaviour"]["records_yielded"]]
    assert ds.stats.corrupt_skipped == 1
    assert len(caplog.records) == 1
    assert str(corpus_dir / name) in caplog.records[0].getMessage()


@pytest.mark.parametrize("name", CORRUPT_FILES)
def test_verify_crc_off_skips_crc_work(
    name: str, manifest: dict[str, Any], corpus_dir: Path
) -> None:
    entry = manifest["corrupt"][name]
    bad = entry.get("first_bad_record")
    ds = streamrec.open_dataset(str(corpus_dir / name), verify_crc=False)
    if bad is not None and bad["problem"] in ("bad_data_crc", "bad_length_crc"):
        # A flipped CRC bit goes unnoticed without verification: every record comes through.
        got = list(ds)
        assert len(got) == len(_base_records(manifest, entry))
        if bad["problem"] == "bad_data_crc":
            flipped = hashlib.sha256(got[bad["index"]]).hexdigest()
            assert flipped != _base_records(manifest, entry)[bad["index"]]
    else:
        with pytest.raises((TruncatedRecordError, CompressionError)):
            list(ds)
