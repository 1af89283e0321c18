"""Counters a dataset keeps while it runs, so a user can see where time and data go."""

from __future__ import annotations

from dataclasses import asdict, dataclass

__all__ = ["Stats"]


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

    def as_dict(self) -> dict[str, float]:
        """The counters as a plain dict (for logging or JSON)."""
        return asdict(self)
