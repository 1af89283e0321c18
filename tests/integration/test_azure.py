"""What is Azure's own, against Azurite: the block blob sink (blocks staged while writing,
invisible until the one Put Block List; a small blob one Put Blob), a killed writer (no
visible blob; ``streamrec cleanup`` finds and discards its staged blocks), ``abfs://`` urls,
the command line on ``az://`` (ls, count, head, index, then ``ds.get`` by the sidecars), and
throttling answers (ServerBusy) retried.

The store contract, the injected faults and the writer's guarantees run on ``az://`` with the
other stores' (test_remote.py, test_writer_remote.py); reshard to and from Azure is in
test_reshard.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import streamrec
from streamrec.cli import main
from streamrec.errors import RetriesExhaustedError
from streamrec.format.framing import RecordEncoder
from streamrec.storage.retry import RetryPolicy
from support.azurite import AzuriteServer
from support.fault_proxy import FaultProxy

REPO = Path(__file__).resolve().parents[2]
FAST = RetryPolicy(max_attempts=4, initial_backoff_s=0.01, max_backoff_s=0.02, timeout_s=10)
PART = 8 << 10

KILLED_WRITER = """
import json, os, sys
import streamrec
w = streamrec.sync.open_writer(
    sys.argv[1], storage_options=json.loads(sys.argv[2]), part_bytes=8192, max_concurrency=1
)
w.__enter__()
w.write_many([b"k" * 1000] * 40)  # ~40 KB: blocks staged (one block in flight at a time)
os._exit(9)  # killed: no commit, no abort
"""


def _via(server: AzuriteServer, proxy: FaultProxy) -> dict[str, Any]:
    return {"connection_string": server.connection_string(proxy.url)}


async def test_blocks_are_staged_while_writing_and_invisible_until_the_commit(
    azure_server: AzuriteServer, azure_container: str, fault_proxy: Any
) -> None:
    proxy = fault_proxy(azure_server.server_url)
    big = [b"x" * 1000] * (5 * PART // 1016 + 3)  # just over 5 blocks
    w = streamrec.open_writer(
        f"az://{azure_container}/set/big-{{index}}",
        max_records=len(big) + 1,
        part_bytes=PART,
        max_concurrency=1,  # write() waits for the earlier block: it has been staged
        storage_options=_via(azure_server, proxy),
        retry=FAST,
    )
    await w.write_many(big)
    # five blocks staged, none committed: readers and listings see nothing yet
    assert proxy.count("PUT", "comp=block&") >= 4
    assert azure_server.list(azure_container) == []
    assert azure_server.uncommitted(azure_container) == ["set/big-0"]
    await w.write(b"last")  # the shard is full: committed in the background
    await w.write(b"small")  # the second shard: far smaller than one block
    await w.close()
    assert proxy.count("PUT", "comp=block&") == 6
    assert proxy.count("PUT", "comp=blocklist") == 1  # one commit: the big shard's
    small = [r for r in proxy.records if r.method == "PUT" and r.target.endswith("/set/big-1")]
    assert len(small) == 1  # a single Put Blob
    encoder = RecordEncoder()
    assert azure_server.get(azure_container, "set/big-0") == encoder.encode_many([*big, b"last"])
    assert azure_server.uncommitted(azure_container) == []
    # the manifest's versions are the ETags readers see
    manifest = json.loads(azure_server.get(azure_container, "set/_manifest.json"))
    versions = {shard["name"]: shard["version"] for shard in manifest["shards"]}
    assert versions == {
        name: azure_server.etag(azure_container, f"set/{name}") for name in ("big-0", "big-1")
    }


def test_a_killed_writer_leaves_no_visible_blob_and_cleanup_discards_its_blocks(
    azure_server: AzuriteServer, azure_container: str, capsys: pytest.CaptureFixture[str]
) -> None:
    options = json.dumps(azure_server.storage_options)
    azure_server.put(azure_container, "out/kept.tfrecord", b"committed")
    killed = subprocess.run(
        [
            sys.executable,
            "-c",
            KILLED_WRITER,
            f"az://{azure_container}/out/part-{{index}}",
            options,
        ],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        timeout=120,
    )
    assert killed.returncode == 9, killed.stderr
    assert azure_server.list(azure_container) == ["out/kept.tfrecord"]
    assert azure_server.uncommitted(azure_container) == ["out/part-0"]

    prefix = f"az://{azure_container}/out/"
    args = ["cleanup", prefix, "--older-than", "0", "--json", "--storage-options", options]
    assert main([*args, "--dry-run"]) == 0
    found = json.loads(capsys.readouterr().out)["leftovers"]
    assert [(f["url"], f["kind"]) for f in found] == [
        (f"az://{azure_container}/out/part-0", "uncommitted blocks")
    ]
    assert azure_server.uncommitted(azure_container) == ["out/part-0"]
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["removed"] == 1
    assert azure_server.uncommitted(azure_container) == []
    assert azure_server.list(azure_container) == ["out/kept.tfrecord"]


def test_abfs_urls_and_the_command_line(
    azure_server: AzuriteServer, azure_container: str, capsys: pytest.CaptureFixture[str]
) -> None:
    encoder = RecordEncoder()
    for k in range(3):
        records = [b"r%d-%d" % (k, i) for i in range(10 + k)]
        azure_server.put(azure_container, f"d/s-{k}.tfrecord", encoder.encode_many(records))
    glob = f"abfs://{azure_container}/d/s-*.tfrecord"
    ds = streamrec.open_dataset(glob, storage_options=azure_server.storage_options)
    assert len(list(ds)) == 33
    options = json.dumps(azure_server.storage_options)
    assert main(["ls", glob, "--json", "--storage-options", options]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [s["url"] for s in listed["shards"]] == [
        f"abfs://{azure_container}/d/s-{k}.tfrecord" for k in range(3)
    ]
    assert [s["version"] for s in listed["shards"]] == [
        azure_server.etag(azure_container, f"d/s-{k}.tfrecord") for k in range(3)
    ]
    az = f"az://{azure_container}/d/"
    assert main(["count", az, "--json", "--storage-options", options]) == 0
    assert json.loads(capsys.readouterr().out)["total_records"] == 33
    assert (
        main(["head", f"{az}s-2.tfrecord", "-n", "2", "--json", "--storage-options", options]) == 0
    )
    shown = json.loads(capsys.readouterr().out)["records"]
    assert [r["head_hex"] for r in shown] == [b"r2-0".hex(), b"r2-1".hex()]
    assert main(["index", az, "--json", "--storage-options", options]) == 0  # via the sink
    capsys.readouterr()
    assert azure_server.list(azure_container) == [
        "d/_dataset_index.bin",
        *(f"d/s-{k}.tfrecord{suffix}" for k in range(3) for suffix in ("", ".idx")),
    ]
    indexed = streamrec.open_dataset(az, storage_options=azure_server.storage_options)
    assert indexed.get([0, 32]) == [b"r0-0", b"r2-11"]  # by the dataset index
    indexed.close()


def test_server_busy_answers_are_retried_and_a_lasting_one_named(
    azure_server: AzuriteServer, azure_container: str, fault_proxy: Any
) -> None:
    payloads = [b"p%d" % i * 50 for i in range(500)]
    azure_server.put(azure_container, "busy.tfrecord", RecordEncoder().encode_many(payloads))
    proxy = fault_proxy(azure_server.server_url)
    url = f"az://{azure_container}/busy.tfrecor[d]"
    options = _via(azure_server, proxy)
    fault = proxy.status(500, method="GET", range_only=True, times=2)  # ServerBusy, HTTP 500
    ds = streamrec.open_dataset(url, storage_options=options, block_bytes=8192, retry=FAST)
    assert list(ds) == payloads
    assert fault.fired == 2 and ds.stats.retries >= 2
    proxy.clear()
    proxy.status(503, method="GET", range_only=True)
    ds = streamrec.open_dataset(url, storage_options=options, retry=FAST)
    with pytest.raises(RetriesExhaustedError, match=r"busy\.tfrecord.*HTTP 503: ServerBusy"):
        list(ds)


def test_cleanup_leaves_a_blob_committed_since_it_was_listed_and_takes_404_as_gone(
    azure_server: AzuriteServer,
    azure_container: str,
    fault_proxy: Any,
) -> None:
    for name in ("out/part-7", "out/part-8"):  # what killed writers left
        blob = azure_server.client.get_blob_client(azure_container, name)
        blob.stage_block("000000-killedwriterblock", b"s" * 1000)
    store_options = azure_server.storage_options
    proxy = fault_proxy(azure_server.server_url)
    # part-8 is committed by a writer between the listing and the delete (the HEAD sees it)
    proxy.status(404, method="DELETE", path="part-7", times=1)  # Azure proper: nothing to delete

    async def run() -> None:
        from streamrec.storage.leftovers import find_leftovers, remove_leftover
        from streamrec.storage.registry import open_store

        prefix = f"az://{azure_container}/out/"
        store = open_store(prefix, store_options)
        found = await find_leftovers(store, prefix)
        assert [f.url.rsplit("/", 1)[1] for f in found] == ["part-7", "part-8"]
        azure_server.put(azure_container, "out/part-8", b"finished")
        proxied = open_store(prefix, _via(azure_server, proxy))
        for leftover in found:
            await remove_leftover(proxied, leftover)
        await store.close()
        await proxied.close()

    asyncio.run(run())
    assert proxy.count("DELETE") == 1  # part-7's; part-8 was committed: left alone
    assert azure_server.list(azure_container) == ["out/part-8"]
    assert azure_server.get(azure_container, "out/part-8") == b"finished"
    assert azure_server.uncommitted(azure_container) == ["out/part-7"]  # for the service
