"""streamrec's SigV4 signer gives, header for header, what botocore's ``S3SigV4Auth`` gives
for the same GET at the same moment (the requests streamrec sends: Range, If-Match, with or
without a session token, any host form and key spelling)."""

from __future__ import annotations

import datetime
from typing import Any

import botocore.auth
import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from streamrec.storage.s3.sigv4 import SigV4Signer

MOMENTS = [
    datetime.datetime(2026, 11, 24, 23, 59, 59, tzinfo=datetime.timezone.utc),
    datetime.datetime(2026, 11, 25, 0, 0, 1, tzinfo=datetime.timezone.utc),  # the next day
]
URLS = [
    "https://bucket.s3.amazonaws.com/train/shard-00001.tfrecord",
    "https://s3.eu-west-1.amazonaws.com/bucket/a%20key/with~odd%2Bchars%3D.tfrecord",
    "http://127.0.0.1:8433/bench/100KiB/shard-00001.tfrecord",
    "https://S3.Example.COM:443/bucket/key",  # default port, upper case host
    "http://[::1]:9000/bucket/key",
    "http://localhost:80/bucket/k",
]
HEADERS: list[dict[str, str]] = [
    {"Range": "bytes=0-262143"},
    {"Range": "bytes=262144-786431", "If-Match": '"5d41402abc4b2a76b9719d911017c592"'},
    {"Range": "bytes=1-2", "If-Match": '"a  b"'},  # inner whitespace, trimmed when signed
]


def botocore_headers(
    monkeypatch: pytest.MonkeyPatch,
    url: str,
    headers: dict[str, str],
    credentials: Credentials,
    region: str,
    moment: datetime.datetime,
) -> dict[str, str]:
    naive = moment.replace(tzinfo=None)  # botocore's clock: utcnow()
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda: naive)
    request = AWSRequest("GET", url, dict(headers))
    S3SigV4Auth(credentials.get_frozen_credentials(), "s3", region).add_auth(request)
    return dict(request.prepare().headers.items())


@pytest.mark.parametrize("moment", MOMENTS)
@pytest.mark.parametrize("url", URLS)
@pytest.mark.parametrize("headers", HEADERS)
@pytest.mark.parametrize("token", [None, "FwoGZXIvYXdzEJr//////////token=="])
def test_the_signature_is_botocores(
    monkeypatch: pytest.MonkeyPatch,
    moment: datetime.datetime,
    url: str,
    headers: dict[str, str],
    token: str | None,
) -> None:
    credentials = Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", token)
    want = botocore_headers(monkeypatch, url, headers, credentials, "eu-west-1", moment)
    signer = SigV4Signer("eu-west-1", "s3")
    got = signer.sign_get(url, headers, "AKIDEXAMPLE", credentials.secret_key, token, moment)
    assert got == want
    # again from the signer's kept key and url parts: the same
    again = signer.sign_get(url, headers, "AKIDEXAMPLE", credentials.secret_key, token, moment)
    assert again == want


def test_a_new_secret_or_day_derives_a_new_key(monkeypatch: pytest.MonkeyPatch) -> None:
    signer = SigV4Signer("us-east-1", "s3")
    url, headers = URLS[0], HEADERS[0]
    seen: set[str] = set()
    for secret in ("secret-one", "secret-two"):
        for moment in MOMENTS:
            credentials = Credentials("AKID", secret)
            want: dict[str, Any] = botocore_headers(
                monkeypatch, url, headers, credentials, "us-east-1", moment
            )
            got = signer.sign_get(url, headers, "AKID", secret, None, moment)
            assert got == want
            seen.add(got["Authorization"])
    assert len(seen) == 4
