"""What every store offers, and the one description of an object the pipeline passes around."""

from __future__ import annotations

import abc
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from streamrec.format.codecs import Compression
from streamrec.redact import redact

if TYPE_CHECKING:
    from streamrec.errors import TransientStorageError
    from streamrec.storage.retry import RetryPolicy
    from streamrec.storage.sink_base import ObjectSink, SinkContext

__all__ = [
    "GLOB_CHARS",
    "Leftover",
    "PIECE_BYTES",
    "ObjectInfo",
    "ObjectStore",
    "first_bytes",
    "has_glob",
    "split_scheme",
]

GLOB_CHARS = frozenset("*?[")
PIECE_BYTES = 64 << 10
"""Response bodies are kept in the chunks they arrive in (no copy), chunks smaller than this
joined until they make this size (see ObjectStore.read_range_pieces)."""


@dataclass(frozen=True, repr=False)
class ObjectInfo:
    """One object: its url (scheme as the user spelled it), size in bytes, and version.

    ``version`` is the ETag (S3, HTTP) or generation (GCS) seen when the object was listed;
    every range read is pinned to it, so a replaced object raises ObjectChangedError instead of
    splicing two versions. ``None`` where the store has no versions (local files, memory).
    """

    url: str
    size: int
    version: str | None = None
    records: int | None = None
    """How many records the object holds, where known without reading it (a manifest)."""
    crc32c: int | None = None
    """The CRC-32C (unmasked) of the object's bytes, where known without reading it (a
    manifest): a local copy (the cache) is checked against it before it is served."""
    index: ObjectInfo | None = None
    """The shard's record index sidecar (``<url>.idx``, see :mod:`streamrec.format.index.core`),
    where the listing that found the shard also returned it."""
    index_known: bool = False
    """True when that listing would have returned the sidecar had there been one (a directory
    listing, a glob that also matches it): ``index`` None then means the shard has none,
    without a lookup. False: unknown, look it up."""
    compression: Compression | Literal["unknown"] = "unknown"
    """The codec the object's bytes are stored with, where metadata states it without reading
    them (a manifest, a dataset index): None (stored as is), ``"gzip"`` or ``"zlib"``;
    ``"unknown"`` where nothing states it (the name's suffix, else its first bytes decide;
    see :func:`~streamrec.format.codecs.compression_known`). Stated, not proven: a shard whose
    bytes are not what it says is an error when it is read, never other records."""

    def __repr__(self) -> str:
        # a signed url's signature and token stay out of reprs (tracebacks, logs)
        return (
            f"ObjectInfo(url={redact(self.url)!r}, size={self.size!r}, "
            f"version={self.version!r}, records={self.records!r}, index={self.index!r}, "
            f"index_known={self.index_known!r}, compression={self.compression!r})"
        )


@dataclass(frozen=True)
class Leftover:
    """One unfinished write: what it would have become, what it is, and since when."""

    url: str
    """The object the write would have committed."""
    kind: str
    """``"multipart upload"`` (S3), ``"uncommitted blocks"`` (Azure) or ``"temporary file"``
    (local)."""
    started: float
    """When the write began (Unix time: the upload's initiation, the file's mtime)."""
    handle: str
    """The S3 upload id, the Azure blob name, or the temporary file's path."""

    def age_s(self, now: float | None = None) -> float:
        """Seconds since the write began."""
        return (time.time() if now is None else now) - self.started


def split_scheme(url: str) -> tuple[str, str]:
    """``("s3", "bucket/key")`` for ``s3://bucket/key``; ``("file", path)`` for local paths."""
    if "://" in url:
        scheme, rest = url.split("://", 1)
        return scheme.lower(), rest
    return "file", url


def has_glob(url: str) -> bool:
    """True when ``url`` contains glob characters (``*``, ``?``, ``[``)."""
    return not GLOB_CHARS.isdisjoint(split_scheme(url)[1])


class ObjectStore(abc.ABC):
    """Async access to the objects of one scheme, created inside the event loop that uses it.

    Methods make one attempt and raise :mod:`streamrec.errors` types (translated from the
    client's own exceptions); callers retry :class:`~streamrec.errors.TransientStorageError`
    with a :class:`~streamrec.storage.retry.RetryPolicy`.
    """

    concurrency_limit: int | None = None
    """Most range reads of one object worth having in flight (None: no limit of the store's
    own; a remote store needs many to fill a link, a local disk gains nothing past a few)."""
    direct_reads: bool = False
    """True when the store reads records straight into their final objects (local files:
    ``LocalStore.open_file``); see :mod:`streamrec.pipeline.stream.direct`."""

    lookup_reads_first_bytes: bool = True
    """Whether :meth:`expand` looks a single object up by reading its first bytes (one GET
    that also serves the reader's first block) where the store can, rather than by a HEAD. A
    run that reads through a local cache sets it False (see :class:`StoreSet`): the cache, not
    the object, serves those bytes, so a warm cache costs no GET of a shard."""

    @abc.abstractmethod
    async def expand(self, pattern: str) -> list[ObjectInfo]:
        """Objects matching a url or glob, sorted by name; ObjectNotFoundError if none."""

    def glob_pages(
        self,
        pattern: str,
        retry: RetryPolicy | None = None,
        on_retry: Callable[[TransientStorageError], None] | None = None,
        *,
        warm: bool = True,
    ) -> AsyncGenerator[list[ObjectInfo], None] | None:
        """The objects the glob ``pattern`` matches a listing page at a time, every page's
        names after the previous page's (so the first match of the first page that has one is
        the first of the sorted listing; except where the store lists a tree depth first: an
        Azure hierarchical namespace's flat listing), as :meth:`expand` would list them all
        (callers sort them); None when this store cannot list ``pattern`` so (callers then use
        :meth:`expand`). Raises
        translated errors, and a :class:`~streamrec.errors.StorageError` for a broken
        listing (a key twice, keys out of order, a continuation token again); an empty
        listing is simply no object (no error).

        With ``retry``, each page is a request of its own under that policy (timed, and
        retried from its own continuation token; ``on_retry`` told each retry): a listing of
        many pages is not bounded by one attempt's time. Without, one attempt per page.
        ``warm``: the objects are read next (a store may open the first read's connection
        beside the listing)."""
        return None

    @abc.abstractmethod
    async def read_range(self, obj: ObjectInfo, start: int, end: int) -> bytes:
        """Bytes ``start:end`` of ``obj`` (may be fewer when the server sends a short body)."""

    async def read_range_pieces(self, obj: ObjectInfo, start: int, end: int) -> list[bytes]:
        """Bytes ``start:end`` of ``obj`` as consecutive pieces (fewer bytes on a short body).

        Stores that read a body off the network keep it in the pieces it arrives in (small
        ones joined up to :data:`PIECE_BYTES`), so a block is never held twice (the chunks
        plus their join) nor copied once more; the prefetching reader hands pieces on.
        """
        return [await self.read_range(obj, start, end)]

    def pin(self, obj: ObjectInfo) -> None:  # noqa: B027 - optional hook
        """Keep every read of ``obj`` on the object as it is now, until :meth:`unpin` (one
        call each): a reader pins the object it reads, so that an object replaced meanwhile
        is never spliced. Stores that pin each read to ``obj.version`` (an ObjectChangedError
        when it changed) need nothing more; local files keep a descriptor open."""

    def unpin(self, obj: ObjectInfo) -> None:  # noqa: B027 - optional hook
        """Undo one :meth:`pin` of ``obj``."""

    def read_range_cached(self, obj: ObjectInfo, start: int, end: int) -> list[bytes] | None:
        """Bytes ``start:end`` as pieces when the store already holds them (the first bytes
        of an object it looked up by reading them), else None; never does I/O."""
        return None

    def open_sink(self, url: str, context: SinkContext | None = None) -> ObjectSink:
        """A sink that makes the object ``url`` appear only once it is complete.

        ``context`` (part size, upload window, retry policy) is shared by the sinks of one
        writer. Stores that cannot write raise :class:`~streamrec.errors.StorageError`.
        """
        from streamrec.errors import StorageError

        raise StorageError(f"{url}: this store cannot write objects")

    async def delete(self, url: str) -> None:
        """Remove the object ``url`` if it exists (no error when it does not). Stores that
        cannot write raise :class:`~streamrec.errors.StorageError`."""
        from streamrec.errors import StorageError

        raise StorageError(f"{url}: this store cannot remove objects")

    async def unfinished_writes(self, prefix: str) -> list[Leftover]:
        """What killed writers left unfinished under the url ``prefix`` (never visible as
        objects: open multipart uploads, temporary files); stores with none, or that cannot
        list them, give []. See :mod:`streamrec.storage.leftovers`."""
        return []

    async def abort_unfinished(self, leftover: Leftover) -> None:
        """Abort or remove one of :meth:`unfinished_writes` (already gone: nothing to do)."""
        raise NotImplementedError(f"{leftover.url}: this store leaves no unfinished writes")

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections; the store is unusable afterwards."""


def first_bytes(pieces: list[bytes], size: int) -> list[bytes]:
    """The first ``size`` bytes of ``pieces`` (a body kept in pieces), still in pieces."""
    out: list[bytes] = []
    for piece in pieces:
        if size <= 0:
            break
        out.append(piece if len(piece) <= size else piece[:size])
        size -= len(out[-1])
    return out
