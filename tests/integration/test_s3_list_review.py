"""Review of 894dfe0: a stalled early page holds the glob far past the client's own read
timeout (s3fs's 15 s), with the store's default options. Fails on 894dfe0 (~30 s)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

from streamrec.format.framing import RecordEncoder
from streamrec.storage.s3 import S3Store
from support.fault_proxy import FaultProxy
from support.servers import MotoS3Server


@pytest.fixture
def proxy(s3_server: MotoS3Server) -> Iterator[FaultProxy]:
    port = int(s3_server.endpoint_url.rsplit(":", 1)[1])
    with FaultProxy("127.0.0.1", port) as started:
        yield started


def test_a_stalled_early_page_costs_no_more_than_the_clients_read_timeout(
    s3_server: MotoS3Server, s3_bucket: str, proxy: FaultProxy
) -> None:
    s3_server.put(s3_bucket, "e/a.tfrecord", RecordEncoder().encode_many([b"x"]))
    options: dict[str, Any] = {
        "key": "k",
        "secret": "s",
        "client_kwargs": {"endpoint_url": proxy.url},
    }
    proxy.stall(30, path="list-type", times=1)

    async def run() -> tuple[list[str], float, float]:
        store = S3Store(options)
        try:
            read_timeout = store.fs._prepare_config_kwargs()["read_timeout"]  # s3fs: 15
            pages = store.glob_pages(f"s3://{s3_bucket}/e/*.tfrecord")
            assert pages is not None
            started = time.monotonic()
            listed = [o.url async for page in pages for o in page]
            return listed, time.monotonic() - started, read_timeout
        finally:
            await store.close()

    listed, elapsed, read_timeout = asyncio.run(run())
    assert listed == [f"s3://{s3_bucket}/e/a.tfrecord"]
    # the client alone would have given up on the stalled request after read_timeout
    assert elapsed < read_timeout + 5
