"""A refused connection is said in words, whichever client wrapped it and how (the stores
against a refusing port: tests/integration/test_gcs_client.py)."""

from __future__ import annotations

import socket
from collections.abc import Callable

import pytest

from streamrec.errors import StorageError, TransientStorageError
from streamrec.storage.translate import ConnectFailed, refused_by, translate

URL = "gs://bucket/shard.tfrecord"


def _refused() -> ConnectionRefusedError:
    """A real refused connection (a loopback port bound, then closed)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with socket.socket() as sock:
        try:
            sock.connect(("127.0.0.1", port))
        except ConnectionRefusedError as exc:
            return exc
    pytest.skip("the closed port accepted a connection")


class _Wrapper(Exception):
    """A client's own error around the OSError (botocore's EndpointConnectionError, ...)."""


class _Inner(Exception):
    """azure.core's way: the original in ``inner_exception``."""

    def __init__(self, inner: BaseException) -> None:
        super().__init__("Cannot connect to host")
        self.inner_exception = inner


def _chained() -> BaseException:
    try:
        try:
            raise _refused()
        except ConnectionRefusedError as exc:
            raise _Wrapper("Could not connect to the endpoint URL") from exc
    except _Wrapper as outer:
        return outer


@pytest.mark.parametrize(
    "make",
    [_refused, _chained, lambda: _Inner(_refused()), lambda: _carried(_Inner(_refused()))],
    ids=["plain", "cause", "inner_exception", "carried past a client's retries"],
)
def test_a_refused_connection_is_a_transient_error_that_says_so(
    make: Callable[[], BaseException],
) -> None:
    exc = make()
    error = translate(exc, URL, "listing")
    assert type(error) is TransientStorageError
    assert str(error).startswith(f"{URL}: listing: connection refused")


def test_other_failures_are_not_called_refused() -> None:
    for exc in (ConnectionResetError("reset"), _Wrapper("x"), OSError("no route")):
        assert refused_by(exc) is None
        assert "refused" not in str(translate(exc, URL, "listing"))
    assert isinstance(translate(ConnectionResetError("r"), URL, "x"), StorageError)


def _carried(exc: BaseException) -> ConnectFailed:
    carrier = ConnectFailed(str(exc))
    carrier.__cause__ = exc
    return carrier
