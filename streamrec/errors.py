"""Every exception streamrec raises on purpose.

The tree (catch a branch to catch everything below it)::

    StreamrecError                      base of everything below
    ├── FormatError (ValueError)        the bytes are not a valid TFRecord stream
    │   ├── CorruptRecordError          a masked CRC32C does not match (length or payload)
    │   ├── TruncatedRecordError        the stream ends inside a record (header, payload or CRC)
    │   ├── CompressionError            a gzip / zlib stream fails to inflate
    │   └── IndexMismatchError          a record index sidecar does not fit its shard (stale)
    ├── ExampleError (ValueError)       a payload is not the Example the caller asked for
    │   └── FeatureError (KeyError)     a feature is missing or has the wrong kind, length or shape
    ├── StateError (ValueError)         a resume state that does not fit this dataset
    ├── RecordCountUnknownError         len(ds) / num_records: some shard's record count is not
    │     (TypeError)                   known without reading it (no manifest count, no index)
    ├── RandomAccessUnavailableError    ds.get(indices): some shard has no index sidecar, or a
    │     (TypeError)                   GZIP/ZLIB shard's index has no restart points
    └── StorageError (OSError)          reading or writing an object failed; names the url
        ├── ObjectNotFoundError         (FileNotFoundError) no object, or a glob matched nothing
        ├── PermissionDeniedError       (PermissionError) 401/403, bad or missing credentials
        ├── ObjectChangedError          the object was replaced while it was being read
        ├── TransientStorageError       a retryable fault: reset, timeout, 5xx, 429, short read
        └── RetriesExhaustedError       transient faults outlasted the attempts or the deadline

    ArgumentError (ValueError,          a bad argument to open_dataset, open_writer, ...: names
                   TypeError)           the argument (a usage error, so no StreamrecError)

Format errors carry ``url`` (the file or object), ``offset`` (byte offset of the record's 12-byte
header in the *uncompressed* stream) and ``record_index`` (0-based index of the record in its
file); all three appear in the message. ``CorruptRecordError`` also says which CRC failed
(``which`` is ``"length"`` or ``"payload"``) with the ``expected`` (stored) and ``actual``
(computed) masked values.

Credentials embedded in urls (``https://user:token@host``) never appear in messages: every
message and ``url`` attribute is passed through :func:`streamrec.redact.redact`.

Foreign exceptions (OSError, zlib.error, protobuf's DecodeError, botocore, aiohttp, gcsfs) are
translated into this tree where they enter streamrec, with the original as ``__cause__``.
Whether a storage fault is retried is decided by its type: only ``TransientStorageError`` is;
``RetriesExhaustedError`` carries the last one as its cause.
"""

from __future__ import annotations

from streamrec.redact import redact

__all__ = [
    "ArgumentError",
    "CompressionError",
    "CorruptRecordError",
    "ExampleError",
    "FeatureError",
    "FormatError",
    "IndexMismatchError",
    "ObjectChangedError",
    "ObjectNotFoundError",
    "PermissionDeniedError",
    "RandomAccessUnavailableError",
    "RecordCountUnknownError",
    "RetriesExhaustedError",
    "StateError",
    "StorageError",
    "StreamrecError",
    "TransientStorageError",
    "TruncatedRecordError",
]


class StreamrecError(Exception):
    """Base class of every error streamrec raises on purpose."""


class ArgumentError(ValueError, TypeError):
    """An argument of ``open_dataset``, ``open_writer`` (or another entry point) has the wrong
    type or value; the message names the argument. Both a ``ValueError`` and a ``TypeError``
    (what the builtins raise for a wrong value or type), so either ``except`` catches it. Not
    a :class:`StreamrecError`: it is a mistake in the calling code, not damaged data or a
    storage fault (the CLI reports it as a usage error)."""


class FormatError(StreamrecError, ValueError):
    """The bytes of a file are not a valid TFRecord stream.

    ``url`` names the file, ``offset`` is the byte offset of the failing record's header in the
    uncompressed stream, ``record_index`` its 0-based index in the file (``None`` when unknown).
    """

    def __init__(
        self,
        problem: str,
        *,
        url: str | None = None,
        offset: int | None = None,
        record_index: int | None = None,
    ) -> None:
        self.problem = redact(problem)
        self.url = None if url is None else redact(url)
        self.offset = offset
        self.record_index = record_index
        super().__init__(self._render())

    def _render(self) -> str:
        where = []
        if self.record_index is not None:
            where.append(f"record {self.record_index}")
        where.append(f"in {self.url or '<stream>'}")
        if self.offset is not None:
            where.append(f"at byte offset {self.offset}")
        return f"{' '.join(where)}: {self.problem}"

    def located(self, url: str) -> FormatError:
        """Return this error with ``url`` filled in (the sans-I/O core may not know it)."""
        if self.url is None:
            self.url = redact(url)
            self.args = (self._render(),)
        return self

    def relocated(self, url: str, note: str) -> FormatError:
        """Return this error naming ``url`` instead (a copy of the file was read), with
        ``note`` (what the copy is) added to the problem."""
        self.url = redact(url)
        self.problem = f"{self.problem} {redact(note)}"
        self.args = (self._render(),)
        return self

    def __reduce__(self) -> tuple[object, ...]:
        # Keep pickling (multiprocessing, Dask) working despite keyword-only arguments.
        return (_rebuild, (type(self), self.__dict__.copy()))


def _rebuild(cls: type[FormatError], state: dict[str, object]) -> FormatError:
    error = cls.__new__(cls)
    error.__dict__.update(state)
    Exception.__init__(error, error._render())
    return error


class CorruptRecordError(FormatError):
    """A record's masked CRC32C does not match its bytes.

    ``which`` is ``"length"`` (the 8 length bytes; the rest of the file cannot be framed) or
    ``"payload"`` (the record alone is bad); ``expected`` is the stored masked CRC, ``actual``
    the one computed from the bytes read.
    """

    def __init__(
        self,
        which: str,
        expected: int,
        actual: int,
        *,
        url: str | None = None,
        offset: int | None = None,
        record_index: int | None = None,
    ) -> None:
        self.which = which
        self.expected = expected
        self.actual = actual
        super().__init__(
            f"{which} CRC mismatch (stored 0x{expected:08x}, computed 0x{actual:08x})",
            url=url,
            offset=offset,
            record_index=record_index,
        )


class TruncatedRecordError(FormatError):
    """The stream ends inside a record: in its 12-byte header, its payload or its CRC."""


class CompressionError(FormatError):
    """A gzip or zlib stream is damaged or ends early."""


class IndexMismatchError(FormatError):
    """A shard's record index sidecar (``<shard>.idx``) is not a valid index of the shard as it
    is now (stale: the shard was rewritten; or damaged); the message names both urls and how
    to rebuild it (``streamrec index --force``)."""


class ExampleError(StreamrecError, ValueError):
    """A payload cannot be decoded as the Example / SequenceExample the caller asked for.

    Raised by a dataset's ``.parse(spec)`` (or ``.parse(spec).batch(n)``), the message starts
    with the record's place, as a :class:`FormatError`'s does, and ``url``, ``record_index``
    and ``offset`` say it too (``None`` elsewhere: ``decode_batch`` on a list of payloads says
    ``record N of the batch``, ``batch_index`` being that N).
    """

    url: str | None = None
    record_index: int | None = None
    offset: int | None = None
    batch_index: int | None = None

    def located(self, url: str, record_index: int | None, offset: int | None) -> ExampleError:
        """This error naming the record's shard ``url``, index in it and byte offset (the
        sans-I/O decoder only knows the payload) instead of its place in a batch."""
        self.url, self.record_index, self.offset = redact(url), record_index, offset
        where = [f"in {self.url}"]
        if record_index is not None:
            where.insert(0, f"record {record_index}")
        if offset is not None:
            where.append(f"at byte offset {offset}")
        text = str(self.args[0]) if self.args else ""
        if self.batch_index is not None:
            batch = f"record {self.batch_index} of the batch"
            text = text.replace(f"{batch}: ", "", 1).replace(batch, "the record", 1)
        self.args = (f"{' '.join(where)}: {text}",)
        return self


class FeatureError(ExampleError, KeyError):
    """A feature is missing, or its kind, length or shape does not match the spec."""

    def __init__(self, feature: str, problem: str) -> None:
        self.feature = feature
        self.problem = redact(problem)
        super().__init__(f"feature {feature!r}: {problem}")

    def __str__(self) -> str:  # KeyError would quote the message; keep it readable
        return str(self.args[0])

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_example, (type(self), self.args, self.__dict__.copy()))


def _rebuild_example(
    cls: type[ExampleError], args: tuple[object, ...], state: dict[str, object]
) -> ExampleError:
    error = cls.__new__(cls)
    error.__dict__.update(state)
    error.args = args
    return error


class StateError(StreamrecError, ValueError):
    """``load_state_dict`` got a state from another configuration, other shards or a newer
    streamrec; the message lists what differs."""


class RecordCountUnknownError(StreamrecError, TypeError):
    """``len(ds)`` / ``ds.num_records`` need every shard's record count without reading the
    shards: from a manifest or an index sidecar (``streamrec index``). Raised when some shard
    has neither (or a sidecar that does not fit its shard); the message names one and the
    command that indexes them. A ``TypeError``, as ``len()`` of an object without a length
    raises: ``list(ds)``, which asks for the length first, then simply reads."""


class RandomAccessUnavailableError(StreamrecError, TypeError):
    """``ds.get(indices)`` / ``await ds.aget(indices)`` read records by their index in the
    dataset, which needs every shard's record index sidecar (``<shard>.idx``) and, for a
    GZIP/ZLIB shard, one with restart points (written with ``index=True``, or ``streamrec
    reshard --index``; ``streamrec index`` gives such a shard a counts-only index). Raised on
    the first call when some shard has no such index: the message names one and what makes
    it (such shards can still be read sequentially). A ``TypeError``, as indexing an object
    that does not support it raises; stale indexes are an
    :class:`IndexMismatchError` instead."""


class StorageError(StreamrecError, OSError):
    """Reading or writing an object failed; the message names its url (credentials redacted)."""

    def __init__(self, *args: object) -> None:
        super().__init__(*(redact(a) if isinstance(a, str) else a for a in args))


class ObjectNotFoundError(StorageError, FileNotFoundError):
    """The object does not exist, or a glob matched no object."""


class PermissionDeniedError(StorageError, PermissionError):
    """Access was refused (HTTP 401/403): missing, wrong or insufficient credentials."""


class ObjectChangedError(StorageError):
    """The object's ETag or generation changed while it was being read (it was replaced)."""


class TransientStorageError(StorageError):
    """A fault worth retrying: connection reset, timeout, 5xx, 429/SlowDown, a short body."""


class RetriesExhaustedError(StorageError):
    """Transient faults outlasted the retry policy (attempts or deadline); see ``__cause__``."""
