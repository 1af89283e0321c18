"""A refused connection is said in words, whichever client wrapped it and how (the stores
against a refusing port: tests/integration/test_gcs_client.py); a timed-out attempt names
what it was waiting for besides its request."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

import pytest

from streamrec.errors import RetriesExhaustedError, StorageError, TransientStorageError
from streamrec.storage.retry import RetryPolicy, waiting_for
from streamrec.storage.translate import ConnectFailed, refused_by, translate

URL = "gs://bucket/shard.tfrecord"


def _refused() -> ConnectionRefusedError:
    """A real refused connection (to a loopback port bound and not listening)."""
    with socket.socket() as bound, socket.socket() as sock:
        bound.bind(("127.0.0.1", 0))
        try:
            sock.connect(bound.getsockname())
        except ConnectionRefusedError as exc:
            return exc
    raise AssertionError("a port bound without listen() accepted a connection")


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


async def test_an_attempt_that_times_out_names_what_it_was_waiting_for() -> None:
    """A wait outside the request (gs://'s credential lookup) is named when an attempt
    times out on it, and not once the wait is over."""
    never = asyncio.Event()
    waited: list[int] = []

    async def attempt() -> None:
        waited.append(1)
        if len(waited) == 1:
            done = waiting_for("the lookup")
            await never.wait()  # (cut by the attempt's timeout)
            done()
        else:
            done = waiting_for("the lookup")
            done()
            await never.wait()

    policy = RetryPolicy(max_attempts=2, initial_backoff_s=0, timeout_s=0.05)
    with pytest.raises(RetriesExhaustedError) as caught:
        await policy.run(attempt, describe="listing x")
    assert isinstance(caught.value.__cause__, TransientStorageError)
    assert str(caught.value.__cause__) == "listing x: no answer within 0.1 s"
    assert "(waiting for the lookup)" not in str(caught.value)
    assert waiting_for("outside any attempt")() is None  # (no attempt: nothing noted)


async def test_the_first_timed_out_attempt_names_the_wait() -> None:
    never = asyncio.Event()

    async def attempt() -> None:
        waiting_for("the lookup")
        await never.wait()

    policy = RetryPolicy(max_attempts=1, timeout_s=0.05)
    with pytest.raises(
        RetriesExhaustedError, match=r"no answer within 0.1 s \(waiting for the lookup\)"
    ):
        await policy.run(attempt, describe="listing x")
