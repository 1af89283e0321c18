"""The gcsfs filesystem of a ``gs://`` store: made off the event loop, and failing fast.

Two things gcsfs does on its own would otherwise take the time and hide the cause:

- Making a ``GCSFileSystem`` looks for Google credentials when no ``token`` is given:
  Application Default Credentials (``GOOGLE_APPLICATION_CREDENTIALS``, gcloud's file), then
  the Compute Engine metadata server (``metadata.google.internal``), in blocking calls with
  retries: off Google Cloud that takes 15-90 s before gcsfs goes on anonymously.
  :func:`start_filesystem` makes it in a daemon thread (the event loop goes on; an abandoned
  lookup never keeps the process alive), says on the ``streamrec`` logger what it is waiting
  for once it takes longer than :data:`SLOW_LOOKUP_S`, and every request that needs it waits
  within its :class:`~streamrec.storage.retry.RetryPolicy` attempt like any other wait.
- gcsfs retries every request itself, 6 attempts over ~35 s (not configurable at run time),
  a connection that is refused included. The session's connector (:class:`FailFastConnector`)
  raises :class:`~streamrec.storage.translate.ConnectFailed` instead of aiohttp's connector
  errors; gcsfs lets that through at once, and streamrec's retry policy decides (a refused
  connection is then reported as refused, with the url). Not when the caller's
  ``session_kwargs`` bring their own connector, nor when google-auth is set up for client
  certificates (gcsfs then makes the connector that presents them).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from typing import Any

import aiohttp

from streamrec.storage.translate import ConnectFailed

__all__ = ["LOOKING_FOR_CREDENTIALS", "SLOW_LOOKUP_S", "FailFastConnector", "start_filesystem"]

logger = logging.getLogger("streamrec")

SLOW_LOOKUP_S = 1.0
"""How long making the filesystem may take before a warning says what it waits for."""
LOOKING_FOR_CREDENTIALS = (
    "Google credentials (gcsfs tries Application Default Credentials, then the metadata "
    "server metadata.google.internal)"
)
"""What a request waits for while the filesystem is being made (named if it times out)."""
_METHODS = frozenset({"anon", "google_default", "cache", "cloud", "browser"})


class FailFastConnector(aiohttp.TCPConnector):
    """aiohttp's connector, whose failures to connect pass through gcsfs's retry loop."""

    async def connect(
        self,
        req: aiohttp.ClientRequest,
        traces: list[Any],
        timeout: aiohttp.ClientTimeout,
    ) -> aiohttp.connector.Connection:
        try:
            return await super().connect(req, traces, timeout)
        except aiohttp.ClientConnectorError as exc:  # refused, DNS, TLS handshake
            raise ConnectFailed(str(exc)) from exc


def start_filesystem(options: dict[str, Any]) -> asyncio.Future[Any]:
    """Start making ``gcsfs.GCSFileSystem(asynchronous=True, **options)`` in a daemon thread;
    the future (of the running loop) gets the filesystem or the error that made it fail."""
    import gcsfs

    loop = asyncio.get_running_loop()
    options = _with_connector(options)
    made: asyncio.Future[Any] = loop.create_future()

    def settle(fs: Any, error: BaseException | None) -> None:
        if made.done():
            return
        if error is not None:
            made.set_exception(error)
        else:
            made.set_result(fs)

    def make() -> None:
        fs: Any = None
        error: BaseException | None = None
        try:
            fs = gcsfs.GCSFileSystem(asynchronous=True, **options)
        except Exception as exc:  # handed to the loop, raised where the filesystem is awaited
            error = exc
        # (RuntimeError: the loop has closed meanwhile, and nobody waits any more)
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, fs, error)

    threading.Thread(target=make, name="streamrec-gcs-credentials", daemon=True).start()
    slow = loop.call_later(SLOW_LOOKUP_S, _say_what_it_waits_for, made, options)
    made.add_done_callback(lambda _: slow.cancel())
    return made


def _with_connector(options: dict[str, Any]) -> dict[str, Any]:
    session_kwargs = dict(options.get("session_kwargs") or {})
    if "connector" in session_kwargs or _client_certificates():
        return options
    session_kwargs["connector"] = FailFastConnector()
    return {**options, "session_kwargs": session_kwargs}


def _client_certificates() -> bool:
    """Whether google-auth is set up to present a client certificate (mutual TLS)."""
    try:
        from google.auth.transport import mtls

        mtls_module: Any = mtls  # (google-auth is untyped)
        return bool(
            mtls_module.should_use_client_cert() and mtls_module.has_default_client_cert_source()
        )
    except Exception:  # an older google-auth, or a broken configuration: gcsfs decides
        return True


def _say_what_it_waits_for(made: asyncio.Future[Any], options: dict[str, Any]) -> None:
    if made.done():
        return
    token = options.get("token")
    if token is None:
        logger.warning(
            'gs://: looking for Google credentials (no "token" in storage_options): '
            "Application Default Credentials (GOOGLE_APPLICATION_CREDENTIALS, gcloud's), "
            "then the Compute Engine metadata server (metadata.google.internal), which can "
            "take a minute where there is none; for public data pass "
            'storage_options={"token": "anon"}'
        )
    else:
        kind = token if token in _METHODS else type(token).__name__  # (never a secret)
        logger.warning(
            "gs://: still setting up Google credentials (token=%s) after %.0f s: "
            "waiting for gcsfs / google-auth (the metadata server, or a token refresh)",
            kind,
            SLOW_LOOKUP_S,
        )
