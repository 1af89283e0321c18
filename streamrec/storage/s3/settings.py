"""Whether an S3 store's reads go through the door, and with what: decided once, at set-up.

The door (:mod:`streamrec.storage.s3.door`) sends every range GET, listing page and first-bytes
read of a store on streamrec's own connections, signed here with SigV4. It serves a store
when the store's options (the caller's, with fsspec's configured defaults) and the
environment say nothing it does not follow; :func:`door_settings` then says where requests go
and how they are signed, else returns None and the store reads through the aiobotocore client
for its whole life (never chosen per request).

Where requests go:

* an explicit endpoint (``endpoint_url`` in the options or ``client_kwargs``, else the
  environment's ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``): every bucket path-style on it,
  as botocore addresses it (MinIO, SeaweedFS, R2, test servers);
* else AWS: ``https://<bucket>.s3.<region>.amazonaws.com`` (virtual-hosted, as botocore's
  ``auto`` addressing does for a DNS-compatible name without dots; path-style on
  ``s3.<region>.amazonaws.com`` for other names; ``s3.amazonaws.com`` for ``us-east-1``).

The signing region: ``client_kwargs``' ``region_name``, else ``AWS_DEFAULT_REGION``, else the
config file's profile; where none is named, a bucket's region is learnt from S3's first answer
(``x-amz-bucket-region``), once per bucket, as botocore's region redirector does.

Credentials: those the options name (``key``/``secret``/``token`` and their aliases), none
for ``anon``, else botocore's own resolver (:class:`~streamrec.storage.s3.credentials.
ResolvedCredentials`: the environment, a profile's keys, SSO, ``credential_process``, web
identity, container and instance roles; refreshed as botocore refreshes them).

Not followed (the client then reads): proxies, a session or options unknown here, a
``config_kwargs`` or ``client_kwargs`` setting other than the ones listed below, virtual-hosted,
accelerated, FIPS or dual-stack addressing, an ``endpoint_url``/``services`` section or a CA
bundle in the AWS config file, China partitions, and ``s3_additional_kwargs`` other than the
ones :data:`HEADER_PARAMS` names.
"""

from __future__ import annotations

import base64
import configparser
import hashlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit

__all__ = [
    "HEADER_PARAMS",
    "DoorSettings",
    "config_file_names",
    "door_settings",
    "param_headers",
    "proxied",
    "verify_of",
]

HEADER_PARAMS: dict[str, dict[str, str]] = {
    "GetObject": {
        "RequestPayer": "x-amz-request-payer",
        "ExpectedBucketOwner": "x-amz-expected-bucket-owner",
        "SSECustomerAlgorithm": "x-amz-server-side-encryption-customer-algorithm",
        "SSECustomerKey": "x-amz-server-side-encryption-customer-key",
        "SSECustomerKeyMD5": "x-amz-server-side-encryption-customer-key-MD5",
        "ChecksumMode": "x-amz-checksum-mode",
    },
    "ListObjectsV2": {
        "RequestPayer": "x-amz-request-payer",
        "ExpectedBucketOwner": "x-amz-expected-bucket-owner",
    },
}
"""The request parameters (s3fs's ``requester_pays`` and ``s3_additional_kwargs``) the door
sends, per operation, as the headers botocore's service model puts them in (a test checks the
names against the model). A parameter an operation does not take is not sent with it, as
s3fs filters them; one the door does not know sends the store to its client."""

_CONFIG_BYTES = 1 << 20  # a longer AWS config file is not looked into: the client
_CONFIG_WORDS = (
    b"addressing_style",
    b"accelerate",
    b"fips",
    b"dualstack",
    b"ca_bundle",
    b"endpoint_url",
    b"services",
)
_OPTIONS = frozenset(
    {
        "key",
        "secret",
        "token",
        "username",
        "password",
        "anon",
        "profile",
        "endpoint_url",
        "client_kwargs",
        "config_kwargs",
        "requester_pays",
        "s3_additional_kwargs",
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
"""The store options the door knows it follows (any other: the client)."""
_CLIENT_OPTIONS = frozenset(
    {"endpoint_url", "region_name", "verify"}
    | {"aws_access_key_id", "aws_secret_access_key", "aws_session_token"}
)
_CONFIG_OPTIONS = frozenset({"retries", "max_pool_connections", "connect_timeout", "read_timeout"})
_VIRTUAL_BUCKET = re.compile(r"[a-z0-9][a-z0-9-]{1,61}[a-z0-9]")


@dataclass(frozen=True)
class DoorSettings:
    """Where a store's door sends its requests and how it signs them.

    ``endpoint``: an explicit ``scheme://host[:port]`` (path-style), or None for AWS.
    ``region``: the signing region, or None (learnt per bucket). ``credentials``: ``"anon"``,
    ``"resolve"`` (botocore's resolver, with ``profile``), or ``(key, secret, token)`` (never
    in its repr). ``verify``: TLS verification as botocore takes it (True, False, a CA file).
    ``params``: the caller's request parameters (see :data:`HEADER_PARAMS`)."""

    endpoint: str | None
    region: str | None
    credentials: str | tuple[str, str, str | None] = field(repr=False)
    connect_timeout_s: float
    read_timeout_s: float
    profile: str | None = None
    verify: bool | str = True
    params: Mapping[str, Any] = field(default_factory=dict, repr=False)

    @property
    def tls(self) -> bool:
        return self.endpoint is None or self.endpoint.startswith("https:")

    def bucket_url(self, bucket: str, region: str) -> str:
        """The url of ``bucket``'s root, as botocore addresses it (see the module docstring)."""
        if self.endpoint is not None:
            return f"{self.endpoint}/{quote(bucket, safe='')}"
        host = "s3.amazonaws.com" if region == "us-east-1" else f"s3.{region}.amazonaws.com"
        if _VIRTUAL_BUCKET.fullmatch(bucket):
            return f"https://{bucket}.{host}"
        return f"https://{host}/{quote(bucket, safe='')}"

    def list_url(self, bucket: str, region: str, query: str) -> str:
        """The url of a listing of ``bucket`` with ``query``, as botocore sends it."""
        url = self.bucket_url(bucket, region)
        return f"{url}{'/' if url.count('/') == 2 else ''}?{query}"

    def object_url(self, bucket: str, key: str, region: str) -> str:
        """The url of ``bucket/key`` as botocore sends ``get_object``."""
        return f"{self.bucket_url(bucket, region)}/{quote(key, safe='/~')}"


def door_settings(
    options: Mapping[str, Any],
    environ: Mapping[str, str],
    default_timeouts_s: tuple[float, float] = (5.0, 15.0),
    params: Mapping[str, Any] | None = None,
) -> DoorSettings | None:
    """The door's settings for a filesystem of ``options`` (an ``S3FileSystem``'s
    ``storage_options``), or None when they or the environment ask for anything it does not
    follow (see the module docstring). ``default_timeouts_s``: the client's connect and read
    timeouts where ``config_kwargs`` name none. ``params``: the request parameters s3fs adds
    to its calls (``requester_pays``, ``s3_additional_kwargs``)."""
    client = options.get("client_kwargs") or {}
    config = options.get("config_kwargs") or {}
    params = dict(params or {})
    if (
        set(options) - _OPTIONS
        or not isinstance(client, Mapping)
        or not isinstance(config, Mapping)
        or set(client) - _CLIENT_OPTIONS
        or set(config) - _CONFIG_OPTIONS
        or set(params) - set(HEADER_PARAMS["GetObject"])
        or any(not isinstance(value, str) for value in params.values())
        or proxied(environ)
    ):
        return None
    config_file = _config_text(environ)
    if config_file is None or _addressed_elsewhere(environ, config_file):
        return None
    endpoint = _endpoint(options, client, environ)
    if endpoint == "":
        return None  # an endpoint the door cannot address
    verify = verify_of(client, environ)
    if verify is None:
        return None
    profile = options.get("profile")
    if profile is not None and not isinstance(profile, str):
        return None
    region = client.get("region_name") or environ.get("AWS_DEFAULT_REGION")
    if region is None:
        region = _profile_region(config_file, profile or _env_profile(environ))
        if region is False:
            return None  # a config file botocore reads and we could not
    if region is None and endpoint is not None:
        region = "us-east-1"  # botocore's signing region on an explicit endpoint
    if not isinstance(region, (str, type(None))) or (region or "").startswith("cn-"):
        return None
    credentials: str | tuple[str, str, str | None]
    if options.get("anon"):
        credentials = "anon"
    else:
        given = _credentials(options, client)
        if given is None:
            credentials = "resolve"
        elif isinstance(given, tuple):
            credentials = given
        else:
            return None  # a key without its secret, or not text: botocore says what
    connect_s, read_s = default_timeouts_s
    return DoorSettings(
        endpoint,
        region,
        credentials,
        _seconds(config.get("connect_timeout"), connect_s),
        _seconds(config.get("read_timeout"), read_s),
        profile,
        verify,
        params,
    )


def param_headers(params: Mapping[str, Any], operation: str) -> dict[str, str]:
    """The headers that carry ``params`` on a request of ``operation`` (``"GetObject"``,
    ``"ListObjectsV2"``), as botocore sends them: an SSE-C key base64-encoded with its MD5
    added, as botocore's ``sse_md5`` handler does, unless the caller gave the MD5."""
    names = HEADER_PARAMS[operation]
    values = dict(params)
    key = values.get("SSECustomerKey")
    if key is not None and "SSECustomerKeyMD5" not in values:
        raw = key.encode() if isinstance(key, str) else bytes(key)
        digest = hashlib.md5(raw, usedforsecurity=False).digest()
        values["SSECustomerKey"] = base64.b64encode(raw).decode()
        values["SSECustomerKeyMD5"] = base64.b64encode(digest).decode()
    return {names[name]: str(value) for name, value in values.items() if name in names}


def _endpoint(
    options: Mapping[str, Any], client: Mapping[str, Any], environ: Mapping[str, str]
) -> str | None:
    """The explicit endpoint (None: AWS's; ``""``: one the door cannot address)."""
    endpoint = options.get("endpoint_url") or client.get("endpoint_url")
    if endpoint is None and environ.get("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "") != "true":
        endpoint = environ.get("AWS_ENDPOINT_URL_S3") or environ.get("AWS_ENDPOINT_URL")
    if endpoint is None:
        return None
    if not isinstance(endpoint, str):
        return ""
    try:
        split = urlsplit(endpoint)
        split.port  # noqa: B018 (a port that is not a number raises)
    except ValueError:
        return ""
    if (
        split.scheme not in ("http", "https")
        or not split.hostname
        or split.username is not None
        or split.path not in ("", "/")
        or split.query
        or split.fragment
        or "s3-accelerate" in split.hostname  # botocore: virtual-hosted on these
    ):
        return ""
    return f"{split.scheme}://{split.netloc}"


def _credentials(
    options: Mapping[str, Any], client: Mapping[str, Any]
) -> tuple[str, str, str | None] | bool | None:
    """The credentials the options name (None: none named; False: not usable as given)."""
    key = _first(options.get("key"), options.get("username"), client.get("aws_access_key_id"))
    secret = _first(
        options.get("secret"), options.get("password"), client.get("aws_secret_access_key")
    )
    token = _first(options.get("token"), client.get("aws_session_token"))
    if key is None and secret is None:
        return None
    if not isinstance(key, str) or not isinstance(secret, str) or not key or not secret:
        return False
    return key, secret, token if isinstance(token, str) and token else None


def _first(*values: Any) -> Any:
    """The first value given (not None: an empty string is given, as s3fs passes it on)."""
    return next((value for value in values if value is not None), None)


def _env_profile(environ: Mapping[str, str]) -> str:
    return environ.get("AWS_PROFILE") or environ.get("AWS_DEFAULT_PROFILE") or "default"


def _config_text(environ: Mapping[str, str]) -> bytes | None:
    """The AWS config file's text (``b""``: there is none; None: it cannot be read, or is
    longer than :data:`_CONFIG_BYTES`: as if it asked for what the door does not follow)."""
    path = environ.get("AWS_CONFIG_FILE") or os.path.join("~", ".aws", "config")
    try:
        with open(os.path.expanduser(path), "rb") as file:
            text = file.read(_CONFIG_BYTES + 1)
    except FileNotFoundError:
        return b""
    except OSError:
        return None
    return None if len(text) > _CONFIG_BYTES else text


def config_file_names(environ: Mapping[str, str], words: tuple[bytes, ...]) -> bool:
    """Whether the AWS config file names any of ``words`` (or cannot be read)."""
    text = _config_text(environ)
    return text is None or any(word in text.lower() for word in words)


def _addressed_elsewhere(environ: Mapping[str, str], config: bytes) -> bool:
    """Settings of the environment or the AWS config file that change botocore's url or its
    TLS trust (virtual-hosted or accelerated addressing, FIPS or dual-stack endpoints, an
    endpoint url, a CA bundle): looked for by name in the file's text, whichever profile."""
    if any(
        environ.get(name, "").lower() in ("true", "1")
        for name in ("AWS_USE_FIPS_ENDPOINT", "AWS_USE_DUALSTACK_ENDPOINT")
    ):
        return True
    text = config.lower()
    return any(word in text for word in _CONFIG_WORDS)


def _profile_region(config: bytes, profile: str) -> str | bool | None:
    """The ``region`` of ``profile`` in the config file (None: it names none; False: the
    file could not be parsed as botocore parses it)."""
    parser = configparser.RawConfigParser()
    try:
        parser.read_string(config.decode("utf-8"))
    except (UnicodeDecodeError, configparser.Error):
        return False
    section = "default" if profile == "default" else f"profile {profile}"
    if parser.has_option(section, "region"):
        return parser.get(section, "region").strip() or None
    return None


def verify_of(client: Mapping[str, Any], environ: Mapping[str, str]) -> bool | str | None:
    """TLS verification as botocore resolves it for a client: ``client_kwargs``' ``verify``,
    else ``AWS_CA_BUNDLE``, ``REQUESTS_CA_BUNDLE``, True (None: not a value botocore takes)."""
    verify = client.get("verify")
    if verify is None:
        verify = environ.get("AWS_CA_BUNDLE") or environ.get("REQUESTS_CA_BUNDLE") or True
    return verify if isinstance(verify, (bool, str)) else None


def proxied(environ: Mapping[str, str]) -> bool:
    """A proxy set in the environment (whatever ``no_proxy`` says: the client decides that,
    through its own rules)."""
    names = {"http_proxy", "https_proxy", "all_proxy"}
    return any(value and name.lower() in names for name, value in environ.items())


def _seconds(value: Any, default_s: float) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return float(value)
    return default_s
