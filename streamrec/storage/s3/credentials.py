"""The credentials the door signs with: given, none, or botocore's own resolver's.

:class:`ResolvedCredentials` asks botocore's public resolver (an ``AioSession``'s
``get_credentials()``) once per store, then the credentials object it returns for frozen
credentials on every request: botocore refreshes temporary ones (instance and container roles,
web identity, SSO, ``credential_process``, assumed roles) before they expire, under its own
lock, exactly as it does for its clients. What the door signs with is therefore what the
client would sign with, whatever the chain found.
"""

from __future__ import annotations

import asyncio
from typing import Any, NamedTuple

from streamrec.errors import StorageError

__all__ = ["Frozen", "ResolvedCredentials", "credential_source"]


class Frozen(NamedTuple):
    """Credentials at one moment (``token``: a session token, for temporary ones)."""

    key: str
    secret: str
    token: str | None


class _Given:
    def __init__(self, frozen: Frozen | None) -> None:
        self._frozen = frozen

    async def get(self) -> Frozen | None:
        return self._frozen


class ResolvedCredentials:
    """botocore's credential chain for ``profile`` (None: the environment's), resolved on the
    first request and refreshed by botocore (see the module docstring)."""

    def __init__(self, profile: str | None) -> None:
        self._profile = profile
        self._credentials: Any = None
        self._resolved = False
        self._lock = asyncio.Lock()

    async def get(self) -> Frozen | None:
        if not self._resolved:
            async with self._lock:
                if not self._resolved:
                    self._credentials = await self._resolve()
                    self._resolved = True
        frozen = None
        if self._credentials is not None:
            frozen = await self._credentials.get_frozen_credentials()
        if frozen is None or not frozen.access_key or not frozen.secret_key:
            raise StorageError(
                "no AWS credentials found (botocore's chain: the environment, the shared "
                "credentials and config files, SSO, container and instance roles); pass "
                "storage_options={'anon': True} for a public bucket"
            )
        return Frozen(frozen.access_key, frozen.secret_key, frozen.token or None)

    async def _resolve(self) -> Any:
        from aiobotocore.session import AioSession  # type: ignore[import-untyped]

        session = AioSession(profile=self._profile)
        return await session.get_credentials()


def credential_source(
    credentials: str | tuple[str, str, str | None], profile: str | None
) -> _Given | ResolvedCredentials:
    """What a door of these settings signs with (``"anon"``: nothing, ``"resolve"``: the
    resolver, else the given credentials)."""
    if credentials == "anon":
        return _Given(None)
    if credentials == "resolve":
        return ResolvedCredentials(profile)
    assert isinstance(credentials, tuple)
    return _Given(Frozen(*credentials))
