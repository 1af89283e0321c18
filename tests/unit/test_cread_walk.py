"""``_cread.walk`` sizes its plans from ``max_records``: a huge one neither overflows nor
allocates more than the records between ``offset`` and ``end`` can fill.

Each call runs in a fresh interpreter: before the check, 16 x ``max_records`` wrapped around
to a tiny allocation that the walk then wrote past (a heap overflow, not an exception).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import streamrec
from streamrec.format.framing import RecordEncoder
from streamrec.storage.local import records

pytestmark = pytest.mark.skipif(records._cread is None, reason="the C reader is not built")

WALK = """
import os, sys
from streamrec.storage.local import records
fd = os.open(sys.argv[1], os.O_RDONLY)
try:
    packed, offset, status = records._cread.walk(fd, 0, {end}, 16, {max_records}, 1 << 62)
    print("walked", len(packed) // 16, offset, status)
except MemoryError:
    print("MemoryError")
"""


def walk_in_subprocess(path: Path, end: int, max_records: int) -> str:
    code = WALK.format(end=end, max_records=max_records)
    root = str(Path(streamrec.__file__).parents[1])  # this streamrec, wherever it is
    run = subprocess.run(
        [sys.executable, "-c", code, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": root},
    )
    assert run.returncode == 0, run.stderr
    return run.stdout.strip()


@pytest.fixture
def shard(tmp_path: Path) -> Path:
    path = tmp_path / "small.tfrecord"
    path.write_bytes(RecordEncoder().encode_many([b"x" * 100] * 40))
    return path


@pytest.mark.parametrize("max_records", [2**59 + 1, 2**60 + 1, sys.maxsize])
def test_a_huge_max_records_walks_what_the_object_holds(shard: Path, max_records: int) -> None:
    size = shard.stat().st_size
    assert walk_in_subprocess(shard, size, max_records) == f"walked 40 {size} 1"


@pytest.mark.parametrize("max_records", [2**60 + 1, sys.maxsize])
@pytest.mark.parametrize("end", [2**62, sys.maxsize])
def test_plans_that_cannot_be_held_are_a_memory_error(
    shard: Path, max_records: int, end: int
) -> None:
    # an ``end`` far past the file: room for more records than plans can be allocated for
    # (at sys.maxsize, for more than 16 bytes each can count), as index_text refuses its rows
    assert walk_in_subprocess(shard, end, max_records) == "MemoryError"
