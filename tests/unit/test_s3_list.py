"""The S3 door's sans-I/O parts: when it serves a store (storage/s3/settings.py), and the
listing answers it refuses (storage/s3/listing.py)."""

from __future__ import annotations

import os
from typing import Any

import pytest

from streamrec.storage.s3.listing import (
    ELEMENTS_PER_KEY,
    PAGE_BYTES,
    HostilePage,
    parse_page,
    refuse_hostile_page,
)
from streamrec.storage.s3.settings import DoorSettings, door_settings, param_headers

ENDPOINT = "http://127.0.0.1:9000"
NO_CONFIG = {"AWS_CONFIG_FILE": os.path.join(os.sep, "nonexistent", "aws-config")}
BASE = {"key": "k", "secret": "s", "client_kwargs": {"endpoint_url": ENDPOINT}}


def _page(keys: list[tuple[str, str]], **fields: str) -> bytes:
    values = {"Name": "b", "Prefix": "d%2Fs", "IsTruncated": "false", "EncodingType": "url"}
    values.update(fields)
    head = "".join(f"<{k}>{v}</{k}>" for k, v in values.items())
    items = "".join(
        f"<Contents><Key>{key}</Key><ETag>&quot;e{i}&quot;</ETag><Size>{size}</Size></Contents>"
        for i, (key, size) in enumerate(keys)
    )
    return (
        b'<?xml version="1.0" encoding="UTF-8"?>\n'
        b'<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
        + (head + items).encode()
        + b"</ListBucketResult>"
    )


def test_a_page_is_parsed_as_botocore_returns_it() -> None:
    body = _page(
        [("d%2Fs+a.tfrecord", "10"), ("d%2Fs%25%2B%C3%BC", "0")],
        IsTruncated="true",
        NextContinuationToken="tok+en",
    )
    assert parse_page(body, "b", "d/s", 1000) == {
        "Contents": [
            {"Key": "d/s a.tfrecord", "Size": 10, "ETag": '"e0"'},
            {"Key": "d/s%+ü", "Size": 0, "ETag": '"e1"'},
        ],
        "IsTruncated": True,
        "NextContinuationToken": "tok+en",
    }
    # without EncodingType the keys are as sent (botocore decodes only what says it is encoded)
    plain = _page([("d/s+a", "1")], Prefix="d/s", EncodingType="")
    assert parse_page(plain, "b", "d/s", 10) == {
        "Contents": [{"Key": "d/s+a", "Size": 1, "ETag": '"e0"'}],
        "IsTruncated": False,
    }


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"not xml",
        b"<Error><Code>AccessDenied</Code></Error>",
        _page([("d%2Fs1", "1")], Name="other"),  # another bucket's page
        _page([("d%2Fs1", "1")], Prefix="d%2F"),  # another prefix's
        _page([("d%2Fs1", "1")], IsTruncated="maybe"),
        _page([("d%2Fs1", "-1")]),
        _page([("d%2Fs1", "1e3")]),
        _page([("d%2Fs1", "9" * 20)]),
        _page([("", "1")]),
        _page([("d%2Fs1", "1")] * 4),  # more keys than asked for
        b'<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "aaaa">]>'
        b"<ListBucketResult><Name>&a;</Name></ListBucketResult>",
        _page([("d%2Fs1", "1")]).replace(b"</Key>", b"</Key><Key>d%2Fs2</Key>"),  # Key twice
        _page([("d%2Fs1", "1")], Name="b</Name><Name>b"),  # a field twice
        _page([("d%2Fs1", "1")]).decode().encode("utf-16-le"),  # no BOM, no declaration seen
    ],
)
def test_anything_but_a_page_of_what_was_asked_is_refused(body: bytes) -> None:
    assert parse_page(body, "b", "d/s", 3) is None


def _listing(options: dict[str, Any], environ: dict[str, str] | None = None) -> Any:
    return door_settings(options, {**NO_CONFIG, **(environ or {})})


def _settings(
    endpoint: str | None, region: str | None, credentials: Any, *timeouts: float, **more: Any
) -> DoorSettings:
    return DoorSettings(endpoint, region, credentials, *timeouts, **more)


def test_options_that_name_all_the_request_needs() -> None:
    # (s3fs's timeouts where the options name none: connect 5 s, read 15 s)
    assert _listing(BASE) == _settings(ENDPOINT, "us-east-1", ("k", "s", None), 5.0, 15.0)
    assert _listing({**BASE, "token": "t", "endpoint_url": "https://h:1/"}) == _settings(
        "https://h:1", "us-east-1", ("k", "s", "t"), 5.0, 15.0
    )
    anonymous = _listing(
        {"anon": True, "endpoint_url": ENDPOINT, "config_kwargs": {"connect_timeout": 2}},
        {"AWS_DEFAULT_REGION": "ap-south-1", "AWS_REGION": "botocore-ignores-this"},
    )
    assert anonymous == _settings(ENDPOINT, "ap-south-1", "anon", 2.0, 15.0)


def test_credentials_the_options_do_not_name_are_botocores_to_resolve() -> None:
    """The environment's keys, a profile's, SSO, roles: botocore's resolver, for AWS and for
    an explicit endpoint alike (storage/s3/credentials.py)."""
    from_env = _listing(
        {"client_kwargs": {"endpoint_url": ENDPOINT, "region_name": "eu-west-1"}},
        {"AWS_ACCESS_KEY_ID": "ek", "AWS_SECRET_ACCESS_KEY": "es"},
    )
    assert from_env == _settings(ENDPOINT, "eu-west-1", "resolve", 5.0, 15.0)
    profile = _listing({"profile": "p"}, {"AWS_DEFAULT_REGION": "us-west-2"})
    assert profile == _settings(None, "us-west-2", "resolve", 5.0, 15.0, profile="p")
    # no region named for AWS: learnt per bucket from S3's answers
    assert _listing({}) == _settings(None, None, "resolve", 5.0, 15.0)
    # the endpoint from the environment, as botocore reads it
    env_endpoint = _listing({}, {"AWS_ENDPOINT_URL_S3": "http://h:2", "AWS_ENDPOINT_URL": "x"})
    assert env_endpoint == _settings("http://h:2", "us-east-1", "resolve", 5.0, 15.0)
    ignored = {"AWS_ENDPOINT_URL": "http://h:2", "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS": "true"}
    assert _listing({}, ignored) == _settings(None, None, "resolve", 5.0, 15.0)


def test_request_parameters_become_the_headers_botocore_sends() -> None:
    payer = _listing({**BASE, "requester_pays": True}, {})
    assert payer is not None
    params = {
        "RequestPayer": "requester",
        "SSECustomerAlgorithm": "AES256",
        "SSECustomerKey": "k" * 32,
    }
    settings = door_settings(BASE, NO_CONFIG, params=params)
    assert settings is not None and dict(settings.params) == params
    headers = param_headers(params, "GetObject")
    assert headers["x-amz-request-payer"] == "requester"
    assert headers["x-amz-server-side-encryption-customer-key-MD5"]  # added, as botocore does
    assert param_headers(params, "ListObjectsV2") == {"x-amz-request-payer": "requester"}
    assert door_settings(BASE, NO_CONFIG, params={"VersionId": "v"}) is None  # not a header


@pytest.mark.parametrize(
    ("options", "environ"),
    [
        ({**BASE, "session": object()}, {}),
        ({**BASE, "config_kwargs": {"s3": {"addressing_style": "virtual"}}}, {}),
        ({**BASE, "config_kwargs": {"proxies": {"http": "http://p:1"}}}, {}),
        ({**BASE, "client_kwargs": {"endpoint_url": ENDPOINT, "config": object()}}, {}),
        ({**BASE, "client_kwargs": {"endpoint_url": "http://h:1/path"}}, {}),
        ({**BASE, "client_kwargs": {"endpoint_url": "ftp://h:1"}}, {}),
        ({**BASE, "client_kwargs": {"endpoint_url": "http://u:p@h:1"}}, {}),
        ({**BASE, "client_kwargs": {"endpoint_url": "http://h:port"}}, {}),
        ({"key": "k", "client_kwargs": {"endpoint_url": ENDPOINT}}, {}),  # no secret
        ({**BASE, "endpoint_url": "https://s3-accelerate.amazonaws.com"}, {}),
        ({"client_kwargs": {"region_name": "cn-north-1"}}, {}),  # another partition
        (BASE, {"AWS_USE_FIPS_ENDPOINT": "true"}),
        (BASE, {"AWS_USE_DUALSTACK_ENDPOINT": "true"}),
        (BASE, {"AWS_CONFIG_FILE": "/"}),  # a config file that cannot be read
        (BASE, {"HTTP_PROXY": "http://proxy:3128"}),
        (BASE, {"all_proxy": "socks5://proxy:1080"}),
    ],
)
def test_options_it_does_not_follow_send_the_store_to_its_client(
    options: dict[str, Any], environ: dict[str, str]
) -> None:
    assert _listing(options, environ) is None


def test_a_config_file_is_looked_into_for_what_changes_the_url(tmp_path: Any) -> None:
    config = tmp_path / "config"
    config.write_text("[default]\nregion = eu-west-1\noutput = json\n")
    assert _listing(BASE, {"AWS_CONFIG_FILE": str(config)}) is not None
    for setting in (
        "s3 =\n  addressing_style = virtual",
        "ca_bundle = /x.pem",
        "use_fips_endpoint = true",
        "endpoint_url = http://elsewhere:1",
        "services = mine",
    ):
        config.write_text(f"[profile other]\n{setting}\n")
        assert _listing(BASE, {"AWS_CONFIG_FILE": str(config)}) is None, setting


def _hostile(kind: str, size: int) -> bytes:
    """A body of ``size`` bytes: a page's start, then empty elements (``flat``), or elements
    nested ever deeper (``deep``)."""
    start = b'<?xml version="1.0"?><ListBucketResult><Name>b</Name>'
    if kind == "flat":
        return start + b"<a/>" * ((size - len(start)) // 4) + b"</ListBucketResult>"
    half = (size - len(start)) // 7
    return start + b"<a>" * half + b"</a>" * half + b"</ListBucketResult>"


@pytest.mark.parametrize("kind", ["flat", "deep"])
def test_a_hostile_page_is_refused_while_it_is_parsed(kind: str) -> None:
    import tracemalloc

    body = _hostile(kind, 4 << 20)
    tracemalloc.start()
    try:
        with pytest.raises(HostilePage, match="a listing page of"):
            parse_page(body, "b", "", 1000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # refused within its bounds (a tree of the whole page: ~25 bytes per body byte)
    assert peak < 4 << 20, peak
    with pytest.raises(HostilePage):  # the client's pages go through the same bounds
        refuse_hostile_page({"status_code": 200, "body": body}, operation_model=None)
    refuse_hostile_page({"status_code": 500, "body": body})  # (an error: botocore's to read)


def test_a_page_past_its_keys_bounds_or_its_length_is_refused() -> None:
    keys = [(f"d%2Fs{i:04d}", "1") for i in range(3)]
    owner = "<Owner><ID>o</ID><DisplayName>n</DisplayName></Owner><StorageClass>S</StorageClass>"
    rich = _page(keys).replace(b"</Contents>", owner.encode() + b"</Contents>")
    assert parse_page(rich, "b", "d/s", 3) is not None  # what AWS sends for 3 keys
    assert parse_page(rich, "b", "d/s", 2) is None  # (more keys than asked for)
    padded = rich.replace(b"</Contents>", b"<x/>" * (ELEMENTS_PER_KEY * 4) + b"</Contents>", 1)
    with pytest.raises(HostilePage, match="more elements"):
        parse_page(padded, "b", "d/s", 3)
    nested = rich.replace(b"<ID>o</ID>", b"<ID>" + b"<x>" * 5 + b"</x>" * 5 + b"</ID>", 1)
    with pytest.raises(HostilePage, match="nested more than"):
        parse_page(nested, "b", "d/s", 3)
    with pytest.raises(HostilePage, match="bytes"):
        parse_page(_page(keys) + b" " * PAGE_BYTES, "b", "d/s", 3)
    refuse_hostile_page({"status_code": 200, "body": rich})  # a page of the client's passes
    refuse_hostile_page({"status_code": 200, "body": b"not xml"})  # (botocore's to refuse)
