"""ds.stats splits time by stage, report() names the bottleneck, stats_interval_s logs JSON
lines and streamrec.interop.prometheus exports the counters."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest

import streamrec
from streamrec.errors import ArgumentError
from streamrec.example import FixedLenFeature, encode
from streamrec.interop.prometheus import to_prometheus
from streamrec.pipeline.stats import Stats
from streamrec.pipeline.stats_report import verdict

RECORDS = 600
SPEC = {"n": FixedLenFeature(np.int64)}


@pytest.fixture
def shards(tmp_path: Path) -> str:
    for shard in range(3):
        path = tmp_path / f"part-{shard}.tfrecord"
        with streamrec.sync.open_writer(str(path), index=True) as writer:
            writer.write_many([encode({"n": shard * 200 + i}) for i in range(200)])
    return str(tmp_path / "part-*.tfrecord")


def test_an_iteration_is_split_by_stage(shards: str) -> None:
    ds = streamrec.open_dataset(shards, block_bytes=4096)
    got = [int(n) for batch in ds.parse(SPEC).batch(64) for n in batch["n"]]
    assert got == list(range(RECORDS))
    stats = ds.stats
    assert stats.records == RECORDS
    assert stats.requests >= 3  # at least one read per shard, each timed
    assert stats.storage_s > 0 and stats.framing_s > 0 and stats.parse_s > 0
    assert stats.listing_s > 0
    assert stats.iterate_s >= stats.wait_s > 0
    report = stats.report()
    assert f"{RECORDS:,} records" in report and "storage reads" in report
    assert report.splitlines()[-1].startswith("bottleneck: ")
    assert "block_bytes" in stats.settings and "settings" not in stats.as_dict()


def test_reads_by_index_are_counted(shards: str) -> None:
    ds = streamrec.open_dataset(shards)
    assert len(ds.get([5, 250, 599])) == 3
    assert ds.stats.requests >= 3 and ds.stats.storage_s > 0 and ds.stats.framing_s > 0
    ds.close()


def stats_of(**values: float) -> Stats:
    stats = Stats()
    for name, value in values.items():
        setattr(stats, name, value)
    return stats


def test_the_verdict_names_the_bottleneck() -> None:
    settings = {"max_concurrency": 16, "block_bytes": 4 << 20}
    loop = stats_of(iterate_s=10, wait_s=1)
    assert verdict(loop.as_dict(), settings).startswith("your loop: ")
    storage = stats_of(iterate_s=10, wait_s=7, framing_s=1, parse_s=0.5)
    said = verdict(storage.as_dict(), settings)
    assert said.startswith("storage: ") and "75%" in said and "16 reads of 4.0 MiB" in said
    cpu = stats_of(iterate_s=10, wait_s=3, framing_s=2, parse_s=4)
    assert verdict(cpu.as_dict(), settings).startswith("CPU: ")
    assert verdict(Stats().as_dict(), {}).startswith("nothing iterated yet")


def test_the_verdict_tells_latency_from_bandwidth() -> None:
    settings = {"max_concurrency": 16, "block_bytes": 4 << 20}
    waited = {"iterate_s": 10, "wait_s": 7, "framing_s": 1, "requests": 100}
    latency = stats_of(**waited, storage_s=40, first_byte_s=30, bytes_fetched=400 << 20)
    said = verdict(latency.as_dict(), settings)
    assert said.startswith("storage: ") and "(75%) is waiting for the first byte" in said
    assert "raise max_concurrency (now 16 reads of 4.0 MiB)" in said
    transfer = stats_of(**waited, storage_s=40, first_byte_s=4, bytes_fetched=400 << 20)
    said = verdict(transfer.as_dict(), settings)
    assert said.startswith("transfer: ") and "(90%) is moving bytes (40.0 MiB/s)" in said
    assert "raise block_bytes" in said and "link is full" in said
    report = transfer.report(settings)
    assert "until the first byte" in report and "36.00 s" in report  # the transfer row
    # local files: no first byte timed, the advice names both settings
    local = stats_of(**waited, storage_s=40)
    said = verdict(local.as_dict(), settings)
    assert said.startswith("storage: ") and "max_concurrency or block_bytes" in said
    assert "until the first byte" not in local.report(settings)


def test_requests_by_kind_and_inflating_are_rows_of_the_report() -> None:
    stats = stats_of(
        iterate_s=2, requests=7, list_requests=3, metadata_requests=2, framing_s=1.5, inflate_s=1
    )
    report = stats.report()
    assert "requests: 7 shard reads, 3 listing pages, 2 metadata reads" in report
    rows = {line[:28].strip(): line[28:].split()[0] for line in report.splitlines()[1:]}
    assert rows["framing, CRC"] == "0.50" and rows["inflate"] == "1.00"
    assert "framing, CRC, inflate" in stats_of(iterate_s=2, framing_s=1.5).report()


def test_inflating_is_timed_apart(tmp_path: Path, shards: str) -> None:
    path = tmp_path / "part-0.tfrecord.gz"
    with streamrec.sync.open_writer(str(path), compression="gzip") as writer:
        writer.write_many([encode({"n": i}) for i in range(2000)])
    ds = streamrec.open_dataset(str(path))
    assert len([record for record in ds]) == 2000
    assert 0 < ds.stats.inflate_s <= ds.stats.framing_s
    plain = streamrec.open_dataset(shards)
    assert len([record for record in plain]) == RECORDS
    assert plain.stats.inflate_s == 0 < plain.stats.framing_s  # (stored: nothing inflated)


def test_json_lines_at_the_interval_and_at_the_end(
    shards: str, caplog: pytest.LogCaptureFixture
) -> None:
    ds = streamrec.open_dataset(shards, stats_interval_s=0.001, block_bytes=4096)
    with caplog.at_level(logging.INFO, logger="streamrec.stats"):
        for count, _ in enumerate(ds):
            if count % 50 == 0:
                time.sleep(0.002)  # time passes between pieces (3 shards: 3 pieces at least)
    assert count + 1 == RECORDS
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "streamrec.stats"]
    assert len(lines) >= 2  # one while reading, one at the end
    assert lines[-1]["records_read"] == RECORDS and "settings" not in lines[-1]
    with pytest.raises(ArgumentError, match="stats_interval_s"):
        streamrec.open_dataset(shards, stats_interval_s=0)


def test_prometheus_export(shards: str) -> None:
    ds = streamrec.open_dataset(shards)
    registry = CollectorRegistry()
    to_prometheus(ds, registry, labels={"job": "train"})
    assert len(list(ds)) == RECORDS
    text = generate_latest(registry).decode()
    assert f'streamrec_records_total{{job="train"}} {float(RECORDS)}' in text
    assert 'streamrec_seconds_total{job="train",stage="storage"}' in text
    assert 'streamrec_bytes_total{job="train",kind="read"}' in text
    assert 'streamrec_list_requests_total{job="train"} 0.0' in text  # (local files)
    assert 'streamrec_metadata_requests_total{job="train"}' in text
    for stage in ("first_byte", "inflate"):
        assert f'streamrec_seconds_total{{job="train",stage="{stage}"}} 0.0' in text


def test_a_mix_keeps_its_own_clock_and_parse_time(shards: str) -> None:
    a = streamrec.open_dataset(shards)
    b = streamrec.open_dataset(shards)
    mixed = streamrec.mix([a, b], stop="all")
    started = time.perf_counter()
    got = sum(len(batch["n"]) for batch in mixed.parse(SPEC).batch(100))
    wall = time.perf_counter() - started
    assert got == 2 * RECORDS
    stats = mixed.stats
    assert stats.parse_s > 0  # added to the mix's own counters, not to a sum made when asked
    assert 0 < stats.iterate_s <= wall
    assert stats.settings == a.stats.settings


def test_reads_by_index_time_their_waits_under_transforms(shards: str) -> None:
    ds = streamrec.open_dataset(shards, shuffle="global")
    assert sum(len(batch["n"]) for batch in ds.parse(SPEC).batch(50)) == RECORDS
    assert ds.stats.wait_s > 0 and ds.stats.iterate_s >= ds.stats.wait_s


def test_an_iteration_closed_early_counts_up_to_its_close(shards: str) -> None:
    ds = streamrec.open_dataset(shards)
    iterator = iter(ds)
    next(iterator)
    time.sleep(0.05)  # the consumer's own time with its first record, then it stops
    iterator.close()  # type: ignore[attr-defined]
    assert ds.stats.iterate_s >= 0.05
