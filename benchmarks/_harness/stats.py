"""Best and median: in-process timings, and the results of runs in worker processes."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from . import KIB, MB, MIB

__all__ = ["RunSamples", "Timings"]


@dataclass
class Timings:
    """Seconds of one reader on one input (one per round); the largest peak-RSS growth."""

    seconds: list[float] = field(default_factory=list)
    rss_growth_kib: int | None = None

    def best(self) -> float:
        return min(self.seconds)

    def median(self) -> float:
        return statistics.median(self.seconds)


@dataclass
class RunSamples:
    """All runs of one reader on one dataset in one store: the worker results, each with
    ``seconds`` and ``first`` (to the first record), and where measured ``rss_base`` /
    ``rss_peak`` (KiB), ``stats`` (streamrec's ``ds.stats.as_dict()``), ``cpu`` (seconds) and
    ``conns`` (connections through the emulated link)."""

    runs: list[dict[str, Any]] = field(default_factory=list)

    def mbps(self, nbytes: int) -> list[float]:
        return [nbytes / r["seconds"] / MB for r in self.runs]

    def best(self, nbytes: int) -> float:
        return max(self.mbps(nbytes))

    def median(self, nbytes: int) -> float:
        return statistics.median(self.mbps(nbytes))

    def first_median(self) -> float:
        return float(statistics.median(r["first"] for r in self.runs))

    def rss_growth_mib(self) -> float | None:
        growth = [
            (r["rss_peak"] - r["rss_base"]) / KIB
            for r in self.runs
            if r.get("rss_peak") is not None and r.get("rss_base") is not None
        ]
        return max(growth) if growth else None

    def peak_prefetch_mib(self) -> float | None:
        peaks = [r["stats"]["peak_prefetch_bytes"] for r in self.runs if "stats" in r]
        return max(peaks) / MIB if peaks else None

    def retries(self) -> int | None:
        counts = [r["stats"]["retries"] for r in self.runs if "stats" in r]
        return sum(counts) if counts else None

    def wait_share(self) -> float | None:
        """Median share of the read that the consumer spent waiting (streamrec's wait_s)."""
        shares = [r["stats"]["wait_s"] / r["seconds"] for r in self.runs if "stats" in r]
        return statistics.median(shares) if shares else None

    def cpu_share(self) -> float | None:
        """Median CPU time of the reader process over the read's wall time (1.0 = one core)."""
        shares = [r["cpu"] / r["seconds"] for r in self.runs if "cpu" in r]
        return statistics.median(shares) if shares else None

    def conns_median(self) -> float | None:
        counts = [r["conns"] for r in self.runs if "conns" in r]
        return statistics.median(counts) if counts else None
