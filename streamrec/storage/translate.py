"""Foreign exceptions -> streamrec.errors, at the storage boundary.

Every client raises its own types (botocore, aiohttp, gcsfs, azure.core, OSError). Stores call
:func:`translate` on anything they catch, so the rest of streamrec (and the retry policy, which
decides by type) only ever sees :class:`~streamrec.errors.StorageError` subclasses.
"""

from __future__ import annotations

import asyncio
import html
import re
from urllib.parse import urlsplit

from streamrec.errors import (
    ObjectChangedError,
    ObjectNotFoundError,
    PermissionDeniedError,
    StorageError,
    TransientStorageError,
)

__all__ = [
    "DETAIL_CHARS",
    "REDIRECT_STATUSES",
    "ConnectFailed",
    "excerpt",
    "from_error_code",
    "from_status",
    "redirected",
    "refused_by",
    "translate",
]

DETAIL_CHARS = 120
"""Most characters of a server's error body kept in a message."""
_HIDDEN = re.compile(r"<(head|script|style)\b.*?</\1\s*>|<!--.*?-->", re.I | re.DOTALL)
_TAG = re.compile(r"<[/!]?[A-Za-z][^>]*>")
_SPACE = re.compile(r"\s+")

_TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestTimeout",
        "RequestTimeTooSkewed",
        "InternalError",
        "ServiceUnavailable",
        "503",
        "500",
    }
)
_NOT_FOUND_CODES = frozenset({"NoSuchKey", "NoSuchBucket", "NoSuchUpload", "404", "NotFound"})
_DENIED_CODES = frozenset(
    {
        "AccessDenied",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "InvalidToken",
        "403",
        "401",
    }
)
_CHANGED_CODES = frozenset({"PreconditionFailed", "412"})
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
"""The statuses of an answer that sends the request elsewhere (never followed for S3)."""


def excerpt(body: str, limit: int = DETAIL_CHARS) -> str:
    """A one-line excerpt of an error body: the text of an HTML page (head, scripts and tags
    dropped), whitespace collapsed, at most ``limit`` characters."""
    text = _TAG.sub(" ", _HIDDEN.sub(" ", body))
    text = html.unescape(_SPACE.sub(" ", text).strip())
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


def from_status(status: int, url: str, action: str, detail: str = "") -> StorageError:
    """The error for an HTTP status code (``detail``: the body or error code, shortened)."""
    detail = excerpt(detail)
    message = f"{url}: {action} failed with HTTP {status}" + (f": {detail}" if detail else "")
    if status == 404:
        return ObjectNotFoundError(message)
    if status in (401, 403):
        return PermissionDeniedError(message)
    if status == 412:
        return ObjectChangedError(f"{url}: the object changed while it was being read")
    if status in (408, 429) or status >= 500:
        return TransientStorageError(message)
    return StorageError(message)


def redirected(status: int, location: str | None, url: str, action: str) -> StorageError:
    """The error for an S3 answer that redirected ``action`` on ``url`` (HTTP ``status``) to
    ``location`` (its ``Location`` header, or the ``Endpoint`` an S3 error names): never
    followed (the request's credentials would go along to that host), named by its host."""
    where = "another location"
    if location:
        try:
            parts = urlsplit(location if "//" in location else f"//{location}")
            host = parts.hostname
            port = parts.port
        except ValueError:
            host, port = None, None
        if host:
            where = host if port is None else f"{host}:{port}"
    return StorageError(
        f"{url}: {action}: the server redirected the request to {where} (HTTP {status}); "
        "streamrec follows no redirect of an S3 request (its credentials would go along): "
        "point endpoint_url (or region_name) at where the bucket is"
    )


class ConnectFailed(Exception):
    """A connection that could not be opened, carried past a client's own retry loop.

    Deliberately neither an OSError nor an aiohttp ``ClientError``: a client that retries
    those itself (gcsfs: 6 attempts over ~35 s) lets it through at once, and streamrec's
    :class:`~streamrec.storage.retry.RetryPolicy` decides. The aiohttp error is its
    ``__cause__``; :func:`translate` translates that one.
    """


def translate(exc: BaseException, url: str, action: str) -> StorageError:
    """The streamrec error for ``exc``, raised while doing ``action`` on ``url``."""
    if isinstance(exc, ConnectFailed) and exc.__cause__ is not None:
        exc = exc.__cause__
    if isinstance(exc, StorageError):
        return exc
    cause = exc.__cause__  # (s3fs raises its own error from botocore's)
    if (
        cause is not None
        and not _is_botocore_client_error(exc)
        and _is_botocore_client_error(cause)
        and _redirect_status(cause) is not None
    ):
        exc = cause
    peer = refused_by(exc)
    if peer is not None:
        # Said in words on every store (the clients say "Connect call failed" or
        # "Could not connect to the endpoint URL"): nothing listens there.
        error: StorageError = TransientStorageError(
            f"{url}: {action}: connection refused{f' by {peer}' if peer else ''} "
            f"({type(exc).__name__}: {exc})"
        )
    else:
        error = _translate(exc, url, action)
    error.__cause__ = exc
    return error


def refused_by(exc: BaseException) -> str | None:
    """When ``exc`` (or an error it wraps) is a refused TCP connection: the ``host:port``
    that refused it (``""`` when no error says which); else None.

    Looks through the chain the clients build: aiohttp's ``os_error``, azure.core's
    ``inner_exception``, ``__cause__`` / ``__context__`` (botocore, urllib3)."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    host: str = ""
    while todo and len(seen) < 16:
        error = todo.pop(0)
        if id(error) in seen:
            continue
        seen.add(id(error))
        if not host:
            host = _peer(error)
        if isinstance(error, ConnectionRefusedError):
            return host or _peer_in_args(error)
        for name in ("os_error", "inner_exception", "__cause__", "__context__"):
            inner = getattr(error, name, None)
            if isinstance(inner, BaseException):
                todo.append(inner)
    return None


def _peer(error: BaseException) -> str:
    """``host:port`` from an error that names them (aiohttp's connector errors)."""
    host, port = getattr(error, "host", None), getattr(error, "port", None)
    if isinstance(host, str) and host and isinstance(port, int):
        return f"{host}:{port}"
    return ""


_ADDRESS = re.compile(r"\('([^']+)', (\d+)")


def _peer_in_args(error: OSError) -> str:
    """``host:port`` from asyncio's "Connect call failed ('127.0.0.1', 8080)"."""
    match = _ADDRESS.search(str(error))
    return f"{match.group(1)}:{match.group(2)}" if match else ""


def _translate(exc: BaseException, url: str, action: str) -> StorageError:
    name = type(exc).__name__
    module = type(exc).__module__
    if _is_botocore_client_error(exc):  # modeled errors (NoSuchKey, ...) are subclasses
        return _from_botocore(exc, url, action)
    if name == "HttpError" and module.startswith("gcsfs"):
        code = getattr(exc, "code", None)
        if isinstance(code, int):
            return from_status(code, url, action, str(getattr(exc, "message", "")))
    if module.startswith("azure."):
        return _from_azure(exc, url, action)
    if module.startswith("botocore"):
        # EndpointConnectionError, ConnectionClosedError, ReadTimeoutError,
        # ResponseStreamingError (a body cut short), IncompleteReadError, ...
        if name in ("NoCredentialsError", "PartialCredentialsError"):
            return PermissionDeniedError(f"{url}: {action}: {exc}")
        return TransientStorageError(f"{url}: {action}: {name}: {exc}")
    if module.startswith("aiohttp"):
        status = getattr(exc, "status", None)
        if isinstance(status, int) and status >= 400:
            return from_status(status, url, action, str(exc))
        # ClientPayloadError (truncated body), ServerDisconnectedError, ClientConnectorError, ...
        return TransientStorageError(f"{url}: {action}: {name}: {exc}")
    if isinstance(exc, asyncio.TimeoutError):
        return TransientStorageError(f"{url}: {action}: timed out")
    if isinstance(exc, (FileNotFoundError, NotADirectoryError)):  # a/b where a is a file
        return ObjectNotFoundError(f"{url}: no such object ({action})")
    if isinstance(exc, PermissionError):
        return PermissionDeniedError(f"{url}: permission denied ({action}): {exc}")
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return TransientStorageError(f"{url}: {action}: {name}: {exc}")
    if isinstance(exc, FileExistsError):  # gcsfs maps HTTP 412 to FileExistsError
        return ObjectChangedError(f"{url}: the object changed while it was being read")
    if isinstance(exc, OSError):
        return StorageError(f"{url}: {action} failed: {exc.strerror or exc}")
    return StorageError(f"{url}: {action} failed: {name}: {exc}")


def _is_botocore_client_error(exc: BaseException) -> bool:
    if not type(exc).__module__.startswith("botocore"):
        return False
    from botocore.exceptions import ClientError

    return isinstance(exc, ClientError)


def _redirect_status(exc: BaseException) -> int | None:
    response = getattr(exc, "response", {}) or {}
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return status if status in REDIRECT_STATUSES else None


def _from_botocore(exc: BaseException, url: str, action: str) -> StorageError:
    response = getattr(exc, "response", {}) or {}
    code = str(response.get("Error", {}).get("Code", ""))
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    if status in REDIRECT_STATUSES:
        headers = response.get("ResponseMetadata", {}).get("HTTPHeaders", {}) or {}
        location = headers.get("location") or response.get("Error", {}).get("Endpoint")
        return redirected(status, location, url, action)
    detail = response.get("Error", {}).get("Message", "")
    return from_error_code(code, status, url, action, detail)


def from_error_code(
    code: str, status: int | None, url: str, action: str, detail: str = ""
) -> StorageError:
    """The error for an S3 error answer: its ``Code`` (``NoSuchKey``, ``SlowDown``, ...; or
    ``""``) decides, else its HTTP ``status``; ``detail`` is the answer's ``Message``."""
    message = f"{url}: {action} failed: {code or 'error'} {detail}"
    if code in _NOT_FOUND_CODES:
        return ObjectNotFoundError(message.strip())
    if code in _DENIED_CODES:
        return PermissionDeniedError(message.strip())
    if code in _CHANGED_CODES:
        return ObjectChangedError(f"{url}: the object changed while it was being read")
    if code in _TRANSIENT_CODES:
        return TransientStorageError(message.strip())
    if isinstance(status, int):
        return from_status(status, url, action, code)
    return StorageError(message.strip())


def _from_azure(exc: BaseException, url: str, action: str) -> StorageError:
    """azure.core's exceptions: by HTTP status where the service answered (the error code,
    e.g. ServerBusy, only in the message), else by type."""
    from azure.core import exceptions as azure

    name = type(exc).__name__
    status = getattr(exc, "status_code", None)
    if isinstance(exc, azure.HttpResponseError) and isinstance(status, int) and status >= 400:
        response = getattr(exc, "response", None)
        headers = getattr(response, "headers", None) or {}
        code = headers.get("x-ms-error-code") or getattr(exc, "error_code", None) or ""
        return from_status(status, url, action, str(code))
    if isinstance(exc, azure.ClientAuthenticationError):  # no credential could be obtained
        return PermissionDeniedError(f"{url}: {action}: {name}: {exc}")
    if isinstance(
        exc, (azure.ServiceRequestError, azure.ServiceResponseError, azure.IncompleteReadError)
    ):  # connection refused or reset, timeouts, a body cut short
        return TransientStorageError(f"{url}: {action}: {name}: {exc}")
    # (an answer the SDK could not decode quotes all of it: DecodeError, "Content: ...")
    return StorageError(f"{url}: {action} failed: {name}: {excerpt(str(exc), 300)}")
