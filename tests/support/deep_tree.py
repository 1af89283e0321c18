"""A tree of several levels for deep globs (``**``, wildcards above the last level): the keys
a store holds, its directory placeholders (keys ending in ``/``), and the globs listed over it,
each with matching and non-matching siblings at several depths.

    for key in DEEP_KEYS: server.put(bucket, key, data)
    for tail in DEEP_GLOBS: url = f"s3://{bucket}/{tail}"
"""

from __future__ import annotations

__all__ = ["DEEP_GLOBS", "DEEP_KEYS", "DEEP_PLACEHOLDERS", "under"]

DEEP_KEYS = [
    "top.rec",
    "part-0",
    "p/part-1",
    "p/q/part-2",
    "p/q/r/part-3",
    "p/q/notpart",
    "data/train-9.tfrecord",
    "data/a/train-0.tfrecord",
    "data/a/train-1.tfrecord",
    "data/a/train-7 ü+%.tfrecord",
    "data/a/eval-0.tfrecord",
    "data/a/train-0.tfrecord.idx",
    "data/a/deep/train-2.tfrecord",
    "data/a/deep/er/train-5.tfrecord",
    "data/b/train-3.tfrecord",
    "data-x/c/train-4.tfrecord",
    "datab/train-6.tfrecord",
    "19/x/s.tfrecord",
    "2023/x/s.tfrecord",
    "2024/x/s.tfrecord",
    "2024/y/s.tfrecord",
    "2024/x/z/s.tfrecord",
    "20/x/s.tfrecord",
    "a.b/x/y",
]
DEEP_PLACEHOLDERS = ["data/", "data/a/", "data/a/deep/", "2024/x/", "p/q/"]
"""Empty objects named like directories (what consoles and ``mkdir`` leave): never a match."""

DEEP_GLOBS = [
    "data/*/train-*.tfrecord",
    "data*/*/train-*.tfrecord",
    "data/**/train-*.tfrecord",
    "data/**",
    "**/part-*",
    "**",
    "p/**/part-?",
    "**/q/**",
    "20*/x/*.tfrecord",
    "20??/*/s.tfrecord",
    "[12]*/x/*",
    "[!1]*/x/s.*",
    "*/*/train-[0-3].tfrecord",
    "a.b/*/y",
    "data/*",
]
"""Globs relative to the bucket; all but the last are listed without a delimiter."""


def under(prefix: str) -> list[str]:
    """The keys and placeholders below ``prefix`` (what a listing without delimiter lists)."""
    return sorted(key for key in DEEP_KEYS + DEEP_PLACEHOLDERS if key.startswith(prefix))
