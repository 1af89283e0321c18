"""Counters a dataset keeps while it runs, so a user can see where time and data go."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncGenerator, Callable, Mapping
from contextlib import aclosing
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, TypeVar

from streamrec._portal import owned_generator
from streamrec.pipeline.stats_report import render_report
from streamrec.storage.timing import recording

if TYPE_CHECKING:
    from streamrec.pipeline.options import ReadOptions

__all__ = ["Stats", "clocked", "settings_of"]

T = TypeVar("T")
logger = logging.getLogger("streamrec.stats")


@dataclass
class Stats:
    """What a dataset has done so far (cumulative over its iterations)."""

    bytes_read: int = 0
    """Bytes of the records read: as stored (compressed bytes for compressed shards) when
    shards stream; for reads by index (``shuffle``, ``even``, ``ds.get()``), the framed
    (uncompressed) bytes of the distinct records asked for."""
    bytes_fetched: int = 0
    """Bytes of the completed reads storage answered: equal to ``bytes_read`` when shards
    stream; for reads by index, with the neighbours and gaps a coalesced read takes along and
    the reads that check an index against its shard. For uncompressed shards,
    ``(bytes_fetched - bytes_checked) / bytes_read`` is the read amplification, at most
    ``open_dataset``'s ``max_read_amplification``."""
    bytes_checked: int = 0
    """Of ``bytes_fetched``, those read to check a record index against its shard (the
    entries before a record, once per shard and process, or host for remote shards)."""
    records: int = 0
    """Records handed to the consumer (through ``for``/``async for``, a chunk, a parse or batch
    wrapper): what the training loop has seen, resumed iterations included only from where
    they resumed."""
    records_read: int = 0
    """Records decoded from storage: read ahead but not yet handed out, read again to resume
    (a shard's prefix, the shuffle buffer) or held in the shuffle buffer included; for reads
    by index, every record their range reads decoded (neighbours read along included)."""
    corrupt_skipped: int = 0
    """Damaged records or shard tails dropped under ``on_corrupt="skip"``."""
    shards_opened: int = 0
    """Shards whose reading began."""
    cache_hits: int = 0
    """Shards read from the local cache (``cache_dir``) instead of their store."""
    retries: int = 0
    """Storage requests retried after a transient fault (short reads included)."""
    peak_prefetch_bytes: int = 0
    """Most bytes held read-ahead at once: fetched, or decoded and not yet taken by the
    consumer (bounded by prefetch_bytes plus one block per stream the consumer waits on; a
    record larger than the budget is held whole, one per open shard; for ``ds.get()`` by
    prefetch_bytes, unless a single read is larger than all of it)."""
    wait_s: float = 0.0
    """Seconds the consumer spent waiting for records (storage or decoding was the bottleneck)."""
    iterate_s: float = 0.0
    """Wall-clock seconds of the iterations so far (``for`` / ``async for`` over the dataset or
    any transform of it), from the start of each to its last record: the consumer's own time
    is ``iterate_s - wait_s``."""
    listing_s: float = 0.0
    """Seconds spent listing shards and loading the dataset index (each iteration lists)."""
    requests: int = 0
    """Range reads of shards sent to storage (coalesced reads and index checks included;
    retries of one read count once)."""
    storage_s: float = 0.0
    """Seconds those reads took, from asking to the last byte, summed: reads overlap, so this
    exceeds the wall-clock time when ``max_concurrency`` > 1."""
    first_byte_s: float = 0.0
    """Of ``storage_s``, the seconds until each read's answer began (its headers; a new
    connection's set-up included): the latency part; ``storage_s - first_byte_s`` is the
    transfer. Remote stores only (local reads have no first byte: 0)."""
    list_requests: int = 0
    """Pages of S3, GCS and Azure listings asked for (one request each; retries of a page count
    once); other listings (local directories, http indexes) are not counted."""
    metadata_requests: int = 0
    """Reads of metadata: manifests, record index sidecars, the dataset index, the first bytes
    of a shard whose compression is looked at (retries count once)."""
    framing_s: float = 0.0
    """Seconds the reading thread spent in the format core: framing records, checking CRCs,
    inflating GZIP / ZLIB."""
    inflate_s: float = 0.0
    """Of ``framing_s``, the seconds spent inflating compressed shards as they stream (reads by
    index count their inflating in ``framing_s`` only)."""
    parse_s: float = 0.0
    """Seconds spent decoding Examples (``parse`` / ``batch`` / ``to_arrow``)."""
    settings: dict[str, int] = field(default_factory=dict, repr=False, compare=False)
    """What the dataset reads with (``max_concurrency``, ``block_bytes``, ``prefetch_bytes``),
    quoted by :meth:`report`; not a counter (left out of :meth:`as_dict`). Where the reader
    tuned the first two to the link (not given), they are its latest choice and ``tuned`` is
    1 (measured in this read) or 2 (started from what an earlier read of the same store
    learned), ``tuned_rtt_ms`` / ``tuned_mbps`` the link it decided on: first-byte latency
    and one connection's rate (:mod:`streamrec.pipeline.stream.tune`)."""

    def count_read(self, seconds: float) -> None:
        """One range read of a shard, which took ``seconds``."""
        self.requests += 1
        self.storage_s += seconds

    def as_dict(self) -> dict[str, float]:
        """The counters as a plain dict (for logging or JSON)."""
        counters: dict[str, float] = asdict(self)
        del counters["settings"]
        return counters

    def json_line(self) -> str:
        """The counters as one line of JSON (keys sorted), for logs."""
        return json.dumps(self.as_dict(), sort_keys=True)

    def report(self, settings: Mapping[str, int] | None = None) -> str:
        """A short table of where the time went, and one sentence naming the bottleneck.

        ``settings`` (``max_concurrency``, ``block_bytes``: what the dataset reads with; a
        dataset's ``stats`` passes its own) are quoted in the advice.
        """
        return render_report(self.as_dict(), self.settings if settings is None else settings)


def settings_of(options: ReadOptions) -> dict[str, int]:
    """What :meth:`Stats.report` quotes of a dataset's options."""
    names = ("max_concurrency", "block_bytes", "prefetch_bytes")
    return {name: int(getattr(options, name)) for name in names}


@owned_generator
async def clocked(
    pieces: AsyncGenerator[T, None],
    sink: Stats,
    current: Callable[[], Stats] | None = None,
    interval_s: float | None = None,
) -> AsyncGenerator[T, None]:
    """``pieces``, with the iteration's wall clock added to ``sink.iterate_s`` piece by piece
    (the consumer's time included: it runs while this generator waits at its yield; stats
    read mid-epoch are current; an iteration closed early counts up to its close), and
    ``current()`` logged as a JSON line every ``interval_s`` seconds and when it ends. The
    requests ``pieces`` sends are counted in ``sink`` (:mod:`streamrec.storage.timing`)."""
    last = time.perf_counter()
    next_log = last + (interval_s or 0.0)
    try:
        async with aclosing(pieces) as source:
            while True:
                # the requests sent meanwhile (by the tasks started meanwhile too) are the
                # sink's: set around each step only, so the consumer's context stays its own
                with recording(sink):
                    try:
                        piece = await anext(source)
                    except StopAsyncIteration:
                        break
                now = time.perf_counter()
                sink.iterate_s += now - last
                last = now
                if current is not None and interval_s is not None and now >= next_log:
                    logger.info("%s", current().json_line())
                    next_log = now + interval_s
                yield piece
    finally:
        sink.iterate_s += time.perf_counter() - last
        if current is not None and interval_s is not None:
            logger.info("%s", current().json_line())
