"""Record index sidecars, ``<shard>.idx``: where each record of a shard is (sans-I/O).

**Plain format** (uncompressed shards): one text line per record, ``"<offset> <length>\\n"``:
the byte offset of the framed record in the file and its framed length (payload + 16 bytes of
framing). This is the format DALI's ``tfrecord2idx`` and the ``tfrecord`` package's
``create_index`` write and their indexed readers read, so a dataset indexed once serves all
three.

**Extended format** (GZIP / ZLIB shards written by streamrec with ``index=True``): four columns,
``"<offset> <length> <restart> <skip>\\n"``. ``offset`` and ``length`` are as above but in the
*uncompressed* stream (so a tool that seeks in the decompressed stream, like the ``tfrecord``
package over gzip, still reads the first two columns right). ``restart`` is the compressed byte
offset of a *restart point* at or before the record and ``skip`` the uncompressed bytes from
that point to the record's start. A restart point at offset 0 is the stream's start (header
included, read with the shard's own codec); any other is a deflate full-flush point, where a
raw inflater (no header) can start. Readers then fetch ``[restart, next restart or the end)``,
inflate, drop ``skip`` bytes and read the record. A compressed shard whose index has only the
two plain columns (its offsets are in the decompressed stream) gives record counts, not random
access.

An index is untrusted input (it comes from storage): :func:`parse_index` accepts only digits
and whitespace, at most :func:`index_size_limit` bytes, numbers below 10**18, the same number of
columns on every line, records that follow each other without gaps (offset 0 first, each
record where the previous one ended), framed lengths of at least 16 bytes, an uncompressed
shard's records ending exactly at its size, and restart points inside the compressed object
that never go backwards and agree with their records. Anything else is a
:class:`~streamrec.errors.FormatError` naming the index, the line and what is wrong; an index
that passes cannot make a reader allocate or seek by numbers the shard does not back.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from streamrec.errors import FormatError
from streamrec.format.accel import load_accelerator
from streamrec.format.framing import OVERHEAD_BYTES

__all__ = [
    "INDEX_SUFFIX",
    "IndexBuilder",
    "ShardIndex",
    "index_size_limit",
    "index_url",
    "parse_index",
]

INDEX_SUFFIX = ".idx"
"""A shard's index is the shard's name with this appended: ``train-00000.tfrecord.idx``."""

Int64Array = npt.NDArray[np.int64]

_MAX_DIGITS = 18  # every accepted number is below 10**18 < 2**63
_LINE_BYTES = 4 * (_MAX_DIGITS + 1) + 2  # four numbers, separators, "\r\n"
_MAX_INFLATE_RATIO = 1032  # deflate's largest ratio: uncompressed bytes per compressed byte
_ALLOWED = b"0123456789 \t\r\n"


def index_url(shard_url: str | os.PathLike[str]) -> str:
    """The url of ``shard_url``'s index sidecar (a ``pathlib.Path`` gives a ``str`` too)."""
    return os.fspath(shard_url) + INDEX_SUFFIX


def index_size_limit(stored_size: int, compressed: bool) -> int:
    """Most bytes an index of a shard of ``stored_size`` bytes can validly have (check an
    index object's size against this before reading it)."""
    if compressed:
        most_records = (stored_size * _MAX_INFLATE_RATIO) // OVERHEAD_BYTES + 1
    else:
        most_records = stored_size // OVERHEAD_BYTES
    return most_records * _LINE_BYTES


@dataclass(frozen=True, eq=False)
class ShardIndex:
    """Where each record of one shard is (see the module docstring).

    ``offsets``/``lengths``: each framed record's start and length in the (uncompressed)
    stream; ``restarts``/``skips``: for an indexed compressed shard, each record's restart
    point (compressed offset) and its distance from it; ``None`` otherwise.
    """

    offsets: Int64Array
    lengths: Int64Array
    restarts: Int64Array | None = None
    skips: Int64Array | None = None
    counts_only: bool = False
    """True for the plain index of a compressed shard: record counts, no random access."""

    def __len__(self) -> int:
        return len(self.offsets)

    @property
    def random_access(self) -> bool:
        """True when records can be read without reading the shard from its start (always for
        uncompressed shards; for compressed ones, when the index has restart points)."""
        return not self.counts_only

    @property
    def stream_bytes(self) -> int:
        """The (uncompressed) stream's length: where the last record ends."""
        if not len(self.offsets):
            return 0
        return int(self.offsets[-1] + self.lengths[-1])

    def to_bytes(self) -> bytes:
        """The index as its sidecar's text."""
        columns = [self.offsets, self.lengths]
        if self.restarts is not None and self.skips is not None:
            columns += [self.restarts, self.skips]
        rows = len(self.offsets)
        return b"".join(
            _make_text([column[start : start + _TEXT_ROWS] for column in columns])
            for start in range(0, rows, _TEXT_ROWS)
        )


class IndexBuilder:
    """Collects a shard's index as its records are written (sans-I/O).

    ``add_records(lengths)`` appends records that follow each other from the current stream
    position; with ``restart=(compressed_offset, stream_offset)`` they are given that restart
    point (an extended index). Per record it keeps one length (8 bytes): restart points are
    kept per run of records and spread out by :meth:`build`.
    """

    __slots__ = ("_extended", "_last", "_lengths", "_runs")

    def __init__(self, *, extended: bool = False) -> None:
        self._extended = extended
        self._lengths = array("q")  # 8 bytes a record, however long the shard
        # extended: (first record, compressed offset, stream offset) of each restart point
        self._runs: list[tuple[int, int, int]] = []
        self._last: tuple[int, int] | None = None  # the latest restart point

    def __len__(self) -> int:
        return len(self._lengths)

    def add_records(
        self, framed_lengths: Iterable[int], restart: tuple[int, int] | None = None
    ) -> None:
        """Append records of the given framed lengths; ``restart`` is required (and only
        allowed) for an extended index."""
        if restart != self._last or (restart is None and self._extended):
            if not self._extended or restart is None:
                raise ValueError("an extended index needs a restart point per record, a plain none")
            self._runs.append((len(self._lengths), restart[0], restart[1]))
            self._last = restart
        self._lengths.extend(framed_lengths)

    def build(self) -> ShardIndex:
        """The index of the records added so far."""
        lengths = np.frombuffer(self._lengths, dtype=np.int64).copy()
        offsets = np.zeros(len(lengths), dtype=np.int64)
        if len(lengths) > 1:
            np.cumsum(lengths[:-1], out=offsets[1:])
        if not self._extended:
            return ShardIndex(offsets, lengths)
        runs = np.asarray(self._runs, dtype=np.int64).reshape(-1, 3)
        counts = np.diff(np.append(runs[:, 0], len(lengths)))
        restarts = np.repeat(runs[:, 1], counts)
        skips = offsets - np.repeat(runs[:, 2], counts)
        return ShardIndex(offsets, lengths, restarts, skips)


def parse_index(data: bytes, *, source: str, stored_size: int, compressed: bool) -> ShardIndex:
    """The index in ``data`` (a sidecar's bytes) of a shard of ``stored_size`` bytes as
    stored; FormatError naming ``source`` (the index's url) when it is not a valid index of
    that shard."""

    def bad(problem: str, line: int | None = None) -> FormatError:
        where = f" line {line + 1}" if line is not None else ""
        return FormatError(f"{source}{where}: not a valid record index of its shard: {problem}")

    limit = index_size_limit(stored_size, compressed)
    if len(data) > limit:
        raise bad(f"{len(data)} bytes, more than a shard of {stored_size} bytes can have")
    if data.translate(None, _ALLOWED):
        position = next(k for k, byte in enumerate(data) if byte not in _ALLOWED)
        raise bad(
            f"byte {position} is {data[position : position + 1]!r}, not a digit or space",
            data.count(b"\n", 0, position),
        )
    counts, values = _numbers(data, bad)
    if not len(counts):
        if stored_size and not compressed:
            raise bad(f"no records, but the shard has {stored_size} bytes")
        return ShardIndex(_EMPTY, _EMPTY, counts_only=compressed)
    columns = int(counts[0])
    wrong = np.flatnonzero(counts != columns)
    if columns not in (2, 4) or len(wrong):
        line = int(wrong[0]) if len(wrong) else 0
        raise bad(f"lines must all have 2 or 4 numbers (line 1 has {columns})", line)
    table = values.reshape(-1, columns)
    offsets, lengths = table[:, 0].copy(), table[:, 1].copy()
    _check_records(offsets, lengths, bad)
    end = int(offsets[-1] + lengths[-1])
    if columns == 2:
        if not compressed and end != stored_size:
            raise bad(
                f"its records end at byte {end}, but the shard has {stored_size} bytes "
                "(a stale index: rebuild it with `streamrec index`)"
            )
        return ShardIndex(offsets, lengths, counts_only=compressed)
    if not compressed:
        raise bad("restart points (4 columns) in the index of an uncompressed shard")
    restarts, skips = table[:, 2].copy(), table[:, 3].copy()
    _check_restarts(offsets, restarts, skips, stored_size, bad)
    return ShardIndex(offsets, lengths, restarts, skips)


# Decimal text without a Python step per number (~50 ns a line instead of ~1 us): each number
# is cut into groups of 4 digits, each group looked up as 4 ASCII bytes (one uint32) in a table
# whose second and third parts spell a number's most significant group without its leading
# zeros, NUL-padded (the third, for a number's last group, spells 0 as "0"); the NULs of the
# fixed-width lines are then deleted in one pass.
_GROUPS = [b"%04d" % k for k in range(10_000)]
_DIGITS = np.frombuffer(
    b"".join(
        _GROUPS
        + [g.lstrip(b"0").rjust(4, b"\0") for g in _GROUPS]
        + [(g.lstrip(b"0") or b"0").rjust(4, b"\0") for g in _GROUPS]
    ),
    dtype=np.uint32,
)
del _GROUPS
_LEAD, _LAST = 10_000, 20_000  # where the two NUL-padded parts of _DIGITS start
_TEXT_ROWS = 16_384  # lines made at once: their arrays stay in the CPU's cache (2x faster)


def _text(columns: list[Int64Array]) -> bytes:
    """Lines of the columns' numbers (non-negative), separated by spaces, each line ended by
    a newline: exactly ``"".join(" ".join(map(str, row)) + "\n" for row in rows)``."""
    n = len(columns[0])
    if not n:
        return b""
    blocks = []
    for column in columns:
        top = int(column.max())
        groups = max(1, -(-len(str(top)) // 4))
        words = np.empty((n, groups), dtype=np.uint32)
        # int32 divides about twice as fast; the numbers of most shards fit
        rest: npt.NDArray[np.int64] | npt.NDArray[np.int32] = (
            column.astype(np.int32) if top < 2**31 else column
        )
        for k in range(groups - 1, -1, -1):
            base = rest.dtype.type(_LAST if k == groups - 1 else _LEAD)
            if k:
                rest, group = np.divmod(rest, 10_000)
                group += (rest == 0) * base  # the leading group: no leading zeros
            else:  # the most significant group: always leading
                group = rest + base
            np.take(_DIGITS, group, out=words[:, k])
        blocks.append(words.view(np.uint8))
    width = sum(block.shape[1] + 1 for block in blocks)
    lines = np.empty((n, width), dtype=np.uint8)
    at = 0
    for k, block in enumerate(blocks):
        lines[:, at : at + block.shape[1]] = block
        at += block.shape[1]
        lines[:, at] = ord(" ") if k < len(blocks) - 1 else ord("\n")
        at += 1
    return lines.tobytes().translate(None, b"\0")


def _c_text(columns: list[Int64Array]) -> bytes:
    """:func:`_text` by the C accelerator (the same bytes, ~5x faster: no per-digit arrays)."""
    assert _cframing is not None
    text: bytes = _cframing.index_text(
        *(np.ascontiguousarray(column, dtype=np.int64) for column in columns)
    )
    return text


_cframing = load_accelerator("_cframing")
_make_text: Callable[[list[Int64Array]], bytes] = _text if _cframing is None else _c_text


_Bad = Callable[..., FormatError]
_EMPTY: Int64Array = np.zeros(0, dtype=np.int64)


def _numbers(data: bytes, bad: _Bad) -> tuple[Int64Array, Int64Array]:
    """Numbers per non-empty line, and all numbers in order."""
    raw = np.frombuffer(data, dtype=np.uint8)
    digit = (raw >= ord("0")) & (raw <= ord("9"))
    before = np.concatenate(([False], digit[:-1]))
    after = np.concatenate((digit[1:], [False]))
    starts = np.flatnonzero(digit & ~before)
    ends = np.flatnonzero(digit & ~after) + 1
    too_long = np.flatnonzero(ends - starts > _MAX_DIGITS)
    line_of = np.cumsum(raw == ord("\n"))
    if len(too_long):
        k = int(starts[too_long[0]])
        raise bad(f"a number of more than {_MAX_DIGITS} digits at byte {k}", int(line_of[k]))
    token_lines = line_of[starts]
    lines, counts = np.unique(token_lines, return_counts=True)
    if len(lines) and lines[-1] - lines[0] + 1 != len(lines):
        gap = int(np.flatnonzero(np.diff(lines) != 1)[0])
        raise bad("an empty line among the records", int(lines[gap]) + 1)
    if len(lines) and lines[0] != 0:
        raise bad("an empty line before the records", 0)
    text = data.decode("ascii")
    values = np.array(text.split(), dtype=np.int64) if len(starts) else _EMPTY
    return counts.astype(np.int64), values


def _check_records(offsets: Int64Array, lengths: Int64Array, bad: _Bad) -> None:
    short = np.flatnonzero(lengths < OVERHEAD_BYTES)
    if len(short):
        k = int(short[0])
        raise bad(f"framed length {int(lengths[k])} < {OVERHEAD_BYTES}", k)
    if offsets[0] != 0:
        raise bad(f"the first record starts at {int(offsets[0])}, not 0", 0)
    gaps = np.flatnonzero(offsets[1:] != offsets[:-1] + lengths[:-1])
    if len(gaps):
        k = int(gaps[0]) + 1
        raise bad(
            f"record starts at {int(offsets[k])}, where the one before ends at "
            f"{int(offsets[k - 1] + lengths[k - 1])}",
            k,
        )


def _check_restarts(
    offsets: Int64Array, restarts: Int64Array, skips: Int64Array, stored_size: int, bad: _Bad
) -> None:
    points = offsets - skips  # each record's restart point in the uncompressed stream
    problems = (
        (skips < 0, "a negative skip"),
        (points < 0, "a skip reaching before the stream's start"),
        (
            restarts >= max(stored_size, 1),
            f"a restart point beyond the shard's {stored_size} bytes",
        ),
        (np.concatenate(([False], restarts[1:] < restarts[:-1])), "a restart point going back"),
        (
            np.concatenate(
                ([False], (restarts[1:] == restarts[:-1]) & (points[1:] != points[:-1]))
            ),
            "records of one restart point that disagree where it is",
        ),
        (
            np.concatenate(([False], (restarts[1:] > restarts[:-1]) & (points[1:] <= points[:-1]))),
            "a restart point that does not move forward in the stream",
        ),
        ((restarts == 0) & (points != 0), "the stream's start (restart 0) not at stream offset 0"),
    )
    for mask, problem in problems:
        found = np.flatnonzero(mask)
        if len(found):
            raise bad(problem, int(found[0]))
