"""A paged listing's checks (storage/pages.py): each page's keys after the ones before, each
continuation token new, a truncated page naming the next."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fsspec.implementations.memory import MemoryFileSystem

from streamrec.errors import StorageError
from streamrec.storage.pages import PageTrail, glob_prefix
from support.deep_tree import DEEP_GLOBS, DEEP_KEYS, DEEP_PLACEHOLDERS

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


# Azure's flat listing of the same blobs: a flat namespace's, a hierarchical one's (depth first)
BY_NAME = ["A", "A-B", "A-B-C", "A-B/dat2", "A-C", "A.C", "A.C/dat3", "A/dat1", "AB", "AB.txt"]
BY_NAME += ["AB/AB", "AB/dat4", "ABC"]
DEPTH_FIRST = ["A", "A/dat1", "A-B", "A-B/dat2", "A-B-C", "A-C", "A.C", "A.C/dat3", "AB"]
DEPTH_FIRST += ["AB/AB", "AB/dat4", "AB.txt", "ABC"]


@pytest.mark.parametrize("keys", [BY_NAME, DEPTH_FIRST])
def test_a_depth_first_listing_passes_in_either_order(keys: list[str]) -> None:
    assert sorted(keys) == BY_NAME and sorted(keys, key=lambda k: k.split("/")) == DEPTH_FIRST
    trail = PageTrail(URL, depth_first=True)
    for i in range(0, len(keys), 3):
        trail.take(keys[i : i + 3], i + 3 < len(keys), f"t{i}")
    assert trail.pages == 5
    with pytest.raises(StorageError, match="keys out of order"):  # (only name order, else)
        PageTrail(URL).take(DEPTH_FIRST, False, None)


@pytest.mark.parametrize(
    ("keys", "problem"),
    [
        (["A", "A/dat1", "A/dat1"], "a key listed twice"),
        (["A-B", "A/dat1", "A-B"], "keys out of order"),  # by name, then back
        (["A", "A/dat1", "A-B", "A/dat2"], "keys out of order"),  # depth first, then back
        (["A/dat1", "A-B", "AB", "A"], "keys out of order"),
    ],
)
def test_a_depth_first_listing_keeps_to_one_order(keys: list[str], problem: str) -> None:
    trail = PageTrail(URL, depth_first=True)
    trail.take(keys[:2], True, "t1")
    with pytest.raises(StorageError, match=f"page 2: {problem}"):
        trail.take(keys[2:], False, None)


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


@pytest.mark.parametrize(
    ("path", "prefix"),
    [
        ("b/d/*/x", "d/"),
        ("b/d/**", "d/"),
        ("b/**/part-*", ""),
        ("b/20*/x/*.rec", "20"),
        ("b/d/x-?/**/y", "d/x-"),
    ],
)
def test_a_glob_above_the_last_level_lists_every_key_below_its_prefix(
    path: str, prefix: str
) -> None:
    glob = glob_prefix(path)
    assert glob is not None and (glob.bucket, glob.prefix, glob.delimiter) == ("b", prefix, "")


@pytest.mark.parametrize("path", ["b/d/x", "*", "b*/d/*", "b?/*", "b/d/a**b/*", "b", "b/*/*/"])
def test_globs_it_cannot_list_are_left_to_the_filesystem(path: str) -> None:
    # no wildcard; a wildcard in the bucket; ``**`` not a whole component (fsspec refuses it);
    # a glob of directories only
    assert glob_prefix(path) is None


TREE = [f"b/{key}" for key in DEEP_KEYS]
PLACEHOLDERS = [f"b/{key}" for key in DEEP_PLACEHOLDERS]


@pytest.fixture
def memory() -> Iterator[MemoryFileSystem]:
    """fsspec's in-memory filesystem holding :data:`TREE` (its store is global: restored)."""
    fs = MemoryFileSystem()
    store, dirs = dict(fs.store), list(fs.pseudo_dirs)
    fs.store.clear()
    fs.pseudo_dirs[:] = [""]
    try:
        for name in TREE:
            fs.pipe_file(f"/{name}", b"x")
        yield fs
    finally:
        fs.store.clear()
        fs.store.update(store)
        fs.pseudo_dirs[:] = dirs


@pytest.mark.parametrize("pattern", [f"b/{tail}" for tail in DEEP_GLOBS])
def test_a_glob_matches_what_fsspecs_glob_returns(memory: MemoryFileSystem, pattern: str) -> None:
    # fsspec's own glob over the same tree (MemoryFileSystem: fsspec's generic glob, the one
    # s3fs, gcsfs and adlfs inherit): its files are what a store's expand returns
    expected = sorted(
        path.lstrip("/") for path in memory.glob(f"/{pattern}") if memory.isfile(path)
    )
    assert expected
    glob = glob_prefix(pattern)
    assert glob is not None
    listed = [name for name in TREE + PLACEHOLDERS if name.startswith(f"b/{glob.prefix}")]
    if glob.delimiter:
        below = len(f"b/{glob.prefix}")
        listed = [name for name in listed if "/" not in name[below:].rstrip("/")]
    assert sorted(name for name in listed if glob.matches(name)) == expected
