"""Storage options per scheme, and credentials kept out of states."""

from __future__ import annotations

import json

import pytest

import streamrec
from streamrec.errors import StorageError
from streamrec.storage.registry import options_for
from support.server_fixtures import HttpDir
from support.servers import MotoS3Server


def _shard(records: list[bytes]) -> bytes:
    with streamrec.sync.open_writer("memory://storage-options/one.tfrecord") as w:
        w.write_many(records)
    import fsspec

    data: bytes = fsspec.filesystem("memory").cat_file("/storage-options/one.tfrecord")
    return data


def test_a_list_mixing_s3_and_http_gives_each_store_its_own_options(
    s3_server: MotoS3Server, s3_bucket: str, http_dir: HttpDir
) -> None:
    first = [b"s3-%d" % i for i in range(20)]
    second = [b"http-%d" % i for i in range(30)]
    s3_server.put(s3_bucket, "a.tfrecord", _shard(first))
    http_url = http_dir.write("b.tfrecord", _shard(second))
    urls = [f"s3://{s3_bucket}/a.tfrecord", http_url]
    options = {"s3": s3_server.storage_options, "https": {"headers": {"X-Test": "1"}}}
    assert list(streamrec.open_dataset(urls, storage_options=options)) == first + second


def test_options_for_picks_the_scheme_or_its_alias_and_keeps_flat_options() -> None:
    per = {"s3": {"anon": True}, "gcs": {"token": "anon"}, "https": {"a": 1}}
    assert options_for("s3a://b/k", per) == {"anon": True}
    assert options_for("gs://b/k", per) == {"token": "anon"}
    assert options_for("http://h/k", per) == {"a": 1}
    assert options_for("memory://x", per) is None
    assert options_for("s3://b/k", {"anon": True}) == {"anon": True}


def test_options_mixing_scheme_and_option_keys_are_refused_at_open() -> None:
    with pytest.raises(ValueError, match="mix scheme keys"):
        streamrec.open_dataset("s3://b/k", storage_options={"s3": {}, "anon": True})


def test_credentials_in_a_url_stay_out_of_states_reprs_and_errors(http_dir: HttpDir) -> None:
    records = [b"r%d" % i for i in range(40)]
    url = http_dir.write("c.tfrecord", _shard(records))
    secret_url = url.replace("http://", "http://reader:s3cr3t-token@", 1)
    ds = streamrec.open_dataset(secret_url)
    it = iter(ds)
    head = [next(it) for _ in range(7)]
    state = ds.state_dict()
    it.close()  # type: ignore[attr-defined]
    assert "s3cr3t" not in json.dumps(state) and "s3cr3t" not in repr(ds)
    assert state["config"]["urls"] == [url.replace("http://", "http://***@", 1)]
    fresh = streamrec.open_dataset(secret_url)
    fresh.load_state_dict(json.loads(json.dumps(state)))
    assert head + list(fresh) == records
    with pytest.raises(StorageError) as caught:
        list(streamrec.open_dataset(secret_url.replace("c.tfrecord", "missing.tfrecord")))
    assert "s3cr3t" not in str(caught.value) and "***@" in str(caught.value)
