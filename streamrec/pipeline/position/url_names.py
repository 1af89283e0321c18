"""How a resume state names the dataset's urls: as given while they are few, by digest when many.

A state's configuration must tell whether it comes from the same urls, yet stay small for a
list of 100,000 shard urls (listed, it took 840 KB at 20,000). So the urls (redacted: no
credentials in states) are kept as a list while that list is short (a glob, a directory, a few
shards: what a user debugging a state wants to read), and otherwise replaced by their count, the
first one (to recognise the dataset) and the SHA-256 of the whole list::

    "urls": ["s3://bucket/train/*.tfrecord"]
    "urls": {"count": 20000, "first": "s3://bucket/train/part-00000.tfrecord",
             "sha256": "<64 hex digits of the redacted list as JSON>"}

:func:`url_names` gives the form of a list of urls (the same list always gets the same form, so
two states of one dataset compare equal); :func:`canonical` turns what a state of any version
saved into that form (states before version 3 always listed the urls); :func:`differences`
says in words how two forms differ, never quoting a long list.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from typing import Any

from streamrec.redact import redact

__all__ = ["LISTED_BYTES", "UrlNames", "canonical", "differences", "url_names"]

LISTED_BYTES = 256
"""Urls whose list takes at most this many bytes of JSON are kept as a list."""

_FIRST_CHARS = 100  # the first url of a digest form, for people: cut beyond this
_HEX64 = re.compile(r"[0-9a-f]{64}\Z")
_KEYS = {"count", "first", "sha256"}

UrlNames = list[str] | dict[str, Any]
"""The urls as a state names them: a list, or ``{"count", "first", "sha256"}``."""


def url_names(urls: Sequence[str]) -> UrlNames:
    """How a state names ``urls`` (redacted here: they may carry credentials)."""
    return _of_redacted([redact(url) for url in urls])


def _of_redacted(redacted: list[str]) -> UrlNames:
    listed = json.dumps(redacted)
    if len(listed) <= LISTED_BYTES:
        return redacted
    first = redacted[0]
    if len(first) > _FIRST_CHARS:
        first = first[: _FIRST_CHARS - 3] + "..."
    digest = hashlib.sha256(listed.encode()).hexdigest()
    return {"count": len(redacted), "first": first, "sha256": digest}


def canonical(saved: object) -> object:
    """What a state saved as its urls, in today's form: a list (every earlier version, and
    short lists) as :func:`url_names` names it, a digest form as it is when well formed;
    anything else as it is (it then differs from every dataset's urls)."""
    if isinstance(saved, list) and saved and all(isinstance(u, str) for u in saved):
        return url_names(saved)  # (redacting is idempotent: a saved list is redacted already)
    return saved


def _well_formed(names: object) -> bool:
    if isinstance(names, list):
        return bool(names) and all(isinstance(u, str) for u in names)
    if not isinstance(names, dict) or set(names) != _KEYS:
        return False
    count, first, digest = names["count"], names["first"], names["sha256"]
    return (
        isinstance(count, int)
        and not isinstance(count, bool)
        and count > 0
        and isinstance(first, str)
        and len(first) <= _FIRST_CHARS
        and isinstance(digest, str)
        and _HEX64.match(digest) is not None
    )


def _short(value: object, most: int = 80) -> str:
    shown = repr(value)
    return shown if len(shown) <= most else shown[: most - 3] + "..."


def _describe(names: object, other: str = "") -> str:
    if isinstance(names, list):
        return f"{len(names)} {other}url{'s' * (len(names) != 1)} {_short(names, 160)}"
    if _well_formed(names):
        assert isinstance(names, dict)
        count = names["count"]
        return (
            f"{count} {other}url{'s' * (count != 1)} (the first {names['first']!r}, "
            f"sha256 {names['sha256'][:16]}...)"
        )
    return f"{_short(names)}, not a list of urls or their digest"


def differences(saved: object, current: UrlNames) -> str | None:
    """None when a state that saved ``saved`` (in :func:`canonical` form) was taken over the
    urls named ``current``; otherwise the difference, in words."""
    if saved == current and _well_formed(saved):
        return None
    other = "other " if _well_formed(saved) else ""
    return (
        f"urls: the state was saved over {_describe(saved, other)}; "
        f"the dataset reads {_describe(current)}"
    )
