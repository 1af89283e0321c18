"""A paged listing's checks (storage/pages.py): each page's keys after the ones before, each
continuation token new, a truncated page naming the next."""

from __future__ import annotations

import pytest

from streamrec.errors import StorageError
from streamrec.storage.pages import PageTrail, glob_prefix

URL = "s3://b/d/*"


def test_a_sound_listing_passes_and_ends() -> None:
    trail = PageTrail(URL)
    assert trail.take(["d/a", "d/b"], True, "t1") == "t1"
    assert trail.take([], True, "t2") == "t2"  # (an empty page in between: S3 may send one)
    assert trail.take(["d/c", "d/~", "d/ü", "d/\U0001f600"], False, None) is None
    assert trail.pages == 3


@pytest.mark.parametrize(
    ("pages", "problem"),
    [
        ([(["d/a", "d/b"], True, "t1"), (["d/b", "d/c"], False, None)], "a key listed twice"),
        ([(["d/a", "d/a"], False, None)], "page 1: a key listed twice"),
        ([(["d/b"], True, "t1"), (["d/a"], False, None)], "page 2: keys out of order"),
        ([(["d/b", "d/a"], False, None)], "keys out of order"),
        ([(["d/a"], True, "t1"), (["d/b"], True, "t1")], "a continuation token that came"),
        ([(["d/a"], True, None)], "names no continuation token"),
        ([(["d/a"], True, "")], "names no continuation token"),
    ],
)
def test_a_broken_listing_is_refused(
    pages: list[tuple[list[str], bool, str | None]], problem: str
) -> None:
    trail = PageTrail(URL)
    with pytest.raises(StorageError, match=problem) as raised:
        for keys, truncated, token in pages:
            trail.take(keys, truncated, token)
    assert str(raised.value).startswith(f"{URL}: a broken listing: page ")


def test_an_unsorted_listing_is_checked_for_keys_twice() -> None:
    trail = PageTrail(URL, ordered=False)  # (S3 Express directory buckets list unsorted)
    assert trail.take(["d/c", "d/a"], True, "t1") == "t1"
    with pytest.raises(StorageError, match="page 2: a key listed twice"):
        trail.take(["d/b", "d/c"], False, None)
    trail = PageTrail(URL, ordered=False)
    trail.take(["d/b"], True, "t")
    with pytest.raises(StorageError, match="a continuation token that came before"):
        trail.take(["d/a"], True, "t")


@pytest.mark.parametrize(
    ("path", "bucket", "prefix", "matching", "not_matching"),
    [
        (
            "b/d/part-*.rec",
            "b",
            "d/part-",
            ["b/d/part-1.rec"],
            ["b/d/part-1.idx", "b/d/x/part-1.rec"],
        ),
        ("b/d/*", "b", "d/", ["b/d/a", "b/d/a.idx"], ["b/d/", "b/d/e/f", "b/d-z"]),
        ("b/d?", "b", "d", ["b/d1"], ["b/d", "b/d12", "b/d/"]),
        ("b/[ab]*", "b", "", ["b/a", "b/b1"], ["b/c", "b/a/x"]),
    ],
)
def test_a_glob_lists_the_prefix_up_to_its_first_wildcard(
    path: str, bucket: str, prefix: str, matching: list[str], not_matching: list[str]
) -> None:
    glob = glob_prefix(path)
    assert glob is not None and (glob.bucket, glob.prefix) == (bucket, prefix)
    assert all(glob.matches(name) for name in matching)
    assert not any(glob.matches(name) for name in not_matching)


@pytest.mark.parametrize("path", ["b/*/x", "b/d/**", "b/d/x", "*"])
def test_globs_above_the_last_level_are_left_to_the_filesystem(path: str) -> None:
    assert glob_prefix(path) is None
