"""The gcsfs filesystem of a ``gs://`` store (made off the event loop, and failing fast), and
the store's own session, headers and location for the requests it sends itself.

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

Range reads and uploads go on the store's own aiohttp session (:func:`open_session`, made with
the same ``session_kwargs``), with the headers of gcsfs's public credentials object
(:func:`request_headers`) and the JSON API location of gcsfs's public ``base``
(:func:`location_of`): gcsfs offers no public way to make its own session, headers or
location, and streamrec reads no private attribute of another library. The listing pages of
globs go on the store's own session too; what gcsfs still lists (lookups, version-aware globs)
keeps gcsfs's session, so a store may hold two connection pools.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
import tempfile
import threading
from typing import Any

import aiohttp

from streamrec.storage.translate import ConnectFailed

__all__ = [
    "LOOKING_FOR_CREDENTIALS",
    "SLOW_LOOKUP_S",
    "FailFastConnector",
    "location_of",
    "open_session",
    "request_headers",
    "start_filesystem",
]

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


def location_of(fs: Any) -> str:
    """The JSON API's ``scheme://host`` that gcsfs's own requests go to (Google's, its mTLS
    endpoint, ``endpoint_url`` or ``STORAGE_EMULATOR_HOST``), from its public ``base``."""
    base = str(fs.base)
    suffix = "/storage/v1/"
    if not base.endswith(suffix):  # (a gcsfs that changed its url layout: say so)
        raise RuntimeError(f"gs://: unexpected gcsfs base url {base!r}")
    return base[: -len(suffix)]


def request_headers(fs: Any, extra: dict[str, str]) -> dict[str, str]:
    """``extra`` with the headers gcsfs sends: its User-Agent, and the credentials' own
    (``Authorization``; the token refreshed first when due) through the public
    ``fs.credentials.apply``."""
    from gcsfs import __version__

    headers = dict(extra)
    headers.setdefault("User-Agent", f"python-gcsfs/{__version__}")
    fs.credentials.apply(headers)
    return headers


async def open_session(options: dict[str, Any], location: str) -> aiohttp.ClientSession:
    """The store's own session for its range reads and uploads to ``location``: the
    options' ``session_kwargs``, on a :class:`FailFastConnector`; on the caller's connector
    when ``session_kwargs`` brings one (shared with gcsfs's session, which owns it); on a
    connector presenting google-auth's client certificate where gcsfs would present it
    (mutual TLS to an https location)."""
    kwargs = dict(options.get("session_kwargs") or {})
    given = kwargs.pop("connector", None)
    if given is not None:
        return aiohttp.ClientSession(connector=given, connector_owner=False, **kwargs)
    connector: aiohttp.TCPConnector
    if location.startswith("https://") and _presents_client_certificate():
        context = await asyncio.to_thread(client_certificate_context)
        connector = aiohttp.TCPConnector(ssl=context)
    else:
        connector = FailFastConnector()
    return aiohttp.ClientSession(connector=connector, **kwargs)


def client_certificate_context() -> ssl.SSLContext:
    """A context that verifies servers like aiohttp's default and presents google-auth's
    default client certificate (what gcsfs presents under mutual TLS). Blocking."""
    from google.auth import exceptions
    from google.auth.transport import mtls

    mtls_module: Any = mtls  # (google-auth is untyped)
    errors: Any = exceptions
    cert, key = mtls_module.default_client_cert_source()()
    if not cert or not key:
        raise errors.MutualTLSChannelError(
            "google-auth is configured to use a client certificate, but its default client "
            "certificate source returned no certificate or key"
        )
    context = ssl.create_default_context()
    context.set_alpn_protocols(["http/1.1"])
    # load_cert_chain reads files only; the directory is private to this user
    with tempfile.TemporaryDirectory() as folder:
        paths = os.path.join(folder, "cert.pem"), os.path.join(folder, "key.pem")
        for path, data in zip(paths, (cert, key), strict=True):
            with open(path, "wb") as file:
                file.write(data)
        context.load_cert_chain(*paths)
    return context


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


def _presents_client_certificate() -> bool:
    """Whether gcsfs presents a client certificate (its own test: google-auth says one should
    be used, and a default source exists)."""
    try:
        from google.auth.transport import mtls

        mtls_module: Any = mtls  # (google-auth is untyped)
        should_use = getattr(mtls_module, "should_use_client_cert", None)
        return bool(
            should_use is not None and should_use() and mtls_module.has_default_client_cert_source()
        )
    except Exception:  # no usable google-auth set-up: none is presented
        return False


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
