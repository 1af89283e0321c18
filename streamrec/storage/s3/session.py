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

A client with proxies or a client certificate keeps aiobotocore's own session (the door does
not serve such stores either): :func:`sender_for` returns None for it. That session reads an
answer whole, uncapped (botocore's proxy settings, ``proxies_config`` and the config file's
proxy and certificate are botocore's to apply: not copied here); its listing pages are still
refused past a page's bounds, once read.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

from streamrec.storage.http.body import capped_answers
from streamrec.storage.s3.listing import PAGE_BYTES
from streamrec.storage.s3.settings import config_file_names, proxied, verify_of

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
    ) -> None:
        self._verify = verify
        self._max_connections = max_connections
        self._timeouts = (connect_timeout_s, read_timeout_s)
        self._session: Any = None
        self._lock = asyncio.Lock()

    async def _opened(self) -> Any:
        if self._session is None:
            async with self._lock:
                if self._session is None:
                    import aiohttp

                    from streamrec.storage.s3.tls import start_tls_context

                    context = await start_tls_context(self._verify)
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

    async def __call__(self, request: Any, **_: Any) -> Any:
        """botocore's ``before-send`` handler: the answer to ``request``."""
        import aiohttp
        from aiobotocore.awsrequest import AioAWSResponse  # type: ignore[import-untyped]
        from botocore.exceptions import (
            ConnectionClosedError,
            ConnectTimeoutError,
            EndpointConnectionError,
            HTTPClientError,
            ReadTimeoutError,
        )
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
        try:
            session = await self._opened()
            response = await session.request(
                request.method,
                url=URL(url, encoded=True),
                chunked=chunked or None,
                headers=headers,
                data=request.body,
                allow_redirects=False,
            )
            answer_headers = {
                name.decode("utf-8").lower(): value.decode("utf-8")
                for name, value in response.raw_headers
            }
            answer = AioAWSResponse(str(response.url), response.status, answer_headers, response)
            if not request.stream_output:
                await answer.content  # read now, as aiobotocore does
            return answer
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

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()


def sender_for(
    options: dict[str, Any], environ: Any, max_connections: int, timeouts_s: tuple[float, float]
) -> NoRedirectSender | None:
    """The sender of a client made from the filesystem's ``options``, or None where the
    client keeps aiobotocore's session (proxies, a client certificate, a session of the
    caller's, or settings it cannot tell)."""
    client = options.get("client_kwargs") or {}
    config = options.get("config_kwargs") or {}
    if (
        options.get("session") is not None
        or not isinstance(client, dict)
        or not isinstance(config, dict)
        or config.get("proxies")
        or config.get("client_cert")
        or config.get("proxies_config")
        or config.get("connector_args")
        or proxied(environ)
        or config_file_names(environ, (b"ca_bundle", b"proxy", b"client_cert"))
    ):
        return None  # (what the config file says of these, botocore reads)
    verify = verify_of(client, environ)
    if verify is None:
        return None
    pool = config.get("max_pool_connections", max_connections)
    if not isinstance(pool, int) or pool < 1:
        return None
    return NoRedirectSender(verify, pool, *timeouts_s)
