"""``ds.stats.report()``: where an iteration's time went, as a short table, and the one thing
to change first.

The consumer's wall-clock time splits in two: waiting for records and its own loop (the rest
of ``iterate_s``). It waits for ``wait_s`` (records from the read engine: storage, framing)
and for ``parse_s`` (a parse or batch decodes when the consumer asks for its next item).
Inside the reader, time is busy time: storage reads overlap (their seconds add up past the
wall clock), framing and parsing run on the reading thread. The verdict follows from those
shares:

* the consumer waited for less than a fifth of the time: reading is not the bottleneck;
* else, framing and parsing kept the reading thread busy for more than half of the wall
  clock: the CPU is (read in more processes);
* else storage is. Where the stores timed each read's first byte (remote stores), the
  verdict says which part of the read time dominates: waiting for the first byte (latency:
  more reads in flight) or the transfer after it (bandwidth: larger blocks, unless the link
  is full); else (local files) it names both settings.

Where the reader tuned its block size and reads in flight to the link (settings not given:
:mod:`streamrec.pipeline.stream.tune`), a line says what it chose and why
(``settings["tuned"]``: 1 measured in this read, 2 started from what an earlier read of the
store learned; ``tuned_rtt_ms``, ``tuned_mbps``: the link it decided on).
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["render_report", "verdict"]

WAITING_MATTERS = 0.2
"""Share of the wall clock the consumer must wait for records before reading is the
bottleneck."""
CPU_BOUND = 0.5
"""Share of the wall clock the reading thread must spend framing and parsing before the CPU,
not storage, is what the consumer waits for."""
LATENCY_BOUND = 0.5
"""Share of the read time spent waiting for first bytes past which storage is latency-bound."""


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _waited(stats: Mapping[str, float]) -> float:
    return stats["wait_s"] + stats["parse_s"]


def verdict(stats: Mapping[str, float], settings: Mapping[str, int]) -> str:
    """The bottleneck in one sentence."""
    wall = stats["iterate_s"]
    if wall <= 0:
        return "nothing iterated yet: iterate the dataset, then ask again"
    waited = min(1.0, _waited(stats) / wall)
    if waited < WAITING_MATTERS:
        return (
            f"your loop: the consumer waited for records {waited:.0%} of the time; reading is "
            "not the bottleneck"
        )
    busy = (stats["framing_s"] + stats["parse_s"]) / wall
    if busy > CPU_BOUND:
        return (
            f"CPU: the consumer waited {waited:.0%} of the time while framing, CRCs and "
            f"parsing kept the reading thread busy {min(1.0, busy):.0%} of it; read in more "
            "processes (DataLoader workers, one dataset per rank)"
        )
    now = ""
    if "max_concurrency" in settings and "block_bytes" in settings:
        block = _size(settings["block_bytes"])
        now = f" (now {settings['max_concurrency']} reads of {block})"
    first, read = stats.get("first_byte_s", 0.0), stats["storage_s"]
    if first <= 0 or read <= 0:  # (local files: no first byte timed)
        return (
            f"storage: the consumer waited for data {waited:.0%} of the time; raise "
            f"max_concurrency or block_bytes{now}"
        )
    latency = min(1.0, first / read)
    if latency > LATENCY_BOUND:
        return (
            f"storage: the consumer waited for data {waited:.0%} of the time, and most read "
            f"time ({latency:.0%}) is waiting for the first byte: raise max_concurrency{now}"
        )
    rate = _size(stats["bytes_fetched"] / wall)
    return (
        f"transfer: the consumer waited for data {waited:.0%} of the time, and most read time "
        f"({1 - latency:.0%}) is moving bytes ({rate}/s): raise block_bytes{now}, unless the "
        "link is full"
    )


def render_report(stats: Mapping[str, float], settings: Mapping[str, int]) -> str:
    """The table and the verdict (see the module docstring)."""
    wall = stats["iterate_s"]
    records, read = stats["records"], stats["bytes_read"]
    lines = [
        f"streamrec: {records:,.0f} records in {wall:.1f} s"
        + (f" ({records / wall:,.0f}/s, {_size(read / wall)}/s)" if wall > 0 else "")
    ]

    def row(what: str, seconds: float, note: str = "", shared: bool = True) -> None:
        share = f"{seconds / wall:>5.0%}" if wall > 0 and shared else "     "
        lines.append(f"  {what:<26}{seconds:>9.2f} s {share}  {note}".rstrip())

    waited = min(_waited(stats), wall)
    row("waiting for records", waited)
    row("the consumer's own loop", max(0.0, wall - waited))
    lines.append("  inside the reader (busy time; reads overlap):")
    row("listing, dataset index", stats["listing_s"])
    requests = stats["requests"]
    per = f"{requests:,.0f} reads"
    if requests:
        each_ms = stats["storage_s"] / requests * 1000
        per += f" of {_size(stats['bytes_fetched'] / requests)}, {each_ms:.0f} ms each"
    if wall > 0:
        per += f", {stats['storage_s'] / wall:.1f} in flight on average"
    row("storage reads", stats["storage_s"], per, shared=False)
    first = stats.get("first_byte_s", 0.0)
    if first > 0:
        row("  until the first byte", first, "latency, connecting included", shared=False)
        row("  transfer", max(0.0, stats["storage_s"] - first), shared=False)
    inflate = stats.get("inflate_s", 0.0)
    if inflate > 0:
        row("framing, CRC", max(0.0, stats["framing_s"] - inflate))
        row("inflate", inflate)
    else:
        row("framing, CRC, inflate", stats["framing_s"])
    row("Example parsing", stats["parse_s"])
    lines.append(
        f"  requests: {requests:,.0f} shard reads, {stats.get('list_requests', 0):,.0f} "
        f"listing pages, {stats.get('metadata_requests', 0):,.0f} metadata reads"
    )
    if read:
        lines.append(
            f"  bytes fetched {_size(stats['bytes_fetched'])} for {_size(read)} read "
            f"({stats['bytes_fetched'] / read:.2f}x), {stats['retries']:,.0f} retries"
        )
    if settings.get("tuned") and "block_bytes" in settings:
        why = "measured" if settings["tuned"] == 1 else "learned from an earlier read"
        if "tuned_rtt_ms" in settings:
            why += (
                f": first bytes {settings['tuned_rtt_ms']} ms, "
                f"{settings.get('tuned_mbps', 0)} MB/s a connection"
            )
        lines.append(
            f"  read-ahead tuned to the link: up to {settings['max_concurrency']} reads of "
            f"{_size(settings['block_bytes'])} per shard ({why})"
        )
    lines.append(f"bottleneck: {verdict(stats, settings)}")
    return "\n".join(lines)
