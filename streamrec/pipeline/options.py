"""How a dataset reads: every ``open_dataset`` setting, validated once, frozen.

:class:`ReadOptions` is what the engine, the shard opener and the state receive; the
:class:`~streamrec.pipeline.dataset.Dataset` (the user's object) holds one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from streamrec.errors import ArgumentError
from streamrec.format.codecs import normalize_compression
from streamrec.format.framing import OnCorrupt
from streamrec.pipeline.arguments import (
    check_bool,
    check_choice,
    check_int,
    check_optional_int,
    check_optional_ratio,
    check_url,
)
from streamrec.storage.registry import is_per_scheme
from streamrec.storage.retry import RetryPolicy

__all__ = [
    "CONFIG_KEYS",
    "DEFAULT_GAP_BYTES",
    "DEFAULT_MAX_READ_AMPLIFICATION",
    "FOR_CHUNK_BYTES",
    "ReadOptions",
    "read_ahead",
]

#: The settings a resume state must agree on (the order of records depends on them).
CONFIG_KEYS = (
    "compression",
    "on_corrupt",
    "cycle_length",
    "block_length",
    "deterministic",
    "shuffle_shards",
    "shuffle_buffer",
    "seed",
    "num_hosts",
    "host_index",
    "shuffle",
    "even",
    "window_records",
)

# Records closer than this share one range read. Cutting at every gap wider than G is what
# minimises a cost of ``requests x a + bytes x b`` for G = a / b: on a cloud link (60 ms round
# trips, 16 reads in flight, ~125 MB/s) a request costs about what 470 KB cost; locally, the
# pipeline's own per-read overhead makes small gaps slower too. Measured (bench_resume.py,
# benchmarks/README.md): 256 KiB re-reads 24-31 % fewer bytes than 1 MiB did, with the fewest
# modelled seconds.
DEFAULT_GAP_BYTES = 256 << 10

# Reads by index bridge a gap only while the bytes fetched stay within this many times the
# bytes wanted (format/span.py's coalesce). Without it a sparse chunk of small records (a
# global shuffle's: 1 in ~130 records of each shard) read its shards nearly whole, 17-250x
# the bytes handed on: on a cloud, downloaded and paid for. Within 2x, sparse small records
# are read alone: more requests, which the reads in flight overlap.
DEFAULT_MAX_READ_AMPLIFICATION = 2.0

FOR_CHUNK_BYTES = 2 << 20
"""``chunk_bytes`` of a blocking ``for``: each chunk crosses from the loop's thread to the
consumer's, a hand-over of ~65 us of CPU (thread switches) that ``async for`` does not pay;
2 MiB chunks halve their number for 2 MiB more of record lists (benchmarks/README.md)."""


@dataclass(frozen=True)
class ReadOptions:
    """The settings of ``open_dataset`` (documented there), checked on construction."""

    compression: str | None = "auto"
    verify_crc: bool = True
    on_corrupt: OnCorrupt = "raise"
    prefetch_bytes: int = 64 << 20
    block_bytes: int = 4 << 20
    max_concurrency: int = 16
    tune_block_bytes: bool = False
    """``block_bytes`` is a starting point the reader may lower to its link (not given by the
    user: see :mod:`streamrec.pipeline.stream.tune`)."""
    tune_max_concurrency: bool = False
    """Likewise ``max_concurrency``, which it may raise (within ``prefetch_bytes``)."""
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    # (credentials: never in the repr)
    storage_options: dict[str, Any] | None = field(default=None, repr=False)
    cycle_length: int = 1
    block_length: int = 1
    deterministic: bool = True
    shuffle_shards: bool = False
    shuffle_buffer: int = 0
    seed: int = 0
    num_hosts: int = 1
    host_index: int = 0
    allow_absolute_urls: bool = False
    shuffle: Literal["global", "block"] | None = None
    even: bool | Literal["drop", "pad"] | None = None
    window_records: int | None = None
    cache_dir: str | None = None
    cache_bytes: int | None = None
    max_read_amplification: float | None = DEFAULT_MAX_READ_AMPLIFICATION
    stats_interval_s: float | None = None
    chunk_bytes: int = 1 << 20
    """Most bytes of arrived pieces decoded into one chunk of records (not an
    ``open_dataset`` setting: the blocking ``for`` asks for larger chunks, see dataset.py)."""
    record_spans: bool = False
    """Chunks may leave their records in place (:class:`~streamrec.format.payload.RecordSpans`,
    no ``bytes`` object per record): not an ``open_dataset`` setting, asked for by a consumer
    that decodes whole chunks or batches (``parse``, ``parse().batch()``)."""

    def __post_init__(self) -> None:
        self._check_types()
        if self.cache_dir is not None:
            if "://" in self.cache_dir and not self.cache_dir.startswith("file://"):
                raise ValueError(f"cache_dir must be a local directory, not {self.cache_dir!r}")
            object.__setattr__(self, "cache_dir", self.cache_dir.removeprefix("file://"))
            if self.cache_bytes is None:
                raise ValueError("cache_dir needs cache_bytes: the most bytes the cache may hold")
        elif self.cache_bytes is not None:
            raise ValueError("cache_bytes without cache_dir: say where the cache lives")
        if self.indexed and (self.cycle_length > 1 or self.shuffle_shards):
            raise ValueError(
                "shuffle='global'/'block' and even read records by index, in an order of their "
                "own: cycle_length and shuffle_shards do not apply"
            )
        if self.shuffle == "global" and self.shuffle_buffer:
            raise ValueError("shuffle='global' is a full permutation: no shuffle_buffer")
        is_per_scheme(self.storage_options)  # options that mix scheme and option keys fail
        if not self.host_index < self.num_hosts:
            raise ArgumentError(
                f"host_index must be in [0, {self.num_hosts}), not {self.host_index}"
            )

    def _check_types(self) -> None:
        """Every setting's type and range, naming it (ArgumentError), before any other rule;
        integers are stored as ``int`` (numpy integers are accepted)."""
        ints = {
            "prefetch_bytes": 1,
            "block_bytes": 1,
            "max_concurrency": 1,
            "cycle_length": 1,
            "block_length": 1,
            "num_hosts": 1,
            "chunk_bytes": 1,
            "shuffle_buffer": 0,
            "host_index": 0,
            "seed": None,
        }
        for name, minimum in ints.items():
            number = check_int(getattr(self, name), name, minimum=minimum)
            object.__setattr__(self, name, number)
        for name in ("window_records", "cache_bytes"):
            optional = check_optional_int(getattr(self, name), name, minimum=1)
            object.__setattr__(self, name, optional)
        bools = ("verify_crc", "deterministic", "shuffle_shards", "allow_absolute_urls")
        for name in (*bools, "tune_block_bytes", "tune_max_concurrency"):
            object.__setattr__(self, name, check_bool(getattr(self, name), name))
        ratio = check_optional_ratio(
            self.max_read_amplification, "max_read_amplification", minimum=1.0
        )
        object.__setattr__(self, "max_read_amplification", ratio)
        interval = check_optional_ratio(self.stats_interval_s, "stats_interval_s", minimum=0.001)
        object.__setattr__(self, "stats_interval_s", interval)
        if self.compression is not None and not isinstance(self.compression, str):
            raise ArgumentError(
                f"compression must be 'auto', None, 'gzip' or 'zlib', not {self.compression!r}"
            )
        try:
            normalize_compression(self.compression)
        except ValueError as exc:
            raise ArgumentError(f"compression: {exc}") from None
        check_choice(self.on_corrupt, "on_corrupt", ("raise", "skip"))
        check_choice(self.shuffle, "shuffle", (None, "global", "block"))
        check_choice(self.even, "even", (None, False, True, "drop", "pad"))
        if not isinstance(self.retry, RetryPolicy):
            raise ArgumentError(
                f"retry must be a streamrec RetryPolicy or None, not {type(self.retry).__name__}"
            )
        options = self.storage_options
        if options is not None and not isinstance(options, Mapping):
            raise ArgumentError(
                f"storage_options must be a mapping (dict) or None, not {type(options).__name__}"
            )
        if self.cache_dir is not None:
            object.__setattr__(self, "cache_dir", check_url(self.cache_dir, "cache_dir"))

    @property
    def indexed(self) -> bool:
        """True when records are read by index (shuffle global/block, even)."""
        return self.shuffle is not None or self.even not in (None, False)

    @property
    def even_mode(self) -> Literal["drop", "pad"] | None:
        """``even`` as what it does (True: ``"pad"``, as DistributedSampler's default)."""
        if self.even is True:
            return "pad"
        if self.even in (None, False):
            return None
        return self.even  # type: ignore[return-value]

    def config(self) -> dict[str, Any]:
        """The settings a resume state records and must match (:data:`CONFIG_KEYS`). Indexed
        reading leaves the host split out: its states say which consumer saved them, and
        merged states continue on any number of hosts."""
        config = {key: getattr(self, key) for key in CONFIG_KEYS}
        if self.indexed:
            del config["num_hosts"], config["host_index"]
        return config


def read_ahead(block_bytes: int | None, max_concurrency: int | None) -> dict[str, Any]:
    """``open_dataset``'s two read-ahead settings as :class:`ReadOptions` fields: one not given
    (None) starts at its default and is tuned to the link (:mod:`streamrec.pipeline.stream.
    tune`); one given is kept."""
    defaults = ReadOptions.__dataclass_fields__
    return {
        "block_bytes": defaults["block_bytes"].default if block_bytes is None else block_bytes,
        "max_concurrency": (
            defaults["max_concurrency"].default if max_concurrency is None else max_concurrency
        ),
        "tune_block_bytes": block_bytes is None,
        "tune_max_concurrency": max_concurrency is None,
    }
