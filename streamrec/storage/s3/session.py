"""The HTTP session of streamrec's S3 clients: aiobotocore's own, except that it never follows
a redirect.

aiobotocore sends every request through ``aiohttp.ClientSession.request`` with aiohttp's
default ``allow_redirects=True``: a 301/302/303/307/308 from the endpoint (or anyone who can
answer for it) would send the request again, ``X-Amz-Security-Token``, ``X-Amz-Date``,
``Range`` and ``If-Match`` included, to whatever host its ``Location`` names, and that host's
body would be taken as the object. botocore itself (urllib3) follows none, and S3 answers a
request in the wrong region with an error that names the right one (botocore's region
redirector then signs the request for it). So the clients streamrec makes
(``config_kwargs``' ``http_session_cls``, aiobotocore's documented way to choose the HTTP
session) get :class:`NoRedirectSession`: aiobotocore's ``AIOHTTPSession`` whose requests
are sent with ``allow_redirects=False``. A redirect then reaches botocore as the error answer
it is (:func:`~streamrec.storage.translate.redirected` names where it pointed).

aiobotocore offers no public setting for this; the one thing relied on is its
``_get_session(proxy_url)``, the method that hands ``send`` its aiohttp session. Should a
later aiobotocore stop calling it, :meth:`NoRedirectSession.send` still refuses an answer that
came from another url than the one asked for (the tests of redirects fail first).
"""

from __future__ import annotations

from typing import Any

from aiobotocore.httpsession import AIOHTTPSession  # type: ignore[import-untyped]

from streamrec.storage.translate import redirected

__all__ = ["NoRedirectSession"]


class NoRedirectSession(AIOHTTPSession):  # type: ignore[misc]
    """aiobotocore's HTTP session, following no redirect (see the module docstring)."""

    async def _get_session(self, proxy_url: str | None) -> Any:
        return _NoRedirects(await super()._get_session(proxy_url))

    async def send(self, request: Any) -> Any:
        response = await super().send(request)
        followed = getattr(response.raw, "history", None)  # aiohttp's redirects followed
        if followed:  # (only if aiobotocore no longer asks _get_session: never the body)
            response.raw.close()
            raise redirected(followed[0].status, response.url, request.url, request.method)
        return response


class _NoRedirects:
    """An aiohttp session whose requests follow no redirect."""

    def __init__(self, session: Any) -> None:
        self._session = session

    def request(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["allow_redirects"] = False
        return self._session.request(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)
