"""Which way the S3 client's range GETs go, forced for a test (storage/s3_get.py): signed
GETs on streamrec's own connections (the default), on the client's HTTP session, or
``get_object``."""

from __future__ import annotations

from typing import Any

import pytest

from streamrec.storage.s3 import signed_get as s3_get

__all__ = ["RANGE_GET_PATHS", "force_range_get_path"]

RANGE_GET_PATHS = ("own-connections", "session", "get_object")


def force_range_get_path(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the client's range GETs go ``path`` (one of :data:`RANGE_GET_PATHS`)."""
    if path == "session":

        async def no_own_connections(self: Any, client: Any, url: str) -> None:
            self.direct = False
            return None

        monkeypatch.setattr(s3_get.RangeGetter, "_range_client", no_own_connections)
    elif path == "get_object":
        monkeypatch.setattr(s3_get.RangeGetter, "serves", lambda self, client, bucket: False)
