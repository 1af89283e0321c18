"""How streamrec's S3 clients send their requests: on an aiohttp session of the store's own,
following no redirect.

aiobotocore sends every request through ``aiohttp.ClientSession.request`` with aiohttp's
default ``allow_redirects=True``: a 301/302/303/307/308 from the endpoint (or anyone who can
answer for it) would send the request again, ``X-Amz-Security-Token``, an SSE-C key, ``Range``
and ``If-Match`` included, to whatever host its ``Location`` names, and that host's body would
be taken as the object. botocore itself (urllib3) follows none. aiobotocore offers no public
setting for it, so the client's requests are sent by :class:`NoRedirectSender`, a handler of
botocore's public ``before-send`` event (a handler that returns a response is the response:
botocore's documented way to send a request another way). It sends the request as
aiobotocore's own session does (the same headers, body, timeouts, pool size and TLS trust),
with ``allow_redirects=False``; a redirect reaches botocore as the error answer it is
(:func:`~streamrec.storage.translate.redirected` names where it pointed).

An answer the client reads whole (every answer but an object's bytes: listing pages, errors,
a multipart upload's XML) is read to at most :data:`ANSWER_BYTES` (the session's
``response_class``, :func:`~streamrec.storage.http.body.capped_answers`): a longer one is
:class:`~streamrec.storage.http.body.AnswerTooLong` once that much has arrived, not a body of
any length held in memory before the listing's bounds
(:mod:`~streamrec.storage.s3.listing`) could refuse it.

A client certificate (``config_kwargs["client_cert"]``: a PEM file with the certificate and
its key, or ``(certificate, key)`` paths, as botocore takes it) is offered from a TLS context
of the store's own (:func:`~streamrec.storage.s3.tls.build_tls_context`); a key protected by a
passphrase is a :class:`~streamrec.errors.StorageError` naming the certificate, not a prompt
on the terminal. botocore reads no ``client_cert`` from the AWS config file.

A client behind a proxy (``config_kwargs["proxies"]``, or ``HTTP_PROXY`` / ``HTTPS_PROXY`` in
the environment, ``NO_PROXY`` heeded: botocore's own choice of proxy and its
``Proxy-Authorization`` from the proxy url's user and password) is sent through it here too
(aiohttp's public ``proxy=``) when every proxy named is ``http://`` (or has no scheme, which
botocore takes for ``http://``) or ``https://``. An https endpoint is reached through a
``CONNECT`` tunnel, its TLS inside the proxy's for an ``https://`` proxy. TLS to an
``https://`` proxy is checked against the endpoint's trust (``verify``), hostname included,
as aiobotocore's is when ``proxies_config`` names no CA bundle of its own. aiohttp's public
API has one TLS context for both hops, hence what follows.

These keep aiobotocore's own session (:func:`sender_for` returns None; the door does not serve
them either):

* ``config_kwargs["proxies_config"]`` (``proxy_ca_bundle``, ``proxy_client_cert``: TLS to the
  proxy unlike the endpoint's), and an AWS config file naming any ``proxy`` setting or a
  ``ca_bundle`` (which botocore reads there: looked for by name, whichever profile);
* a proxy of another scheme (``socks5://``...), or any ``https://`` proxy along with a client
  certificate (it would be offered to the proxy, which botocore never does);
* ``config_kwargs["connector_args"]`` (aiobotocore's own, some of them not aiohttp's:
  ``ssl_context``, ``pool_timeout``...), a ``session`` of the caller's (its settings are its
  own), a ``client_cert`` that is neither a path nor a pair of paths, and settings of a type
  botocore would not take.

aiobotocore's session follows redirects and reads an answer whole, uncapped (what those
settings need of it is aiobotocore's to apply: its proxy TLS is set through aiohttp
internals). What still holds there: a listing page is refused past a page's bounds
(:mod:`~streamrec.storage.s3.listing`), once read, before botocore parses it; an object's
bytes stream as everywhere.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Mapping
from typing import Any, Literal

from streamrec.errors import StorageError
from streamrec.redact import redact
from streamrec.storage.http.body import capped_answers
from streamrec.storage.s3.listing import PAGE_BYTES
from streamrec.storage.s3.settings import config_file_names, proxied, verify_of
from streamrec.storage.s3.tls import ClientCert, build_tls_context, start_tls_context

__all__ = ["ANSWER_BYTES", "NoRedirectSender", "sender_for"]

ANSWER_BYTES = PAGE_BYTES + (64 << 10)
"""Most bytes of an answer the client reads whole: a listing page's most and room for its
head (a page a little longer still reaches the listing's own check, which says so)."""


class NoRedirectSender:
    """Sends a client's requests on a session of its own (see the module docstring); closed
    with the store."""

    def __init__(
        self,
        verify: bool | str,
        max_connections: int,
        connect_timeout_s: float,
        read_timeout_s: float,
        proxies: Mapping[str, str] | None = None,
        client_cert: ClientCert | None = None,
    ) -> None:
        self._verify = verify
        self._client_cert = client_cert
        self._proxies = proxies  # (None: the environment's, for each request's url)
        self._max_connections = max_connections
        self._timeouts = (connect_timeout_s, read_timeout_s)
        self._session: Any = None
        self._lock = asyncio.Lock()

    async def _opened(self, url: str) -> Any:
        if self._session is None:
            async with self._lock:
                if self._session is None:
                    import aiohttp

                    context = await self._tls_context(url)
                    connect_s, read_s = self._timeouts
                    self._session = aiohttp.ClientSession(
                        connector=aiohttp.TCPConnector(
                            limit=self._max_connections, ssl=context, keepalive_timeout=12
                        ),
                        timeout=aiohttp.ClientTimeout(sock_connect=connect_s, sock_read=read_s),
                        skip_auto_headers={"CONTENT-TYPE"},
                        auto_decompress=False,
                        response_class=capped_answers(ANSWER_BYTES),
                    )
        return self._session

    async def _tls_context(self, url: str) -> ssl.SSLContext:
        """The process's context for the store's trust, or with a client certificate the
        store's own (built off the loop: it reads files)."""
        if self._client_cert is None:
            return await start_tls_context(self._verify)
        try:
            return await asyncio.to_thread(build_tls_context, self._verify, self._client_cert)
        except (OSError, ValueError) as exc:  # (ssl.SSLError: an OSError)
            raise StorageError(
                f"{redact(url)}: the client certificate {self._client_cert!r} cannot be used "
                f"({type(exc).__name__}: {exc})"
            ) from exc

    async def __call__(self, request: Any, **_: Any) -> Any:
        """botocore's ``before-send`` handler: the answer to ``request``."""
        import aiohttp
        from aiobotocore.awsrequest import AioAWSResponse  # type: ignore[import-untyped]
        from botocore.exceptions import (
            ConnectionClosedError,
            ConnectTimeoutError,
            EndpointConnectionError,
            HTTPClientError,
            ProxyConnectionError,
            ReadTimeoutError,
            SSLError,
        )
        from botocore.httpsession import mask_proxy_url
        from multidict import CIMultiDict
        from yarl import URL

        url = request.url
        headers = CIMultiDict(
            (name, value.decode("utf-8") if isinstance(value, bytes) else value)
            for name, value in request.headers.items()
        )
        headers["Accept-Encoding"] = "identity"  # (botocore/botocore#1255, as aiobotocore)
        chunked = headers.get("Transfer-Encoding", "").lower() == "chunked"
        if chunked:  # aiohttp wants it as a parameter, not a header
            del headers["Transfer-Encoding"]
        proxy, proxy_headers = self._proxy_for(url)
        try:
            session = await self._opened(url)
            response = await session.request(
                request.method,
                url=URL(url, encoded=True),
                chunked=chunked or None,
                headers=headers,
                data=request.body,
                allow_redirects=False,
                proxy=proxy,
                proxy_headers=proxy_headers,
            )
            answer_headers = {
                name.decode("utf-8").lower(): value.decode("utf-8")
                for name, value in response.raw_headers
            }
            answer = AioAWSResponse(str(response.url), response.status, answer_headers, response)
            if not request.stream_output:
                await answer.content  # read now, as aiobotocore does
            return answer
        except aiohttp.ClientSSLError as exc:  # (the endpoint's TLS, or the proxy's)
            raise SSLError(endpoint_url=url, error=exc) from exc
        except (aiohttp.ClientProxyConnectionError, aiohttp.ClientHttpProxyError) as exc:
            raise ProxyConnectionError(proxy_url=mask_proxy_url(proxy), error=exc) from exc
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError) as exc:
            raise ConnectionClosedError(error=exc, request=request, endpoint_url=url) from exc
        except aiohttp.ServerTimeoutError as exc:
            if str(exc).lower().startswith("connect"):
                raise ConnectTimeoutError(endpoint_url=url, error=exc) from exc
            raise ReadTimeoutError(endpoint_url=url, error=exc) from exc
        except (aiohttp.ClientConnectionError, socket.gaierror) as exc:
            raise EndpointConnectionError(endpoint_url=url, error=exc) from exc
        except asyncio.TimeoutError as exc:
            raise ReadTimeoutError(endpoint_url=url, error=exc) from exc
        except (asyncio.CancelledError, HTTPClientError):
            raise
        except aiohttp.ClientError as exc:
            raise HTTPClientError(error=exc) from exc

    def _proxy_for(self, url: str) -> tuple[str | None, dict[str, str] | None]:
        """The proxy of a request to ``url`` and its headers, as botocore chooses them."""
        from botocore.httpsession import ProxyConfiguration
        from botocore.utils import get_environ_proxies

        proxies = get_environ_proxies(url) if self._proxies is None else self._proxies
        if not proxies:
            return None, None
        config = ProxyConfiguration(proxies=dict(proxies))
        proxy: str | None = config.proxy_url_for(url)
        if not proxy:
            return None, None
        return proxy, config.proxy_headers_for(proxy) or None

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()


def sender_for(
    options: dict[str, Any], environ: Any, max_connections: int, timeouts_s: tuple[float, float]
) -> NoRedirectSender | None:
    """The sender of a client made from the filesystem's ``options``, or None where the
    client keeps aiobotocore's session (see the module docstring: proxy TLS settings, a proxy
    neither ``http://`` nor ``https://``, a client certificate with an ``https://`` proxy,
    ``connector_args``, a session of the caller's, or settings it cannot tell)."""
    client = options.get("client_kwargs") or {}
    config = options.get("config_kwargs") or {}
    if (
        options.get("session") is not None
        or not isinstance(client, dict)
        or not isinstance(config, dict)
        or config.get("proxies_config")
        or config.get("connector_args")
        or config_file_names(environ, (b"ca_bundle", b"proxy"))
    ):
        return None  # (what the config file says of these, botocore reads)
    client_cert = _client_cert(config.get("client_cert"))
    if client_cert is False:
        return None
    proxies = config.get("proxies")
    named = proxies if proxies is not None else _environ_proxies(environ)
    if (proxies is not None or proxied(environ)) and not _proxies_served(named, client_cert):
        return None
    verify = verify_of(client, environ)
    if verify is None:
        return None
    pool = config.get("max_pool_connections", max_connections)
    if not isinstance(pool, int) or pool < 1:
        return None
    return NoRedirectSender(verify, pool, *timeouts_s, proxies=proxies, client_cert=client_cert)


def _client_cert(value: Any) -> ClientCert | Literal[False] | None:
    """``config_kwargs``' ``client_cert`` as aiobotocore takes it (None: none; False: a value
    it would not take as one, such as a list: what it does with it is its own)."""
    if value is None or value == "":
        return None  # (aiobotocore offers none for an empty path either)
    if isinstance(value, str):
        return value
    if (
        isinstance(value, tuple)
        and len(value) == 2
        and all(isinstance(part, str) and part for part in value)
    ):
        return (value[0], value[1])
    return False


def _environ_proxies(environ: Mapping[str, str]) -> dict[str, str]:
    """The proxies the environment names, by scheme (``HTTP_PROXY``, ``https_proxy``...)."""
    found = {}
    for name, value in environ.items():
        lower = name.lower()
        if lower.endswith("_proxy") and lower != "no_proxy" and value:
            found[lower[: -len("_proxy")]] = value
    return found


def _proxies_served(proxies: Any, client_cert: ClientCert | None) -> bool:
    """Whether every proxy of ``proxies`` is one aiohttp's public ``proxy=`` reaches as
    botocore would: ``http://`` (or no scheme, which botocore takes for ``http://``), or
    ``https://`` with no client certificate (aiohttp's TLS to the proxy is the endpoint's
    context, which would offer the proxy the certificate botocore keeps for the endpoint)."""
    if not isinstance(proxies, Mapping):
        return False
    for value in proxies.values():
        if not isinstance(value, str):
            return False
        scheme, found, _ = value.partition("://")
        scheme = scheme.lower() if found else "http"
        if scheme != "http" and (scheme != "https" or client_cert is not None):
            return False
    return True
