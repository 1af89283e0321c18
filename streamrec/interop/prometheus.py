"""A dataset's counters as Prometheus metrics (``pip install prometheus-client``)::

    from prometheus_client import REGISTRY, start_http_server
    from streamrec.interop.prometheus import to_prometheus

    to_prometheus(ds, REGISTRY, labels={"job": "train"})
    start_http_server(9100)

Each scrape reads ``ds.stats`` (no thread, no timer, nothing kept between scrapes): counters
``streamrec_records_total``, ``streamrec_records_read_total``, ``streamrec_bytes_total``
(label ``kind``: ``read``, ``fetched``, ``checked``), ``streamrec_requests_total`` (range
reads of shards), ``streamrec_list_requests_total`` (listing pages),
``streamrec_metadata_requests_total``, ``streamrec_retries_total``,
``streamrec_corrupt_skipped_total``, ``streamrec_shards_opened_total``,
``streamrec_cache_hits_total`` and ``streamrec_seconds_total`` (label ``stage``: ``iterate``,
``wait``, ``listing``, ``storage``, ``first_byte`` (of ``storage``), ``framing``, ``inflate``
(of ``framing``), ``parse``), and the gauge ``streamrec_peak_prefetch_bytes``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

try:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
except ImportError as error:  # pragma: no cover - the test extra installs it
    raise ImportError(
        "streamrec.interop.prometheus needs prometheus-client: pip install prometheus-client"
    ) from error

__all__ = ["StatsCollector", "to_prometheus"]

_COUNTERS = {
    "records": "Records handed to the consumer.",
    "records_read": "Records decoded from storage.",
    "requests": "Range reads of shards sent to storage.",
    "list_requests": "Listing pages asked for.",
    "metadata_requests": "Reads of manifests, index sidecars, the dataset index, shard heads.",
    "retries": "Storage requests retried after a transient fault.",
    "corrupt_skipped": "Damaged records or shard tails dropped (on_corrupt='skip').",
    "shards_opened": "Shards whose reading began.",
    "cache_hits": "Shards read from the local cache.",
}
_BYTES = {"read": "bytes_read", "fetched": "bytes_fetched", "checked": "bytes_checked"}
_STAGES = {
    "iterate": "iterate_s",
    "wait": "wait_s",
    "listing": "listing_s",
    "storage": "storage_s",
    "first_byte": "first_byte_s",
    "framing": "framing_s",
    "inflate": "inflate_s",
    "parse": "parse_s",
}


class StatsCollector:
    """A Prometheus collector of one dataset's (or mix's, or transform's) ``stats``."""

    def __init__(
        self, dataset: Any, prefix: str = "streamrec", labels: Mapping[str, str] | None = None
    ) -> None:
        self.dataset = dataset
        self.prefix = prefix
        self.labels = dict(labels or {})

    def collect(self) -> Iterator[Any]:
        """The metrics, read from ``dataset.stats`` now."""
        stats = self.dataset.stats.as_dict()
        names, values = list(self.labels), list(self.labels.values())
        for key, text in _COUNTERS.items():
            family = CounterMetricFamily(f"{self.prefix}_{key}", text, labels=names)
            family.add_metric(values, stats[key])
            yield family
        yield self._by(stats, "bytes", "Bytes by kind: read, fetched, checked.", "kind", _BYTES)
        text = (
            "Seconds by stage (storage: summed over overlapping reads; first_byte: of storage; "
            "inflate: of framing)."
        )
        yield self._by(stats, "seconds", text, "stage", _STAGES)
        gauge = GaugeMetricFamily(
            f"{self.prefix}_peak_prefetch_bytes",
            "Most bytes held read-ahead at once.",
            labels=names,
        )
        gauge.add_metric(values, stats["peak_prefetch_bytes"])
        yield gauge

    def _by(
        self, stats: Mapping[str, float], name: str, text: str, label: str, keys: Mapping[str, str]
    ) -> Any:
        """One counter family with a value per ``label`` (``keys``: label value -> counter)."""
        values = list(self.labels.values())
        family = CounterMetricFamily(f"{self.prefix}_{name}", text, labels=[*self.labels, label])
        for kind, key in keys.items():
            family.add_metric([*values, kind], stats[key])
        return family


def to_prometheus(
    dataset: Any,
    registry: Any,
    *,
    prefix: str = "streamrec",
    labels: Mapping[str, str] | None = None,
) -> StatsCollector:
    """Register a :class:`StatsCollector` of ``dataset`` with ``registry`` (e.g.
    ``prometheus_client.REGISTRY``) and return it (``registry.unregister(it)`` removes it)."""
    collector = StatsCollector(dataset, prefix, labels)
    registry.register(collector)
    return collector
