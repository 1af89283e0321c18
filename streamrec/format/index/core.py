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

An index is untrusted input (it comes from storage): :func:`parse_index` /
:class:`IndexParser` accept only digits and whitespace, at most :func:`index_size_limit`
bytes (the shard's most records times the widest line a valid index of it has), lines no
wider than that, numbers no longer than the shard's stream can need, the same number of
columns on every line, records that follow each other without gaps (offset 0 first, each
record where the previous one ended), framed lengths of at least 16 bytes, an uncompressed
shard's records ending exactly at its size, a compressed shard's records within the
sequential reader's caps (``max_record_bytes``; the stream at most 1032x the stored size,
and each restart point's records at most 1032x the stored bytes up to the next one), and
restart points inside the compressed object that never go backwards and agree with their
records. Anything else is a :class:`~streamrec.errors.FormatError` naming the index, the line
and what is wrong; an index that passes cannot make a reader allocate or seek by numbers the
shard does not back. It is parsed a bounded piece at a time (memory: the table kept, 8 bytes
a number, and a few MiB). Whether its entries are the shard's own records is checked when
they are read (:mod:`streamrec.format.index.check`).
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from streamrec.errors import FormatError
from streamrec.format.framing import OVERHEAD_BYTES
from streamrec.format.index.text import TEXT_ROWS, make_text

__all__ = [
    "INDEX_SUFFIX",
    "IndexBuilder",
    "IndexParser",
    "ShardIndex",
    "index_size_limit",
    "index_url",
    "parse_index",
    "stream_limit",
]

INDEX_SUFFIX = ".idx"
"""A shard's index is the shard's name with this appended: ``train-00000.tfrecord.idx``."""

Int64Array = npt.NDArray[np.int64]

_MAX_DIGITS = 18  # every accepted number is below 10**18 < 2**63
_MAX_INFLATE_RATIO = 1032  # deflate's largest ratio: uncompressed bytes per compressed byte
_ALLOWED = b"0123456789 \t\r\n"
DEFAULT_MAX_RECORD_BYTES = 1 << 30
"""The largest payload an index of a compressed shard may claim: the sequential reader's cap
(:data:`streamrec.format.shard.DEFAULT_MAX_RECORD_BYTES`; not imported: shard.py imports this
module through the encoder)."""
_PARSE_BYTES = 256 << 10
"""Sidecar text parsed at once: its temporaries (~40 bytes a line) stay a few MiB."""


def index_url(shard_url: str | os.PathLike[str]) -> str:
    """The url of ``shard_url``'s index sidecar (a ``pathlib.Path`` gives a ``str`` too)."""
    return os.fspath(shard_url) + INDEX_SUFFIX


def stream_limit(stored_size: int, compressed: bool) -> int:
    """The longest (uncompressed) stream a shard of ``stored_size`` bytes can hold."""
    return stored_size * _MAX_INFLATE_RATIO if compressed else stored_size


def _digits_limit(stored_size: int, compressed: bool) -> int:
    """The most digits a number of a valid index of such a shard has (none exceeds the
    stream's length)."""
    return min(_MAX_DIGITS, len(str(max(stream_limit(stored_size, compressed), 1))))


def _line_limit(stored_size: int, compressed: bool) -> int:
    """The longest line a valid index of such a shard has: its numbers (2 columns, or 4 for a
    compressed shard), one separator each, ``\\r`` and one byte to spare."""
    columns = 4 if compressed else 2
    return columns * (_digits_limit(stored_size, compressed) + 1) + 2


def index_size_limit(stored_size: int, compressed: bool) -> int:
    """Most bytes an index of a shard of ``stored_size`` bytes can validly have: its most
    records (16 framed bytes each at least, in a stream of at most ``stored_size`` bytes, or
    1032x that compressed) times the longest line such an index has (check an index object's
    size against this before reading it)."""
    most_records = stream_limit(stored_size, compressed) // OVERHEAD_BYTES
    return most_records * _line_limit(stored_size, compressed)


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
            make_text([column[start : start + TEXT_ROWS] for column in columns])
            for start in range(0, rows, TEXT_ROWS)
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


def parse_index(
    data: bytes,
    *,
    source: str,
    stored_size: int,
    compressed: bool,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
) -> ShardIndex:
    """The index in ``data`` (a sidecar's bytes) of a shard of ``stored_size`` bytes as
    stored; FormatError naming ``source`` (the index's url) when it is not a valid index of
    that shard (see :class:`IndexParser`, which parses it a bounded piece at a time)."""
    parser = IndexParser(
        source=source,
        stored_size=stored_size,
        compressed=compressed,
        max_record_bytes=max_record_bytes,
    )
    parser.feed(data)
    parser.finish()
    return parser.index()


class IndexParser:
    """A sidecar's text -> its index, fed in pieces of any size (sans-I/O).

    Memory stays bounded whatever the sidecar holds: text is parsed :data:`_PARSE_BYTES` at a
    time (numpy, no Python object per number), a line longer than any valid index of the shard
    has is refused at once (a partial line is all that is carried between pieces), and so is
    text past :func:`index_size_limit`. With ``keep=False`` only the records are counted and
    checked (``len(ds)`` needs the count, not the table); otherwise the columns collect in
    ``array('q')`` (8 bytes a number). Every check of the module docstring is made as the
    lines come (each line against the one before), plus the sequential reader's caps: a
    compressed shard's record at most ``max_record_bytes`` (and 1032x its stored size), and
    the records of each restart point at most 1032x the stored bytes up to the next one.
    """

    def __init__(
        self,
        *,
        source: str,
        stored_size: int,
        compressed: bool,
        keep: bool = True,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    ) -> None:
        self.source = source
        self.stored_size = stored_size
        self.compressed = compressed
        self.keep = keep
        self._limit = index_size_limit(stored_size, compressed)
        self._line_limit = _line_limit(stored_size, compressed)
        self._digits = _digits_limit(stored_size, compressed)
        self._stream = stream_limit(stored_size, compressed)
        longest = self._stream
        if compressed:
            longest = min(longest, max_record_bytes + OVERHEAD_BYTES)
        self._longest = longest  # the longest framed record
        self._fed = 0  # bytes fed
        self._parsed = 0  # bytes parsed (whole lines)
        self._lines = 0  # lines parsed
        self._pending = b""  # the last, unfinished line
        self._columns = 0  # numbers a line (0: no record yet)
        self._rows = 0
        self._blank: int | None = None  # the first empty line after the records so far
        self._last: Int64Array | None = None  # the last record's row
        self._kept: list[array[int]] = []
        self._done = False

    @property
    def records(self) -> int:
        """Records parsed so far."""
        return self._rows

    def _bad(self, problem: str, line: int | None = None, byte: int | None = None) -> FormatError:
        where = f" line {line + 1}" if line is not None else ""
        if byte is not None:
            where += f" (byte {byte})"
        return FormatError(
            f"{self.source}{where}: not a valid record index of its shard: {problem}"
        )

    def feed(self, data: bytes) -> None:
        """Parse the sidecar's next bytes."""
        self._fed += len(data)
        if self._fed > self._limit:
            raise self._bad(
                f"more than {self._limit} bytes, more than any index of a shard of "
                f"{self.stored_size} bytes can have"
            )
        for start in range(0, len(data), _PARSE_BYTES):
            text = self._pending + data[start : start + _PARSE_BYTES]
            cut = text.rfind(b"\n") + 1
            self._pending = text[cut:]
            if cut:
                self._parse(text[:cut])
            if len(self._pending) > self._line_limit:
                raise self._too_long(self._lines, self._parsed)

    def finish(self) -> int:
        """The end of the sidecar: the last checks; the record count."""
        if self._done:
            return self._rows
        if self._pending:
            self._parse(self._pending + b"\n")
            self._pending = b""
        self._done = True
        if not self._rows:
            if self.stored_size and not self.compressed:
                raise self._bad(f"no records, but the shard has {self.stored_size} bytes")
            return 0
        last = self._last
        assert last is not None
        end = int(last[0] + last[1])
        if not self.compressed and end != self.stored_size:
            raise self._bad(
                f"its records end at byte {end}, but the shard has {self.stored_size} bytes "
                "(a stale index: rebuild it with `streamrec index`)"
            )
        if self._columns == 4:  # the last restart point's records, up to the object's end
            stored = self.stored_size - int(last[2])
            if end - int(last[0] - last[3]) > _MAX_INFLATE_RATIO * stored:
                raise self._bad(self._ratio_problem(stored), self._rows - 1)
        return self._rows

    def index(self) -> ShardIndex:
        """The index parsed (after :meth:`finish`; ``keep=True`` only)."""
        if not self._done or not self.keep:
            raise ValueError("index() needs finish() first, and keep=True")
        columns = [_as_int64(kept) for kept in self._kept] or [_EMPTY, _EMPTY]
        if len(columns) == 2:
            return ShardIndex(columns[0], columns[1], counts_only=self.compressed)
        offsets, lengths, restarts, skips = columns
        return ShardIndex(offsets, lengths, restarts, skips)

    def _too_long(self, line: int, byte: int) -> FormatError:
        return self._bad(
            f"a line of more than {self._line_limit} bytes, longer than any line of an index "
            f"of a shard of {self.stored_size} bytes",
            line,
            byte,
        )

    def _ratio_problem(self, stored: int) -> str:
        return (
            f"the records of a restart point need more than {_MAX_INFLATE_RATIO}x its "
            f"{stored} stored bytes (deflate's best ratio)"
        )

    def _parse(self, text: bytes) -> None:
        """Whole lines (``text`` ends with a newline)."""
        base, first_line = self._parsed, self._lines
        if text.translate(None, _ALLOWED):
            k = next(k for k, byte in enumerate(text) if byte not in _ALLOWED)
            raise self._bad(
                f"byte {base + k} is {text[k : k + 1]!r}, not a digit or space",
                first_line + text.count(b"\n", 0, k),
            )
        raw = np.frombuffer(text, dtype=np.uint8)
        newlines = np.flatnonzero(raw == ord("\n"))
        edges = np.diff((raw - ord("0") < 10).view(np.int8), prepend=0, append=0)
        starts = np.flatnonzero(edges == 1)
        ends = np.flatnonzero(edges == -1)
        del edges
        sizes = ends - starts
        long = np.flatnonzero(sizes > self._digits)
        if len(long):
            k = int(starts[long[0]])
            why = (
                f"larger than any in an index of a shard of {self.stored_size} bytes"
                if self.compressed or self._digits == _MAX_DIGITS
                else f"past the shard's {self.stored_size} bytes (a stale index: rebuild it "
                "with `streamrec index`)"
            )
            raise self._bad(
                f"a number of more than {self._digits} digits at byte {base + k}, {why}",
                first_line + int(np.searchsorted(newlines, k)),
            )
        per_line = np.bincount(np.searchsorted(newlines, starts), minlength=len(newlines))
        self._lines_of(per_line, first_line)
        widths = np.diff(newlines, prepend=-1)
        wide = np.flatnonzero(widths > self._line_limit)
        if len(wide):
            k = int(wide[0])
            raise self._too_long(first_line + k, base + int(newlines[k] - widths[k] + 1))
        self._parsed += len(text)
        self._lines += len(newlines)
        if not len(starts):
            return
        values = _values(raw, starts, ends)
        del raw, starts, ends, sizes
        self._rows_of(values.reshape(-1, self._columns))

    def _lines_of(self, per_line: Int64Array, first_line: int) -> None:
        """Empty lines only after the records, every line as many numbers as the first."""
        full = np.flatnonzero(per_line)
        if not len(full):
            if self._rows and self._blank is None:
                self._blank = first_line
            elif not self._rows and self._blank is None and len(per_line):
                self._blank = first_line  # before any record: an error if one comes
            return
        if self._blank is not None or (not self._rows and full[0] > 0):
            line = self._blank if self._blank is not None else first_line
            where = "before" if not self._rows else "among"
            raise self._bad(f"an empty line {where} the records", line)
        inner = np.flatnonzero(per_line[int(full[0]) : int(full[-1]) + 1] == 0)
        if len(inner):
            raise self._bad("an empty line among the records", first_line + int(inner[0]))
        if int(full[-1]) + 1 < len(per_line):
            self._blank = first_line + int(full[-1]) + 1
        if not self._columns:
            self._set_columns(int(per_line[full[0]]))
        wrong = np.flatnonzero(per_line[full] != self._columns)
        if len(wrong):
            raise self._bad(
                f"lines must all have 2 or 4 numbers (line 1 has {self._columns})",
                first_line + int(full[wrong[0]]),
            )

    def _set_columns(self, columns: int) -> None:
        self._columns = columns
        if columns not in (2, 4):
            raise self._bad(f"lines must all have 2 or 4 numbers (line 1 has {columns})", 0)
        if columns == 4 and not self.compressed:
            raise self._bad("restart points (4 columns) in the index of an uncompressed shard")
        if self.keep:
            self._kept = [array("q") for _ in range(columns)]

    def feed_rows(self, rows: Int64Array) -> None:
        """The next records given as numbers, not text: an ``(n, 2)`` or ``(n, 4)`` array of
        the sidecar's columns (the dataset index, :mod:`streamrec.format.index.dataset`),
        checked exactly as parsed lines are (its errors count rows as lines)."""
        if rows.ndim != 2 or rows.shape[1] not in (2, 4):
            raise ValueError(f"rows must be (n, 2) or (n, 4), not {rows.shape}")
        if not len(rows):
            return
        if not self._columns:
            self._set_columns(int(rows.shape[1]))
        elif rows.shape[1] != self._columns:
            raise self._bad(
                f"lines must all have 2 or 4 numbers (line 1 has {self._columns})", self._rows
            )
        self._lines += len(rows)
        self._rows_of(np.ascontiguousarray(rows, dtype=np.int64))

    def _rows_of(self, table: Int64Array) -> None:
        """Records, checked against each other and the one before them."""
        first = self._rows
        carried = self._last is not None
        if self._last is not None:
            table = np.concatenate((self._last.reshape(1, -1), table))
        # rows of ``table`` are lines first - carried + k
        offsets, lengths = table[:, 0], table[:, 1]
        ends = offsets + lengths

        def line(k: int) -> int:
            return first - carried + k

        def check(mask: npt.NDArray[np.bool_], problem: Callable[[int], str]) -> None:
            found = np.flatnonzero(mask)
            if len(found):
                k = int(found[0])
                raise self._bad(problem(k), line(k))

        check(lengths < OVERHEAD_BYTES, lambda k: f"framed length {int(lengths[k])} < 16")
        check(
            lengths > self._longest,
            lambda k: (
                f"framed length {int(lengths[k])} > {self._longest}, more than a record "
                "of this shard can have"
                + (" (max_record_bytes, or 1032x its stored size)" if self.compressed else "")
            ),
        )
        if not carried and offsets[0] != 0:
            raise self._bad(f"the first record starts at {int(offsets[0])}, not 0", first)
        check(
            np.concatenate(([False], offsets[1:] != ends[:-1])),
            lambda k: (
                f"record starts at {int(offsets[k])}, where the one before ends at "
                f"{int(ends[k - 1])}"
            ),
        )
        check(
            ends > self._stream,
            lambda k: (
                f"its records end at byte {int(ends[k])}, past the "
                + (
                    f"{self._stream} bytes a shard of {self.stored_size} can inflate to"
                    if self.compressed
                    else f"shard's {self.stored_size} bytes (a stale index: rebuild it with "
                    "`streamrec index`)"
                )
            ),
        )
        if self._columns == 4:
            self._check_restarts(table, ends, check)
        self._last = table[-1].copy()
        fresh = table[1:] if carried else table
        self._rows += len(fresh)
        for kept, column in zip(self._kept, fresh.T, strict=False):  # none: keep=False
            kept.frombytes(np.ascontiguousarray(column).tobytes())

    def _check_restarts(
        self,
        table: Int64Array,
        ends: Int64Array,
        check: Callable[[npt.NDArray[np.bool_], Callable[[int], str]], None],
    ) -> None:
        offsets, restarts, skips = table[:, 0], table[:, 2], table[:, 3]
        points = offsets - skips  # each record's restart point in the uncompressed stream
        size = self.stored_size
        step = restarts[1:] != restarts[:-1]
        check(skips < 0, lambda k: "a negative skip")
        check(points < 0, lambda k: "a skip reaching before the stream's start")
        check(
            restarts >= max(size, 1), lambda k: f"a restart point beyond the shard's {size} bytes"
        )
        check(
            np.concatenate(([False], restarts[1:] < restarts[:-1])),
            lambda k: "a restart point going back",
        )
        check(
            np.concatenate(([False], ~step & (points[1:] != points[:-1]))),
            lambda k: "records of one restart point that disagree where it is",
        )
        check(
            np.concatenate(([False], step & (points[1:] <= points[:-1]))),
            lambda k: "a restart point that does not move forward in the stream",
        )
        check(
            (restarts == 0) & (points != 0),
            lambda k: "the stream's start (restart 0) not at stream offset 0",
        )
        # each restart point's records (its last row: just before the next point) inflate
        # from the stored bytes up to the next point: at most 1032x as many
        stored = np.concatenate((restarts[1:] - restarts[:-1], [0]))
        check(
            np.concatenate((step, [False])) & (ends - points > _MAX_INFLATE_RATIO * stored),
            lambda k: self._ratio_problem(int(stored[k])),
        )


def _values(raw: npt.NDArray[np.uint8], starts: Int64Array, ends: Int64Array) -> Int64Array:
    """The decimal numbers ``raw[starts[k]:ends[k]]`` (each at most 18 digits), a digit
    position at a time: a few arrays of one number each, however long the text."""
    values = np.zeros(len(starts), dtype=np.int64)
    scale = 1
    for place in range(int((ends - starts).max(initial=0))):
        at = ends - 1 - place
        inside = at >= starts
        digits = raw[np.where(inside, at, starts)].astype(np.int64) - ord("0")
        values += np.where(inside, digits, 0) * scale
        scale *= 10
    return values


def _as_int64(kept: array[int]) -> Int64Array:
    return np.frombuffer(kept, dtype=np.int64) if len(kept) else _EMPTY


_EMPTY: Int64Array = np.zeros(0, dtype=np.int64)
