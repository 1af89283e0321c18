"""Credentials embedded in urls kept out of text we hand on.

Urls keep their credentials where they are used (the request itself); everything streamrec
shows or stores (errors, log lines, ``state_dict()``'s configuration, resume fingerprints,
``repr``) has them replaced by ``***``: the user-info part (``https://user:token@host/...``)
and the query parameters that carry a signature or a token: presigned S3 urls
(``X-Amz-Signature``, ``X-Amz-Security-Token``, ``X-Amz-Credential``; SigV2's
``Signature``), Azure SAS (``sig``) and GCS signed urls (``X-Goog-Signature``,
``X-Goog-Credential``; V2's ``Signature``). What is left still names the object (and the
signed url's expiry and the like): two signed urls of one object redact to the same text.
"""

from __future__ import annotations

import re

__all__ = ["SECRET_QUERY_PARAMETERS", "redact", "unsigned_name"]

# scheme://userinfo@ : userinfo holds no "/", "?", "#", "@" or whitespace (RFC 3986). Azure's
# abfs://container@account.dfs.core.windows.net/... names a container there, not a credential
# (SAS tokens and keys travel in storage_options), so az/abfs urls are left as they are.
_USERINFO = re.compile(r"\b(?!(?:abfss?|az)://)([A-Za-z][A-Za-z0-9+.\-]*://)[^/?#@\s]+@")

SECRET_QUERY_PARAMETERS = (
    "X-Amz-Signature",
    "X-Amz-Security-Token",
    "X-Amz-Credential",
    "Signature",
    "sig",
    "X-Goog-Signature",
    "X-Goog-Credential",
)
"""Query parameters whose values are credentials (matched ignoring case)."""

# ?name=value or &name=value (also &amp;name= as an url is quoted in HTML, and the name
# percent-encoded as some clients send it): the value runs to the next "&", "#", whitespace,
# or a quote or bracket that ends a quoted url.
_QUERY = re.compile(
    r"([?&](?:amp;)?(?:"
    + "|".join(re.escape(name).replace(r"\-", "(?:-|%2[dD])") for name in SECRET_QUERY_PARAMETERS)
    + r")=)[^&#\s'\"<>()\[\]{}]+",
    re.IGNORECASE,
)


def redact(text: str) -> str:
    """``text`` with the credentials of every url in it replaced: ``https://***@host/...``,
    ``...?X-Amz-Signature=***&...``."""
    if "@" in text:
        text = _USERINFO.sub(r"\1***@", text)
    if "=" in text:
        text = _QUERY.sub(r"\1***", text)
    return text


def unsigned_name(url: str) -> str:
    """``url`` without what signing it adds, to name the object in fingerprints: a signed url
    (credentials in its user-info or query) by its redacted path alone (its date, expiry and
    signature change with every signing), any other url as it is."""
    redacted = redact(url)
    return url if redacted == url else redacted.split("?", 1)[0].split("#", 1)[0]
