"""Hostile record index sidecars through the public API (issue 29, part B): what reading
one costs in memory (6, 7), records an index cannot invent (8), and the memory bound of
indexed reading with skewed record sizes (9). The sidecars are made inside the tests.

Memory is measured in a child process with ``tracemalloc`` (Python allocations, numpy's
included): the peak while the one call runs, so nothing else the test process holds counts.
"""

from __future__ import annotations

import subprocess
import sys
import zlib
from pathlib import Path

import pytest

import streamrec
from streamrec.errors import IndexMismatchError
from streamrec.format.framing import RecordEncoder
from streamrec.format.index.core import IndexBuilder
from streamrec.sync import open_writer

REPO = Path(__file__).resolve().parents[2]
MIB = 1 << 20

PEAK_OF = """
import sys, tracemalloc
import streamrec
from streamrec.errors import StreamrecError

ds = streamrec.open_dataset(sys.argv[1], prefetch_bytes=int(sys.argv[2]))
try:  # what a process does once (the local store's allocator settling) is not measured
    len(streamrec.open_dataset(sys.argv[1]))
except StreamrecError:
    pass
tracemalloc.start()
try:
    outcome = repr({call})
except StreamrecError as error:
    outcome = type(error).__name__ + ": " + str(error)
print(tracemalloc.get_traced_memory()[1])
print(outcome)
"""


def peak_of(call: str, url: str, prefetch_bytes: int = 64 * MIB) -> tuple[int, str]:
    """The peak of Python allocations while ``call`` (an expression of ``ds``) runs in a
    child, and what it returned or raised."""
    proc = subprocess.run(
        [sys.executable, "-c", PEAK_OF.format(call=call), url, str(prefetch_bytes)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    peak, outcome = proc.stdout.split("\n", 1)
    return int(peak), outcome.strip()


def test_counting_a_large_sidecar_takes_its_count_not_its_table(tmp_path: Path) -> None:
    """B.6: ``len(ds)`` of a shard of 400,000 records (a 5.5 MiB sidecar): one piece of the
    sidecar at a time, no table (the whole text parsed at once took ~30 bytes a byte)."""
    records = 400_000
    shard = tmp_path / "many.tfrecord"
    shard.write_bytes(RecordEncoder().encode_many([b""] * records))
    builder = IndexBuilder()
    builder.add_records([16] * records)
    sidecar = builder.build().to_bytes()
    Path(f"{shard}.idx").write_bytes(sidecar)
    peak, outcome = peak_of("len(ds)", str(shard))
    assert outcome == str(records)
    assert peak < 12 * MIB, (peak, len(sidecar))


def test_random_access_inflates_a_bounded_piece_of_what_an_index_claims(tmp_path: Path) -> None:
    """B.7: a gzip bomb (48 records of 1 MiB of zeros, ~50 KB stored) whose sidecar claims
    one record of everything: refused as a mismatch after a piece, not after inflating the
    claim (which cost the whole 48 MiB, twice, at once)."""
    url = str(tmp_path / "bomb.tfrecord.gz")
    with open_writer(url, compression="gzip", index=True) as writer:
        for _ in range(48):
            writer.write(bytes(MIB))
    claimed = 48 * (MIB + 16)
    Path(f"{url}.idx").write_bytes(b"0 %d 0 0\n" % claimed)
    peak, outcome = peak_of("ds.get([0])", url, prefetch_bytes=MIB)
    assert outcome.startswith("IndexMismatchError"), outcome
    assert peak < 12 * MIB, peak


def framed(payload: bytes) -> bytes:
    return RecordEncoder().encode_many([payload])


def smuggling_shard(directory: Path) -> tuple[str, bytes]:
    """A shard of two records, the first of whose payload holds a framed record (300 KiB of
    padding either side: range reads do not coalesce them), with an index that cuts that
    payload into records: [A's header + padding] [the embedded record] [padding + A's CRC]
    [C]. Its entries add up, start at 0 and end at the shard's size."""
    smuggled = b"not a record of this shard"
    pad = 300 << 10
    outer = b"p" * pad + framed(smuggled) + b"q" * pad
    shard = framed(outer) + framed(b"C" * 40)
    lengths = [12 + pad, len(framed(smuggled)), pad + 4, len(framed(b"C" * 40))]
    assert sum(lengths) == len(shard)
    url = str(directory / "smuggle.tfrecord")
    Path(url).write_bytes(shard)
    builder = IndexBuilder()
    builder.add_records(lengths)
    Path(f"{url}.idx").write_bytes(builder.build().to_bytes())
    return url, smuggled


def test_an_index_cannot_make_a_payload_a_record_by_random_access(tmp_path: Path) -> None:
    """B.8: ``get([1])`` refuses the record the index invents inside record 0's payload."""
    url, smuggled = smuggling_shard(tmp_path)
    ds = streamrec.open_dataset(url, block_bytes=256 << 10)
    with pytest.raises(IndexMismatchError, match="does not follow the shard's records") as caught:
        ds.get([1])
    assert caught.value.url == url and caught.value.offset == 0
    assert caught.value.record_index == 0 and smuggled.decode() not in str(caught.value)
    with pytest.raises(IndexMismatchError):  # and again: nothing was taken as verified
        ds.get([3])


def test_an_index_cannot_make_a_payload_a_record_in_indexed_reading(tmp_path: Path) -> None:
    """B.8: the consumer whose part is the invented record (even split over 4 hosts; global
    shuffle reads through the same spans) gets the error, not the payload's bytes."""
    url, _ = smuggling_shard(tmp_path)
    for kind in ({"even": "drop"}, {"shuffle": "global", "seed": 1}):
        for host in range(4):
            ds = streamrec.open_dataset(
                url, num_hosts=4, host_index=host, block_bytes=256 << 10, **kind
            )
            with pytest.raises(IndexMismatchError):
                list(ds)


def test_a_compressed_index_cannot_point_a_restart_into_a_payload(tmp_path: Path) -> None:
    """B.8: a gzip shard (stored blocks) whose one record's payload holds a raw deflate
    stream of a framed record; the index claims a second record at a "restart point" where
    that stream starts. Inflating from there gives a well framed record, which is not one of
    the shard's."""
    smuggled = b"smuggled through a restart point"
    deflate = zlib.compressobj(6, zlib.DEFLATED, -15)
    embedded = deflate.compress(framed(smuggled)) + deflate.flush()
    record = framed(b"a" * 100 + embedded + b"b" * 100)
    gzip = zlib.compressobj(0, zlib.DEFLATED, 31)  # stored: the payload's bytes as they are
    stored = gzip.compress(record) + gzip.flush()
    restart = stored.index(embedded)
    url = str(tmp_path / "restart.tfrecord.gz")
    Path(url).write_bytes(stored)
    Path(f"{url}.idx").write_bytes(
        b"0 %d 0 0\n%d %d %d 0\n" % (len(record), len(record), len(framed(smuggled)), restart)
    )
    ds = streamrec.open_dataset(url)
    with pytest.raises(IndexMismatchError) as caught:
        ds.get([1])
    assert caught.value.url == url
    # the index's first record is the shard's: the check is of the whole shard, at first use
    with pytest.raises(IndexMismatchError):
        ds.get([0])


def test_an_honest_compressed_index_is_verified_once(tmp_path: Path) -> None:
    url = str(tmp_path / "honest.tfrecord.gz")
    data = [bytes([k % 251]) * (3000 + k) for k in range(400)]
    with open_writer(url, compression="gzip", index=True) as writer:
        for payload in data:
            writer.write(payload)
    ds = streamrec.open_dataset(url)
    assert ds.get([399, 0, 200]) == [data[399], data[0], data[200]]
    before = ds.stats.bytes_fetched
    assert ds.stats.bytes_checked >= Path(url).stat().st_size  # the check read the shard
    assert ds.get([123]) == [data[123]]
    assert ds.stats.bytes_fetched - before < Path(url).stat().st_size  # no second check
