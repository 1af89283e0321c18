"""Which way an S3 store reads, forced for a test: through its door (storage/s3/door.py, the
default wherever the door follows the options) or through the aiobotocore client (what a
store whose options the door does not follow does, for its whole life)."""

from __future__ import annotations

from typing import Any

import pytest

import streamrec.storage.s3.store as s3_store

__all__ = ["RANGE_GET_PATHS", "force_range_get_path"]

RANGE_GET_PATHS = ("door", "client")


def force_range_get_path(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make S3 stores made from now on read ``path`` (one of :data:`RANGE_GET_PATHS`)."""
    if path == "client":

        def no_door(*args: Any, **kwargs: Any) -> None:
            return None

        monkeypatch.setattr(s3_store, "door_settings", no_door)
