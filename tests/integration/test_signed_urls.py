"""Signed http(s) urls (presigned S3, Azure SAS, GCS signed urls): their signatures are never
persisted in a checkpoint nor shown in an error, and a checkpoint taken through them resumes
through freshly signed urls of the same objects."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import streamrec
from streamrec.errors import StorageError
from support.resume import payload, resume_rest, stop_after, write_shards
from support.server_fixtures import HttpDir


def _signed(url: str, signature: str) -> str:
    return (
        f"{url}?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIDSECRET%2F20261127"
        f"&X-Amz-Security-Token=TOKEN{signature}&X-Amz-Signature={signature}"
    )


def test_a_state_taken_through_signed_urls_holds_no_signature_and_resumes_with_new_ones(
    http_dir: HttpDir,
) -> None:
    paths = write_shards(http_dir.path, [5, 7])
    urls = [f"{http_dir.url}/{Path(p).name}" for p in paths]
    first = streamrec.open_dataset([_signed(u, "oldsig123") for u in urls])
    taken, state = stop_after(first, 1, 4)
    text = json.dumps(state)
    assert "oldsig123" not in text and "AKIDSECRET" not in text, text
    assert "oldsig123" not in repr(first)
    rest = resume_rest(
        lambda: streamrec.open_dataset([_signed(u, "newsig456") for u in urls]), state, 1
    )
    expected = [payload(s, i) for s, n in enumerate([5, 7]) for i in range(n)]
    assert sorted(taken + rest) == sorted(expected)
    assert len(taken + rest) == len(expected)


def test_an_error_names_a_signed_url_without_its_signature(http_dir: HttpDir) -> None:
    url = _signed(f"{http_dir.url}/missing.tfrecord", "oldsig123")
    with pytest.raises(StorageError) as caught:
        list(streamrec.open_dataset([url]))
    message = str(caught.value)
    assert "missing.tfrecord" in message
    assert "oldsig123" not in message and "AKIDSECRET" not in message, message
