"""Credentials embedded in urls (``https://user:token@host/...``) kept out of text we hand on.

Urls keep their credentials where they are used (the request itself); everything streamrec
shows or stores (errors, log lines, ``state_dict()``'s configuration, ``repr``) has the
user-info part replaced by ``***``.
"""

from __future__ import annotations

import re

__all__ = ["redact"]

# scheme://userinfo@ : userinfo holds no "/", "?", "#", "@" or whitespace (RFC 3986). Azure's
# abfs://container@account.dfs.core.windows.net/... names a container there, not a credential
# (SAS tokens and keys travel in storage_options), so az/abfs urls are left as they are.
_USERINFO = re.compile(r"\b(?!(?:abfss?|az)://)([A-Za-z][A-Za-z0-9+.\-]*://)[^/?#@\s]+@")


def redact(text: str) -> str:
    """``text`` with the credentials of every url in it replaced: ``https://***@host/...``."""
    return _USERINFO.sub(r"\1***@", text) if "@" in text else text
