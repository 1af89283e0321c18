"""A listing page of S3, parsed as botocore parses it, within bounds: what the door's
pages (:mod:`streamrec.storage.s3.door`) and the client's own are put through.

A page (:func:`parse_page`) is used only when it is a well-formed page of the bucket and
prefix asked for, parsed as botocore parses it (UTF-8; keys url-decoded when the answer says
``EncodingType`` ``url``, as botocore's handler does; a field twice, which botocore makes a
list of, refused).

A page no listing of the keys asked for can be (:class:`HostilePage`): longer than
:data:`PAGE_BYTES`, nested deeper than :data:`PAGE_DEPTH`, or of more elements than
:data:`ELEMENTS_PER_KEY` per key asked for, is refused while it is parsed, fed a piece at a
time to a builder that counts (a 16 MiB page of empty or nested elements would otherwise cost
hundreds of MB of element objects before it could be refused):
:func:`refuse_hostile_page`, on the client's ``before-parse`` event, puts the client's own
pages through the same bounds.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, unquote_plus
from xml.etree import ElementTree

__all__ = [
    "ELEMENTS_PER_KEY",
    "PAGE_BYTES",
    "PAGE_DEPTH",
    "HostilePage",
    "list_query",
    "parse_page",
    "refuse_hostile_page",
]

PAGE_BYTES = 16 << 20
"""Most bytes of a page's body (1,000 keys of at most 1,024 bytes, url-encoded: ~10 MB)."""
PAGE_DEPTH = 8
"""Deepest nesting of a page's elements (``ListBucketResult`` > ``Contents`` > ``Owner`` >
``ID`` is 4)."""
ELEMENTS_PER_KEY = 32
"""Most elements a page may hold per key asked for (a ``Contents`` entry is ~12: key, size,
ETag, dates, checksums, owner...), and as many again for the page's own fields."""
CLIENT_PAGE_KEYS = 1000
"""The keys a page of the client's may hold (S3's most per page)."""
_FEED_BYTES = 64 << 10  # a page is parsed this much at a time (the bounds checked between)
_NAMESPACE = re.compile(r"^\{[^}]*\}")
_LISTS = frozenset({"Contents", "CommonPrefixes"})  # the elements a page repeats


def list_query(
    prefix: str,
    delimiter: str,
    max_keys: int,
    token: str | None = None,
) -> str:
    """The query of a ``ListObjectsV2`` page as botocore sends it (``token``: the previous
    page's ``NextContinuationToken``; ``delimiter`` ``""``: none, every key below the
    prefix)."""
    after = "" if token is None else f"&continuation-token={_encode(token)}"
    split = f"&delimiter={_encode(delimiter)}" if delimiter else ""
    return (
        f"list-type=2&prefix={_encode(prefix)}{split}&max-keys={max_keys}{after}&encoding-type=url"
    )


def _encode(text: str) -> str:
    return quote(text, safe="-_.~")


def parse_page(body: bytes, bucket: str, prefix: str, max_keys: int) -> dict[str, Any] | None:
    """A ``ListObjectsV2`` answer as botocore's ``list_objects_v2`` returns it (``Contents``
    with ``Key``, ``Size``, ``ETag``; ``IsTruncated``; ``NextContinuationToken``), or None
    when ``body`` is not a page of ``bucket`` and ``prefix`` of at most ``max_keys`` keys."""
    if (
        b"<!DOCTYPE" in body
        or b"<!ENTITY" in body
        or b"\0" in body  # (UTF-16 or -32: the byte checks would not see what is parsed)
    ):
        return None  # no document type, no entities: nothing the parser would expand
    root = _parse_bounded(body, max_keys)
    if root is None or _tag(root) != "ListBucketResult":
        return None
    fields = _fields([child for child in root if _tag(child) not in _LISTS])
    items = [_fields(list(item)) for item in root if _tag(item) == "Contents"]
    contents = [item for item in items if item is not None]
    if fields is None or len(contents) != len(items):
        return None  # a field twice: botocore makes a list of it (no page of ours)
    decode = unquote_plus if fields.get("EncodingType") == "url" else _same
    truncated = fields.get("IsTruncated", "false")
    if (
        fields.get("Name") != bucket
        or decode(fields.get("Prefix", "")) != prefix
        or truncated not in ("true", "false")
        or len(contents) > max_keys
    ):
        return None
    found = []
    for item in contents:
        key, size = item.get("Key"), item.get("Size", "")
        if not key or not size.isdigit() or len(size) > 19:
            return None
        entry: dict[str, Any] = {"Key": decode(key), "Size": int(size)}
        if item.get("ETag"):
            entry["ETag"] = item["ETag"]
        found.append(entry)
    page: dict[str, Any] = {"Contents": found, "IsTruncated": truncated == "true"}
    if fields.get("NextContinuationToken"):
        page["NextContinuationToken"] = fields["NextContinuationToken"]
    return page


class HostilePage(ValueError):
    """A listing page past the bounds of any page of the keys asked for (see the module
    docstring): refused, never listed again through the client."""


def refuse_hostile_page(response_dict: Mapping[str, Any], **_: Any) -> None:
    """botocore's ``before-parse`` handler for listing pages: raises :class:`HostilePage` for
    a success body past the bounds of a page of :data:`CLIENT_PAGE_KEYS` keys, before
    botocore's parser builds its tree (a body that is not XML is left to that parser)."""
    body = response_dict.get("body")
    status = response_dict.get("status_code")
    if isinstance(status, int) and status < 300 and isinstance(body, (bytes, bytearray)):
        _parse_bounded(bytes(body), CLIENT_PAGE_KEYS)


def _parse_bounded(body: bytes, max_keys: int) -> ElementTree.Element | None:
    """``body`` parsed as botocore parses it (UTF-8 whatever the document declares, no
    document type), a piece at a time; None when it is not well-formed XML. Raises
    :class:`HostilePage` as soon as it goes past a page's bounds for ``max_keys`` keys."""
    if len(body) > PAGE_BYTES:
        raise HostilePage(f"a listing page of {len(body):,} bytes (at most {PAGE_BYTES:,})")
    builder = _BoundedBuilder(ELEMENTS_PER_KEY * (max_keys + 1))
    parser = ElementTree.XMLParser(target=builder, encoding="utf-8")
    view = memoryview(body)
    try:
        for start in range(0, len(body), _FEED_BYTES):
            parser.feed(view[start : start + _FEED_BYTES])
        root: ElementTree.Element = parser.close()
    except ElementTree.ParseError:
        return None
    if builder.refused is not None:  # (raised inside the parser: it may report another error)
        raise HostilePage(builder.refused)
    return root


class _BoundedBuilder(ElementTree.TreeBuilder):
    """A tree builder that stops the parse (an exception out of ``feed``) at a document type,
    past :data:`PAGE_DEPTH` levels or past ``max_elements`` elements."""

    def __init__(self, max_elements: int) -> None:
        super().__init__()
        self._left = max_elements
        self._depth = 0
        self.refused: str | None = None

    def start(self, tag: Any, attrs: Any) -> ElementTree.Element:
        self._left -= 1
        self._depth += 1
        if self._left < 0:
            self._refuse("more elements than a page of the keys asked for holds")
        if self._depth > PAGE_DEPTH:
            self._refuse(f"elements nested more than {PAGE_DEPTH} deep")
        return super().start(tag, attrs)

    def end(self, tag: Any) -> ElementTree.Element:
        self._depth -= 1
        return super().end(tag)

    def _refuse(self, why: str) -> None:
        self.refused = f"a listing page of {why}"
        raise HostilePage(self.refused)

    def doctype(self, name: str, pubid: str, system: str) -> None:
        raise ElementTree.ParseError(f"a document type ({name}) in a listing")


def _fields(elements: list[ElementTree.Element]) -> dict[str, str] | None:
    """The text of each element by its tag, None if a tag comes twice."""
    fields = {_tag(element): element.text or "" for element in elements}
    return fields if len(fields) == len(elements) else None


def _tag(element: ElementTree.Element) -> str:
    return _NAMESPACE.sub("", element.tag)


def _same(text: str) -> str:
    return text
