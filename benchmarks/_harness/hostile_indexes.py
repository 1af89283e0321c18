"""bench_hostile.py's record index sidecar cases (issue 29, B.6, B.7, B.9): each writes its
files under a directory and says how the child reads them (``spec``: the url, the call -
``len``, ``get`` or ``iterate`` - and the ``open_dataset`` options)."""

from __future__ import annotations

import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

MIB = 1 << 20

__all__ = ["CASES", "run"]

Spec = dict[str, Any]


def make_padded_sidecar(directory: Path) -> Spec:
    """A 64 KiB gzip shard whose sidecar is one valid line padded with 103 MB of spaces."""
    import os

    from streamrec.sync import open_writer

    url = str(directory / "padded.tfrecord.gz")
    with open_writer(url, compression="gzip", index=True) as writer:
        for _ in range(64):
            writer.write(os.urandom(1000))
    size = Path(url).stat().st_size
    Path(f"{url}.idx").write_bytes(b"0" + b" " * 103_000_000 + b" %d 0 0\n" % size)
    return {"url": url, "call": "len", "options": {}}


def make_many_records(directory: Path) -> Spec:
    """A valid shard of 2,000,000 empty records (32 MB) and its ~22 MiB sidecar."""
    from streamrec.format.framing import RecordEncoder
    from streamrec.format.index.core import IndexBuilder

    url = str(directory / "many.tfrecord")
    records = 2_000_000
    with open(url, "wb") as f:
        f.write(RecordEncoder().encode_many([b""] * records))
    builder = IndexBuilder()
    builder.add_records([16] * records)
    Path(f"{url}.idx").write_bytes(builder.build().to_bytes())
    return {"url": url, "call": "len", "options": {}}


def make_bomb_index(directory: Path) -> Spec:
    """A ~520 KB gzip bomb (512 records of 1 MiB of zeros) whose sidecar claims one record
    of all of it (within 1032x: a valid-looking index)."""
    from streamrec.format.framing import RecordEncoder

    url = str(directory / "bomb-index.tfrecord.gz")
    deflate = zlib.compressobj(9, zlib.DEFLATED, 31)
    record = RecordEncoder().encode_many([bytes(MIB)])
    with open(url, "wb") as f:
        for _ in range(512):
            f.write(deflate.compress(record))
        f.write(deflate.flush())
    Path(f"{url}.idx").write_bytes(b"0 %d 0 0\n" % (512 * len(record)))
    return {"url": url, "call": "get", "options": {"prefetch_bytes": MIB}}


def make_skewed(directory: Path) -> Spec:
    """100,000 empty records, then 48 of 4 MiB, indexed; read with even=True and block
    shuffle under an 8 MiB budget."""
    from streamrec.format.framing import RecordEncoder
    from streamrec.format.index.core import IndexBuilder

    url = str(directory / "skewed.tfrecord")
    big = bytes(range(256)) * (4 * MIB // 256)
    encoder = RecordEncoder()
    with open(url, "wb") as f:
        f.write(encoder.encode_many([b""] * 100_000))
        for _ in range(48):
            f.write(encoder.encode_many([big]))
    builder = IndexBuilder()
    builder.add_records([16] * 100_000 + [len(big) + 16] * 48)
    Path(f"{url}.idx").write_bytes(builder.build().to_bytes())
    options = {"even": True, "shuffle": "block", "seed": 1, "prefetch_bytes": 8 * MIB}
    return {"url": url, "call": "iterate", "options": options}


def make_skewed_table_first(directory: Path) -> Spec:
    """:func:`make_skewed`, its table built (``get([0])``) before the peak RSS is reset: what
    the reading alone adds (the 100,048-entry index parsed and kept is the rest)."""
    return {**make_skewed(directory), "before": "get"}


CASES: dict[str, tuple[str, Callable[[Path], Spec]]] = {
    "padded-idx": ("64 KiB gzip shard, 103 MB space-padded sidecar: len()", make_padded_sidecar),
    "many-idx": ("2M-record shard, its ~22 MiB sidecar: len()", make_many_records),
    "bomb-idx": ("520 KB gzip bomb, index claiming 512 MiB: get([0])", make_bomb_index),
    "skewed-idx": ("100,000 empty + 48 x 4 MiB records: even, block shuffle", make_skewed),
    "skewed-idx-read": ("same, its table built before the measure", make_skewed_table_first),
}


def run(ds: Any, call: str) -> tuple[int, str | None]:
    """Do ``call`` on ``ds``: (records it gave, the error it raised)."""
    records = 0
    try:
        if call == "len":
            records = len(ds)
        elif call == "get":
            records = len(ds.get([0]))
        else:
            for _ in ds:
                records += 1
    except Exception as exc:
        return records, f"{type(exc).__name__}: {exc}"
    return records, None
