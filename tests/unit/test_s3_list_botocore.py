"""The S3 door (storage/s3/door.py, settings.py, listing.py) against botocore itself: pages
its own parser returns, the urls it sends, the settings that change its url, timeouts or TLS
trust (from the adversarial review of the first version, each of which failed on it)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from streamrec.storage.s3.listing import list_query, parse_page
from streamrec.storage.s3.settings import DoorSettings, door_settings

ENDPOINT = "http://127.0.0.1:9000"
BASE = {"key": "k", "secret": "s", "client_kwargs": {"endpoint_url": ENDPOINT}}


class _Raw:
    def __init__(self, body: bytes) -> None:
        self._body = body

    def stream(self, **_: Any) -> Any:
        return iter([self._body])


def _botocore_page(body: bytes, bucket: str, prefix: str, max_keys: int) -> Any:
    """What botocore's list_objects_v2 returns for ``body`` (a 200), or the exception it raises."""
    from botocore.awsrequest import AWSResponse

    client = _client(ENDPOINT)

    def answer(request: Any, **_: Any) -> Any:
        return AWSResponse(request.url, 200, {"Content-Type": "application/xml"}, _Raw(body))

    client.meta.events.register("before-send", answer)
    try:
        return client.list_objects_v2(Bucket=bucket, Prefix=prefix, Delimiter="/", MaxKeys=max_keys)
    except Exception as exc:  # what the user would see (through the client)
        return exc


def _simplified(page: Any) -> Any:
    if isinstance(page, Exception) or page is None:
        return type(page).__name__
    return (
        [(c.get("Key"), c.get("Size"), c.get("ETag") or None) for c in page.get("Contents", [])],
        bool(page.get("IsTruncated")),
        page.get("NextContinuationToken") or None,
    )


_NS = b'<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
_ITEM = b"<Contents><Key>%s</Key><ETag>&quot;e&quot;</ETag><Size>1</Size></Contents>"

ADVERSARIAL = {
    # IsTruncated twice: the early page takes the last, botocore's parser a list (-> False)
    "duplicate IsTruncated": b"<?xml version='1.0' encoding='UTF-8'?>"
    + _NS
    + b"<Name>b</Name><Prefix>d%2F</Prefix><EncodingType>url</EncodingType>"
    + b"<IsTruncated>false</IsTruncated><IsTruncated>true</IsTruncated>"
    + b"<NextContinuationToken>t</NextContinuationToken>"
    + _ITEM % b"d%2Fa"
    + b"</ListBucketResult>",
    # EncodingType twice: the early page decodes the keys, botocore does not
    "duplicate EncodingType": b"<?xml version='1.0' encoding='UTF-8'?>"
    + _NS
    + b"<Name>b</Name><Prefix>d/</Prefix><EncodingType>x</EncodingType>"
    + b"<EncodingType>url</EncodingType><IsTruncated>false</IsTruncated>"
    + _ITEM % b"d/a%20b"
    + b"</ListBucketResult>",
    # a declared encoding: botocore parses every body as UTF-8 (XMLParser(encoding='utf-8')),
    # ElementTree.fromstring follows the declaration
    "latin-1 declaration": b"<?xml version='1.0' encoding='ISO-8859-1'?>"
    + _NS
    + b"<Name>b</Name><Prefix>d/</Prefix><IsTruncated>false</IsTruncated>"
    + _ITEM % "d/\u00e9".encode()
    + b"</ListBucketResult>",
}


@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
def test_a_page_the_early_path_accepts_is_the_page_botocore_returns(name: str) -> None:
    body = ADVERSARIAL[name]
    early = parse_page(body, "b", "d/", 10)
    if early is None:
        return  # refused: listed through the client, as before
    assert _simplified(early) == _simplified(_botocore_page(body, "b", "d/", 10))


def test_a_utf16_body_gets_past_the_doctype_and_entity_guard() -> None:
    """parse_page refuses ``<!DOCTYPE``/``<!ENTITY`` by a byte search, which a UTF-16 body
    (parsed by ElementTree.fromstring, which follows its BOM/declaration) does not contain:
    the entities are expanded (up to expat's amplification limit: 100x the body beyond
    8 MiB, i.e. ~1.6 GB for a 16 MiB body). botocore parses as UTF-8 and refuses it."""
    text = (
        '<?xml version="1.0" encoding="UTF-16"?>'
        '<!DOCTYPE x [<!ENTITY n "b"><!ENTITY k "d/a">]>'
        "<ListBucketResult><Name>&n;</Name><Prefix>d/</Prefix>"
        "<IsTruncated>false</IsTruncated>"
        "<Contents><Key>&k;</Key><Size>1</Size></Contents></ListBucketResult>"
    )
    body = text.encode("utf-16")
    assert b"<!DOCTYPE" not in body and b"<!ENTITY" not in body
    assert parse_page(body, "b", "d/", 10) is None


def test_the_early_timeouts_are_the_clients(monkeypatch: pytest.MonkeyPatch) -> None:
    """s3fs gives the client connect_timeout=5, read_timeout=15 unless config_kwargs say
    otherwise; the early page waits 60 s (x2 for the read: checked every read_timeout) on a
    blackholed or stalled endpoint before the client's listing even starts."""
    from streamrec.storage.s3.store import S3Store

    store = S3Store(BASE)
    listing = store.door_settings
    assert listing is not None
    config = store.fs._prepare_config_kwargs()
    assert (listing.connect_timeout_s, listing.read_timeout_s) == (
        config["connect_timeout"],
        config["read_timeout"],
    )


def _client(endpoint: str | None, region: str = "us-east-1") -> Any:
    import botocore.session

    return botocore.session.get_session().create_client(
        "s3",
        endpoint_url=endpoint,
        region_name=region,
        aws_access_key_id="k",
        aws_secret_access_key="s",
    )


class _Sent(Exception):
    pass


def _sent(client: Any, call: Any) -> str:
    """The url botocore sends for ``call(client)`` (captured before it is sent)."""
    urls: list[str] = []

    def capture(request: Any, **_: Any) -> None:
        urls.append(request.url)
        raise _Sent

    client.meta.events.register("before-send", capture)
    with pytest.raises(_Sent):
        call(client)
    return urls[-1]


def _botocore_url(
    endpoint: str | None, bucket: str = "my-bucket", prefix: str = "d/s", region: str = "us-east-1"
) -> str:
    """The url botocore sends for a ``ListObjectsV2`` page (7 keys, ``/`` as delimiter)."""
    return _sent(
        _client(endpoint, region),
        lambda c: c.list_objects_v2(Bucket=bucket, Prefix=prefix, Delimiter="/", MaxKeys=7),
    )


@pytest.mark.parametrize("region", ["us-east-1", "eu-west-1", "us-gov-west-1", "ap-south-2"])
@pytest.mark.parametrize("bucket", ["my-bucket", "b12", "my.dotted.bucket", "Upper_Case", "a--b"])
def test_aws_urls_are_the_ones_botocore_sends(
    region: str, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Virtual-hosted for DNS-compatible names without dots, path-style otherwise, regional
    hosts: the url of a GET and of a listing page, as botocore's endpoint rules build them."""
    no_config = os.path.join(os.sep, "nonexistent", "aws-config")
    monkeypatch.setenv("AWS_CONFIG_FILE", no_config)
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    settings = door_settings({"key": "k", "secret": "s"}, {"AWS_CONFIG_FILE": no_config})
    assert isinstance(settings, DoorSettings) and settings.endpoint is None
    key = "d ir/é+%&=~_x-.y/shard-0"
    get = _sent(
        _client(None, region), lambda c: c.get_object(Bucket=bucket, Key=key, Range="bytes=0-1")
    )
    assert settings.object_url(bucket, key, region) == get
    query = list_query("d/s", "/", 7)
    assert settings.list_url(bucket, region, query) == _botocore_url(None, bucket, "d/s", region)


def test_the_url_is_the_one_botocore_sends() -> None:
    no_config = {"AWS_CONFIG_FILE": os.path.join(os.sep, "nonexistent", "aws-config")}
    for endpoint in (ENDPOINT, "https://s3.example.com", "http://[::1]:9000", "http://Host:80"):
        prefix = "d ir/é+%&=?#~_x-.y/shard-"
        options = {**BASE, "client_kwargs": {"endpoint_url": endpoint}}
        listing = door_settings(options, no_config)
        assert listing is not None
        sent = _botocore_url(endpoint, "my.b-1", prefix)
        assert listing.list_url("my.b-1", "us-east-1", list_query(prefix, "/", 7)) == sent


def test_a_config_file_addressing_style_is_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``~/.aws/config`` (or AWS_CONFIG_FILE) ``s3 = addressing_style = virtual``: botocore
    sends the LIST to ``my-bucket.<endpoint host>``, the early page to ``<endpoint
    host>/my-bucket`` - another host answering for the same bucket name."""
    config = tmp_path / "config"
    config.write_text("[default]\ns3 =\n    addressing_style = virtual\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    endpoint = "https://s3.example.com"
    sent = _botocore_url(endpoint)
    assert sent.startswith("https://my-bucket.s3.example.com/")  # botocore: virtual-hosted
    options = {**BASE, "client_kwargs": {"endpoint_url": endpoint}}
    listing = door_settings(options, os.environ)
    query = list_query("d/s", "/", 7)
    assert listing is None or listing.list_url("my-bucket", "us-east-1", query) == sent


def test_the_early_tls_context_verifies_as_the_client_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """AWS_CA_BUNDLE (or a config file's ca_bundle) is the client's ``verify``; the direct
    requests' context was built for ``verify=True`` (fs.session is still None when they
    resolve it): the system/certifi CAs, not the bundle the user pinned."""
    import certifi

    import streamrec.storage.s3.store as s3
    from streamrec._portal import cancel_and_wait

    bundle = tmp_path / "ca.pem"
    bundle.write_bytes(Path(certifi.where()).read_bytes())
    monkeypatch.setenv("AWS_CA_BUNDLE", str(bundle))
    seen: list[Any] = []
    real = s3.start_tls_context

    def spying(verify: Any) -> Any:
        seen.append(verify)
        return real(verify)

    monkeypatch.setattr(s3, "start_tls_context", spying)

    async def run() -> None:
        store = s3.S3Store({**BASE, "client_kwargs": {"endpoint_url": "https://127.0.0.1:9"}})
        try:
            pages = store.glob_pages("s3://b/d/*")
            assert pages is not None
            await pages.aclose()  # (never started: no request)
            listing = asyncio.ensure_future(store._list_page("s3://b/d/*", "b", "d/", None, 0))
            await asyncio.sleep(0)  # (its TLS context asked for: the request waits for it)
            await cancel_and_wait([listing])
        finally:
            await store.close()

    asyncio.run(run())
    assert seen == [str(bundle)]


@pytest.mark.parametrize(
    "conf",
    [
        {"anon": True},  # s3fs then sends unsigned; the early page signs with key/secret
        {"profile": "other"},  # the profile's settings (addressing style, credentials...)
    ],
)
def test_fsspec_config_options_are_seen(
    conf: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """fsspec's config (FSSPEC_S3_* env vars, ~/.config/fsspec/*.json) adds defaults to the
    S3FileSystem's kwargs (fsspec.config.apply_config in _Cached.__call__); early_listing
    only looks at the storage_options S3Store was given."""
    import fsspec.config

    from streamrec.storage.s3.store import S3Store

    monkeypatch.setitem(fsspec.config.conf, "s3", conf)
    store = S3Store(BASE)
    for name, value in conf.items():
        assert getattr(store.fs, name, None) == value or store.fs.kwargs.get(name) == value
    listing = store.door_settings
    if "anon" in conf:
        assert listing is None or listing.credentials == "anon"
    else:
        assert listing is None or listing.profile == "other"


@pytest.mark.parametrize(
    ("config", "environ", "client_region"),
    [
        ("", {}, None),
        ("[default]\nregion = eu-west-1\n", {}, None),
        (
            "[default]\nregion = eu-west-1\n[profile other]\nregion = ap-south-1\n",
            {"AWS_PROFILE": "other"},
            None,
        ),
        ("[profile other]\nregion = ap-south-1\n", {"AWS_DEFAULT_PROFILE": "other"}, None),
        ("[default]\nregion = eu-west-1\n", {"AWS_DEFAULT_REGION": "us-west-2"}, None),
        ("[default]\nregion = eu-west-1\n", {}, "ca-central-1"),
    ],
)
def test_the_signing_region_is_the_clients(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    config: str,
    environ: dict[str, str],
    client_region: str | None,
) -> None:
    """The region the direct requests sign with is the one botocore's client resolves: the
    client's ``region_name``, ``AWS_DEFAULT_REGION``, the config file's profile, us-east-1
    (the review of the door: the profile's region was not read)."""
    import botocore.session

    path = tmp_path / "config"
    path.write_text(config)
    for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_DEFAULT_REGION", "AWS_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(path))
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    client_kwargs: dict[str, Any] = {"endpoint_url": ENDPOINT}
    if client_region is not None:
        client_kwargs["region_name"] = client_region
    client = botocore.session.Session().create_client(
        "s3", aws_access_key_id="k", aws_secret_access_key="s", **client_kwargs
    )
    listing = door_settings({**BASE, "client_kwargs": client_kwargs}, os.environ)
    assert listing is not None
    assert listing.region == client.meta.region_name
