"""When an S3 store may send its requests without the aiobotocore client, and the pieces of
a listing page it sends then: its url, as botocore sends it, and its answer, parsed as
botocore parses it (the requests themselves: :mod:`streamrec.storage.s3.direct`).

When (:func:`early_listing`): the filesystem's options (the caller's, with fsspec's configured
defaults) name an explicit ``endpoint_url`` (botocore addresses every bucket path-style on
one, so a url is known without its endpoint rules), credentials (the options, the
environment's ``AWS_ACCESS_KEY_ID``...) or ``anon``, and nothing a request would have to
follow: proxies, requester pays, addressing, signing or client settings, a session or
profile, options not known here; nor does the environment or the AWS config file
(virtual-hosted, accelerated, FIPS or dual-stack addressing, a CA bundle). Requests wait no
longer than the client's would (its connect timeout; its read timeout, checked every half
of it). They are signed with the credentials the client would use (the options', else the
environment's: botocore's chain looks there first) for the region it resolves (its
``region_name``, ``AWS_DEFAULT_REGION``, the config file's profile, ``us-east-1``).

A page (:func:`parse_page`) is used only when it is a well-formed page of the bucket and
prefix asked for, parsed as botocore parses it (UTF-8; keys url-decoded when the answer says
``EncodingType`` ``url``, as botocore's handler does; a field twice, which botocore makes a
list of, refused); anything else is listed through the client, whose errors the caller sees.

Except a page no listing of the keys asked for can be (:class:`HostilePage`): longer than
:data:`PAGE_BYTES`, nested deeper than :data:`PAGE_DEPTH`, or of more elements than
:data:`ELEMENTS_PER_KEY` per key asked for. It is refused while it is parsed, fed a piece at
a time to a builder that counts (a 16 MiB page of empty or nested elements would otherwise
cost hundreds of MB of element objects before it could be refused), and never handed to the
client, which would receive the same answer and parse it whole:
:func:`refuse_hostile_page`, on the client's ``before-parse`` event, puts the client's own
pages through the same bounds.
"""

from __future__ import annotations

import configparser
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote_plus, urlsplit
from xml.etree import ElementTree

__all__ = [
    "ELEMENTS_PER_KEY",
    "PAGE_BYTES",
    "PAGE_DEPTH",
    "EarlyListing",
    "HostilePage",
    "early_listing",
    "list_url",
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
_CONFIG_BYTES = 1 << 20  # a longer AWS config file is not looked into: the client
_CONFIG_WORDS = (b"addressing_style", b"accelerate", b"fips", b"dualstack", b"ca_bundle")
_OPTIONS = frozenset(
    {
        "key",
        "secret",
        "token",
        "username",
        "password",
        "anon",
        "endpoint_url",
        "client_kwargs",
        "config_kwargs",
        "skip_instance_cache",
        "use_listings_cache",
        "listings_expiry_time",
        "max_concurrency",
        "default_block_size",
        "default_fill_cache",
        "default_cache_type",
        "asynchronous",
    }
)
"""The store options the direct requests know they follow (any other: the client)."""
_CLIENT_OPTIONS = frozenset(
    {"endpoint_url", "region_name", "verify"}
    | {"aws_access_key_id", "aws_secret_access_key", "aws_session_token"}
)
_CONFIG_OPTIONS = frozenset({"retries", "max_pool_connections", "connect_timeout", "read_timeout"})
_NAMESPACE = re.compile(r"^\{[^}]*\}")
_LISTS = frozenset({"Contents", "CommonPrefixes"})  # the elements a page repeats


@dataclass(frozen=True)
class EarlyListing:
    """What the direct requests need: the endpoint (``scheme://host[:port]``), the
    signing region and credentials (None: anonymous; never in its repr), the timeouts."""

    endpoint: str
    region: str
    credentials: tuple[str, str, str | None] | None = field(repr=False)
    connect_timeout_s: float
    read_timeout_s: float

    @property
    def tls(self) -> bool:
        return self.endpoint.startswith("https:")


def early_listing(
    options: Mapping[str, Any],
    environ: Mapping[str, str],
    default_timeouts_s: tuple[float, float] = (5.0, 15.0),
) -> EarlyListing | None:
    """The direct requests' settings for a filesystem of ``options`` (an ``S3FileSystem``'s
    ``storage_options``: the caller's with fsspec's configured defaults), or None when they
    or the environment ask for anything it does not follow (see the module docstring).
    ``default_timeouts_s``: the client's connect and read timeouts where ``config_kwargs``
    name none (s3fs's own defaults)."""
    client = options.get("client_kwargs") or {}
    config = options.get("config_kwargs") or {}
    if (
        set(options) - _OPTIONS
        or not isinstance(client, Mapping)
        or not isinstance(config, Mapping)
        or set(client) - _CLIENT_OPTIONS
        or set(config) - _CONFIG_OPTIONS
    ):
        return None
    endpoint = options.get("endpoint_url") or client.get("endpoint_url")
    if not isinstance(endpoint, str):
        return None
    try:
        split = urlsplit(endpoint)
        port = split.port
    except ValueError:
        return None
    if (
        split.scheme not in ("http", "https")
        or not split.hostname
        or split.username is not None
        or split.path not in ("", "/")
        or split.query
        or split.fragment
        or "s3-accelerate" in split.hostname  # botocore: virtual-hosted on these
        or _proxied(endpoint, environ)
    ):
        return None
    config_file = _config_text(environ)
    if config_file is None or _addressed_elsewhere(environ, config_file):
        return None
    credentials = _credentials(options, client, environ)
    if credentials is None and not options.get("anon"):
        return None  # botocore's chain finds them (profiles, SSO, instance roles...)
    region = client.get("region_name") or environ.get("AWS_DEFAULT_REGION")
    region = region or _profile_region(config_file, environ)
    if region is None:
        return None  # a config file botocore reads and we could not
    del port  # (read for its check: a port that is not a number raises)
    connect_s, read_s = default_timeouts_s
    return EarlyListing(
        f"{split.scheme}://{split.netloc}",
        str(region),
        None if options.get("anon") else credentials,
        _seconds(config.get("connect_timeout"), connect_s),
        _seconds(config.get("read_timeout"), read_s),
    )


def _credentials(
    options: Mapping[str, Any], client: Mapping[str, Any], environ: Mapping[str, str]
) -> tuple[str, str, str | None] | None:
    key = _first(options.get("key"), options.get("username"), client.get("aws_access_key_id"))
    secret = _first(
        options.get("secret"), options.get("password"), client.get("aws_secret_access_key")
    )
    token = _first(options.get("token"), client.get("aws_session_token"))
    if key is None and secret is None:
        key, secret = environ.get("AWS_ACCESS_KEY_ID"), environ.get("AWS_SECRET_ACCESS_KEY")
        token = environ.get("AWS_SESSION_TOKEN")
    if not isinstance(key, str) or not isinstance(secret, str) or not key or not secret:
        return None
    return key, secret, token if isinstance(token, str) and token else None


def _first(*values: Any) -> Any:
    """The first value given (not None: an empty string is given, as s3fs passes it on)."""
    return next((value for value in values if value is not None), None)


def _config_text(environ: Mapping[str, str]) -> bytes | None:
    """The AWS config file's text (``b""``: there is none; None: it cannot be read, or is
    longer than :data:`_CONFIG_BYTES`: as if it asked for what the requests do not follow)."""
    path = environ.get("AWS_CONFIG_FILE") or os.path.join("~", ".aws", "config")
    try:
        with open(os.path.expanduser(path), "rb") as file:
            text = file.read(_CONFIG_BYTES + 1)
    except FileNotFoundError:
        return b""
    except OSError:
        return None
    return None if len(text) > _CONFIG_BYTES else text


def _addressed_elsewhere(environ: Mapping[str, str], config: bytes) -> bool:
    """Settings of the environment or the AWS config file that change botocore's url or its
    TLS trust for an explicit endpoint (virtual-hosted or accelerated addressing, FIPS or
    dual-stack endpoints, a CA bundle): looked for by name in the file's text, whichever
    profile they are in."""
    if any(
        environ.get(name, "").lower() in ("true", "1")
        for name in ("AWS_USE_FIPS_ENDPOINT", "AWS_USE_DUALSTACK_ENDPOINT")
    ):
        return True
    text = config.lower()
    return any(word in text for word in _CONFIG_WORDS)


def _profile_region(config: bytes, environ: Mapping[str, str]) -> str | None:
    """The ``region`` of the profile botocore reads (``AWS_PROFILE``, else
    ``AWS_DEFAULT_PROFILE``, else ``default``) in the config file, ``us-east-1`` where it
    names none (botocore's default for S3 on an explicit endpoint); None: the file could
    not be parsed as botocore parses it."""
    parser = configparser.RawConfigParser()
    try:
        parser.read_string(config.decode("utf-8"))
    except (UnicodeDecodeError, configparser.Error):
        return None
    profile = environ.get("AWS_PROFILE") or environ.get("AWS_DEFAULT_PROFILE") or "default"
    section = "default" if profile == "default" else f"profile {profile}"
    if parser.has_option(section, "region"):
        return parser.get(section, "region").strip() or "us-east-1"
    return "us-east-1"


def _proxied(endpoint: str, environ: Mapping[str, str]) -> bool:
    """A proxy set in the environment for the endpoint's scheme (whatever ``no_proxy``
    says: the client decides that, through its own rules)."""
    scheme = endpoint.split(":", 1)[0]
    names = {f"{scheme}_proxy", "all_proxy"}
    return any(value and name.lower() in names for name, value in environ.items())


def _seconds(value: Any, default_s: float) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return float(value)
    return default_s


def list_url(
    endpoint: str,
    bucket: str,
    prefix: str,
    delimiter: str,
    max_keys: int,
    token: str | None = None,
) -> str:
    """The url of a ``ListObjectsV2`` page as botocore sends it for an explicit endpoint
    (``token``: the previous page's ``NextContinuationToken``)."""
    after = "" if token is None else f"&continuation-token={_encode(token)}"
    query = (
        f"list-type=2&prefix={_encode(prefix)}&delimiter={_encode(delimiter)}"
        f"&max-keys={max_keys}{after}&encoding-type=url"
    )
    return f"{endpoint}/{_encode(bucket)}?{query}"


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
