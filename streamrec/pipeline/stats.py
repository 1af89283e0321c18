"""Counters a dataset keeps while it runs, so a user can see where time and data go."""

from __future__ import annotations

from dataclasses import asdict, dataclass

__all__ = ["Stats"]


@dataclass
class Stats:
    """What a dataset has done so far (cumulative over its iterations)."""

    bytes_read: int = 0
    """Bytes read from storage, as stored (compressed bytes for compressed shards)."""
    records: int = 0
    """Records decoded and handed on."""
    corrupt_skipped: int = 0
    """Damaged records or shard tails dropped under ``on_corrupt="skip"``."""
    shards_opened: int = 0
    """Shards whose reading began."""

    def as_dict(self) -> dict[str, int]:
        """The counters as a plain dict (for logging or JSON)."""
        return asdict(self)
