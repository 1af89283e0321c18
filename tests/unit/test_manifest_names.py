"""Manifest shard names: the fast path for plain names resolves exactly as the full checks do,
and every other name still takes them."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamrec.errors import FormatError
from streamrec.manifest.core import _PLAIN_NAME, _resolve_checked, loads, resolve_name

MANIFESTS = [
    "s3://bucket/data/_manifest.json",
    "s3://bucket/_manifest.json",
    "gs://b/a%20b/_manifest.json",
    "https://host/x/y/_manifest.json",
    "/abs/dir/_manifest.json",
    "rel/dir/_manifest.json",
    "_manifest.json",
    "file:///_manifest.json",  # a scheme's root: the checks refuse, so must the fast path
    "memory://_manifest.json",
    "s3://b/a%25252525252e/_manifest.json",  # still encoded after the decodings allowed
    "./d/_manifest.json",
    "s3://b//d/_manifest.json",
]
NAMES = st.text(alphabet="ab09_-./%\\:2e", min_size=1, max_size=24)


def outcome(resolve: Callable[[], str]) -> str | None:
    try:
        return resolve()
    except ValueError:
        return None


@settings(max_examples=2000, deadline=None)
@given(NAMES, st.sampled_from(MANIFESTS))
def test_names_resolve_as_the_checks_do(name: str, manifest: str) -> None:
    checked = outcome(lambda: _resolve_checked(name, manifest, False))
    assert outcome(lambda: resolve_name(name, manifest)) == checked


@pytest.mark.parametrize("manifest", MANIFESTS)
def test_a_manifests_plain_names_resolve_as_the_checks_do(manifest: str) -> None:
    names = ["part-000.tfrecord", "a/b-1.tfrecord.gz", "x"]
    document = {"format": "streamrec.manifest.core", "version": 1, "shards": []}
    for k, name in enumerate(names):
        document["shards"].append(
            {"index": k, "name": name, "records": 1, "bytes": 1, "crc32c": 0, "url": name}
        )
    expected = [outcome(lambda n=name: _resolve_checked(n, manifest, False)) for name in names]
    if None in expected:
        with pytest.raises(FormatError):
            loads(json.dumps(document), manifest)
    else:
        assert [e.url for e in loads(json.dumps(document), manifest).shards] == expected


@pytest.mark.parametrize("name", ["../x", "a/../../x", ".", "..", "%2e%2e/x", "/etc/x", "a\\b"])
def test_names_outside_are_refused(name: str) -> None:
    assert not _PLAIN_NAME.match(name)
    with pytest.raises(ValueError):
        resolve_name(name, "s3://bucket/data/_manifest.json")
