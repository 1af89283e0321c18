"""Hostile record index sidecars through the public API (issue 29, part B): what reading
one costs in memory (6, 7), records an index cannot invent (8), and the memory bound of
indexed reading with skewed record sizes (9). The sidecars are made inside the tests.

Memory is measured in a child process with ``tracemalloc`` (Python allocations, numpy's
included): the peak while the one call runs, so nothing else the test process holds counts.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from streamrec.format.framing import RecordEncoder
from streamrec.format.index import IndexBuilder
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
