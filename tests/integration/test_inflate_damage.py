"""One damaged byte in a GZIP/ZLIB shard: every record inflated before it, then the error.

Python's zlib drops all the output of a call that fails, so a reader that inflates a whole
block per call lost every record of that block (0 of a 34 KB shard's 393 good records). The
reference here is zlib itself fed one byte at a time: the records that inflate, intact,
before zlib fails are all handed on, then a ``CompressionError`` that names the compressed
byte where inflation failed.
"""

from __future__ import annotations

import random
import re
import zlib
from pathlib import Path

import pytest

import streamrec
from streamrec.errors import CompressionError, FormatError
from streamrec.format.framing import RecordDecoder

WBITS = {"gzip": 31, "zlib": 15}
SUFFIX = {"gzip": ".gz", "zlib": ".zlib"}
# zlib reports damage within this many bytes of the damaged one (it decodes whole codes)
NEAR = 16


def payloads() -> list[bytes]:
    # random bytes: deflate stores them, in blocks whose headers zlib checks at once
    rng = random.Random(29)
    return [rng.randbytes(rng.randrange(20, 400)) for _ in range(3000)]


def damaged_shard(tmp_path: Path, codec: str) -> tuple[Path, int, int, int]:
    """A shard written by streamrec with one byte flipped from ~60% of the file on, where
    zlib fails near it: (path, flipped byte, byte zlib fails on, uncompressed bytes before)."""
    path = tmp_path / f"damaged.tfrecord{SUFFIX[codec]}"
    with streamrec.sync.open_writer(str(path), compression=codec) as writer:
        for payload in payloads():
            writer.write(payload)
    clean = path.read_bytes()
    start = len(clean) * 6 // 10
    head = zlib.decompressobj(WBITS[codec])
    prefix = len(head.decompress(clean[:start]))
    for flip in range(start, len(clean) - 64):
        data = bytearray(clean)
        data[flip] ^= 0xFF
        # zlib fed one byte at a time from the flip: where it fails, and what came before
        inflate = head.copy()
        produced = prefix + len(inflate.decompress(data[start:flip]))
        for at in range(flip, flip + NEAR):
            try:
                produced += len(inflate.decompress(data[at : at + 1]))
            except zlib.error:
                path.write_bytes(bytes(data))
                return path, flip, at, produced
    raise AssertionError("no byte to flip that zlib notices near it")


def reference(path: Path, codec: str) -> list[bytes]:
    """The intact records among what zlib inflates, one byte at a time, before it fails."""
    data = path.read_bytes()
    inflate = zlib.decompressobj(WBITS[codec])
    out = bytearray()
    for at in range(len(data)):
        try:
            out += inflate.decompress(data[at : at + 1])
        except zlib.error:
            break
    else:
        raise AssertionError("the damage is not noticed by zlib")
    framing = RecordDecoder()
    records = framing.feed(bytes(out))
    good = payloads()
    n = 0
    while n < len(records) and records[n] == good[n]:
        n += 1
    return records[:n]


@pytest.mark.parametrize("codec", ["gzip", "zlib"])
@pytest.mark.parametrize("iteration", ["sync", "async"])
async def test_records_before_the_damaged_byte_come_then_where_it_is(
    tmp_path: Path, codec: str, iteration: str, scanner: str
) -> None:
    path, flip, fails_at, produced = damaged_shard(tmp_path, codec)
    expected = reference(path, codec)
    assert len(expected) > 1000  # the records of the first ~60% of the file
    ds = streamrec.open_dataset(str(path))
    got: list[bytes] = []
    with pytest.raises(FormatError) as info:
        if iteration == "sync":
            for record in ds:
                got.append(record)
        else:
            async for record in ds:
                got.append(record)
    assert len(got) >= len(expected)
    assert got == payloads()[: len(got)]
    error = info.value
    assert isinstance(error, CompressionError), error  # stored blocks: no garbage records
    assert error.url == str(path)
    assert error.record_index == len(got)
    message = str(error)
    found = re.search(r"at compressed byte (\d+), after (\d+) uncompressed bytes", message)
    assert found is not None, message
    assert int(found[1]) == fails_at
    assert 0 <= int(found[1]) - flip < NEAR
    assert int(found[2]) == produced
    assert error.offset is not None and error.offset <= produced


@pytest.mark.parametrize("codec", ["gzip", "zlib"])
def test_skipping_the_damage_keeps_the_records_before_it(
    tmp_path: Path, codec: str, caplog: pytest.LogCaptureFixture
) -> None:
    path, _, fails_at, _ = damaged_shard(tmp_path, codec)
    expected = reference(path, codec)
    ds = streamrec.open_dataset(str(path), on_corrupt="skip")
    with caplog.at_level("WARNING", logger="streamrec"):
        got = list(ds)
    # the rest of a broken deflate stream cannot be framed: it is dropped, reported once
    assert got == payloads()[: len(got)]
    assert len(got) >= len(expected)
    assert ds.stats.corrupt_skipped == 1
    assert len(caplog.records) == 1
    assert f"at compressed byte {fails_at}," in caplog.records[0].getMessage()
