"""Credentials in urls never leave in text: user-info and the query parameters of signed urls
(presigned S3, Azure SAS, GCS signed urls), in errors, reprs and state fingerprints."""

from __future__ import annotations

import pytest

from streamrec.errors import StorageError
from streamrec.pipeline.listing.plan import shards_digest
from streamrec.redact import redact
from streamrec.storage.base import ObjectInfo
from streamrec.storage.s3.settings import DoorSettings

PRESIGNED = (
    "https://b.s3.amazonaws.com/k.tfrecord?X-Amz-Algorithm=AWS4-HMAC-SHA256"
    "&X-Amz-Credential=AKIASECRETID%2F20261127%2Fus-east-1%2Fs3%2Faws4_request"
    "&X-Amz-Date=20261127T000000Z&X-Amz-Expires=3600&X-Amz-SignedHeaders=host"
    "&X-Amz-Security-Token=SESSIONTOKEN&X-Amz-Signature=deadbeefsig"
)
SAS = "https://acct.blob.core.windows.net/c/k.tfrecord?sv=2022-11-02&se=2026-12-01&sr=b&sp=r&sig=SASSIG%3D"
GCS = (
    "https://storage.googleapis.com/b/k.tfrecord?X-Goog-Algorithm=GOOG4-RSA-SHA256"
    "&X-Goog-Credential=svc%40proj.iam.gserviceaccount.com%2F20261127&X-Goog-Expires=600"
    "&X-Goog-SignedHeaders=host&X-Goog-Signature=GOOGSIG"
)
SECRETS = ("AKIASECRETID", "SESSIONTOKEN", "deadbeefsig", "SASSIG", "svc%40proj", "GOOGSIG")


@pytest.mark.parametrize("url", [PRESIGNED, SAS, GCS])
def test_signed_urls_lose_their_signatures_and_tokens(url: str) -> None:
    text = redact(f"{url}: reading bytes 0-9 failed with HTTP 403")
    assert not any(secret in text for secret in SECRETS), text
    assert "***" in text
    assert text.split("?")[0] == url.split("?")[0]  # the object is still named


def test_what_is_not_a_credential_stays() -> None:
    url = "https://h/x.tfrecord?X-Amz-Expires=3600&design=1&sign=2&sigma=3"
    assert redact(url) == url
    assert redact("a quoted 'https://h/x?sig=abc' url") == "a quoted 'https://h/x?sig=***' url"
    assert redact("https://u:p@h/x?SIG=1#f") == "https://***@h/x?SIG=***#f"


def test_two_signatures_of_one_object_redact_alike() -> None:
    other = PRESIGNED.replace("deadbeefsig", "cafef00d").replace("SESSIONTOKEN", "NEWTOKEN")
    assert redact(other) == redact(PRESIGNED)


def test_storage_errors_carry_no_signature() -> None:
    error = StorageError(f"{SAS}: reading bytes 0-9 failed with HTTP 403")
    assert "SASSIG" not in str(error)


def test_reprs_show_no_secret() -> None:
    listing = DoorSettings(
        "http://127.0.0.1:9000",
        "us-east-1",
        ("AKID", "SECRETKEY", "TOK"),
        5,
        15,
        params={"SSECustomerKey": "SECRETKEY"},
    )
    assert "SECRETKEY" not in repr(listing) and "TOK" not in repr(listing)
    info = ObjectInfo(PRESIGNED, 10, '"etag"')
    assert not any(secret in repr(info) for secret in SECRETS), repr(info)
    assert "size=10" in repr(info)


def test_a_state_fingerprint_is_the_same_for_freshly_signed_urls() -> None:
    fresh = (
        PRESIGNED.replace("deadbeefsig", "cafef00d")
        .replace("20261127T000000Z", "20261128T093000Z")  # signed again a day later
        .replace("X-Amz-Expires=3600", "X-Amz-Expires=600")
    )
    assert shards_digest([ObjectInfo(PRESIGNED, 10, "e")]) == shards_digest(
        [ObjectInfo(fresh, 10, "e")]
    )
    assert shards_digest([ObjectInfo(PRESIGNED, 10, "e")]) != shards_digest(
        [ObjectInfo(fresh, 11, "e")]
    )


def test_options_that_hold_storage_options_show_none_of_them() -> None:
    from streamrec.pipeline.options import ReadOptions
    from streamrec.reshard.task import TaskOptions

    secret = {"key": "AKID", "secret": "S3SECRETKEY", "token": "S3TOKEN"}
    for options in (
        ReadOptions(storage_options=secret),
        TaskOptions(
            "s3://b/o-{index}", None, src_storage_options=secret, dst_storage_options=secret
        ),
    ):
        assert "S3SECRETKEY" not in repr(options) and "S3TOKEN" not in repr(options), repr(options)


def test_states_named_by_the_earlier_digest_still_load() -> None:
    """shards_digest_v2 (redacted urls with their date) is what states saved before
    2026-11-27 hold; the engines accept it, and it equals the new digest for plain urls."""
    from streamrec.pipeline.listing.plan import shards_digest_v2

    plain = [ObjectInfo("s3://b/k.tfrecord", 10, "e")]
    assert shards_digest_v2(plain, 1, 0) == shards_digest(plain, 1, 0)
    signed = [ObjectInfo(PRESIGNED, 10, "e")]
    assert shards_digest_v2(signed) != shards_digest(signed)
    assert "SESSIONTOKEN" not in shards_digest_v2(signed)
