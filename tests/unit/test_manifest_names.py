"""Manifest shard names: the fast path for plain names resolves exactly as the full checks do,
and every other name still takes them."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamrec.manifest.core import _PLAIN_NAME, _resolve_checked, resolve_name

MANIFESTS = [
    "s3://bucket/data/_manifest.json",
    "s3://bucket/_manifest.json",
    "gs://b/a%20b/_manifest.json",
    "https://host/x/y/_manifest.json",
    "/abs/dir/_manifest.json",
    "rel/dir/_manifest.json",
    "_manifest.json",
]
NAMES = st.text(alphabet="ab09_-./%\\:2e", min_size=1, max_size=24)


@settings(max_examples=2000, deadline=None)
@given(NAMES, st.sampled_from(MANIFESTS))
def test_plain_names_resolve_as_the_checks_do(name: str, manifest: str) -> None:
    try:
        checked: str | None = _resolve_checked(name, manifest, False)
    except ValueError:
        checked = None
    if _PLAIN_NAME.match(name):
        assert checked is not None and resolve_name(name, manifest) == checked
    elif checked is None:
        with pytest.raises(ValueError):
            resolve_name(name, manifest)
    else:
        assert resolve_name(name, manifest) == checked


@pytest.mark.parametrize("name", ["../x", "a/../../x", ".", "..", "%2e%2e/x", "/etc/x", "a\\b"])
def test_names_outside_are_refused(name: str) -> None:
    assert not _PLAIN_NAME.match(name)
    with pytest.raises(ValueError):
        resolve_name(name, "s3://bucket/data/_manifest.json")
