"""Which matches of a glob are hidden: names starting with ``_`` or ``.`` that a glob component
matched, never a literal component of the pattern (the user named it)."""

from __future__ import annotations

from pathlib import Path

import pytest

import streamrec
from streamrec.errors import ObjectNotFoundError
from streamrec.pipeline.listing.urls import is_hidden


def _write(path: Path, payloads: list[bytes]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with streamrec.sync.open_writer(str(path)) as writer:
        writer.write_many(payloads)


def test_a_literal_underscore_directory_after_a_wildcard_is_read(tmp_path: Path) -> None:
    _write(tmp_path / "a" / "_meta" / "x.tfrecord", [b"a1", b"a2"])
    _write(tmp_path / "b" / "_meta" / "x.tfrecord", [b"b1"])
    _write(tmp_path / "_skip" / "_meta" / "x.tfrecord", [b"hidden"])  # * matched _skip
    ds = streamrec.open_dataset(f"{tmp_path}/*/_meta/*.tfrecord")
    assert list(ds) == [b"a1", b"a2", b"b1"]


def test_what_a_wildcard_matches_is_still_hidden(tmp_path: Path) -> None:
    _write(tmp_path / "_reshard" / "x.tfrecord", [b"hidden"])
    _write(tmp_path / "d" / "_tmp" / "x.tfrecord", [b"hidden"])
    with pytest.raises(ObjectNotFoundError, match="starting with '_'"):
        list(streamrec.open_dataset(f"{tmp_path}/**/x.tfrecord"))
    _write(tmp_path / "d" / "x.tfrecord", [b"seen"])
    assert list(streamrec.open_dataset(f"{tmp_path}/**/x.tfrecord")) == [b"seen"]


@pytest.mark.parametrize(
    ("url", "pattern", "hidden"),
    [
        ("s3://b/d/a/_meta/x", "s3://b/d/*/_meta/x*", False),
        ("s3://b/d/_a/m/x", "s3://b/d/*/m/x*", True),
        ("s3://b/d/a/m/x.idx", "s3://b/d/*/m/*", True),
        ("s3://b/d/a/_m/x", "s3://b/d/**/x*", True),
        ("s3://b/d/x", "s3://b/d/**/x*", False),
        ("s3://b/_d/a/_meta/x", "s3://b/_d/**/_meta/x*", False),
        ("s3://b/_d/_a/_meta/x", "s3://b/_d/**/_meta/x*", True),
        ("s3://b/d/.x", "s3://b/d/*", True),
        ("s3://b/d/m/", "s3://b/d/*", True),
    ],
)
def test_hidden_names(url: str, pattern: str, hidden: bool) -> None:
    assert is_hidden(url, pattern) is hidden
