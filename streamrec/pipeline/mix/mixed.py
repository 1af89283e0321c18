"""``streamrec.mix``: records drawn from several datasets by weight, deterministic, resumable.

A :class:`MixedDataset` reads every source with its own pipeline (its own stores, options and
prefetch budget) and hands on, at each draw, a record of the source that draw picks
(:mod:`streamrec.pipeline.mix.order`: a pure function of ``(seed, epoch, draw number, active
sources)``, computed in numpy windows). Records move in chunks: each source's next chunk is
pulled only when the draws have used up the one in hand, and the records of a run of draws are
gathered from the sources' chunks by numpy indexing, not one Python step per record.

Concurrency: every source's reads run in the background as its own pipeline does (its range
reads are requested up to its ``prefetch_bytes`` ahead and completed while the mix takes
records from the others); the sources' first chunks are fetched concurrently. Decoding
happens when the mix pulls a chunk.

Memory: each source keeps its own prefetch budget (``prefetch_bytes`` of its
``open_dataset``), so the mix's read-ahead is at most the sum of its sources' budgets, plus one
decoded chunk per source in hand. One budget shared by all sources would let a source the
draws rarely pick fill the room the others need (its read-ahead is handed on only as slowly
as it is drawn), stalling the sources drawn most to one block at a time; per-source budgets
make each source's read-ahead independent of the others. The price: a source that carries
few of the bytes (a small weight, or small records) still reads its whole budget ahead, which
a ``stop="first"`` mix may never consume; give each source a budget in proportion to its share
of the bytes (weight x mean record size), at least a few blocks, to bound the total and that
waste (benchmarks/README.md, bench_mix, measures both).

Exact resume: the mix is read through the same protocol as a dataset (``record_chunks`` with
``auto_consume=False`` and ``mark_consumed(n)``, see
:mod:`streamrec.pipeline.transforms.chainable`), and reads its sources through it too. Every run of
records it hands on is remembered with the draws, exhausted sources and source objects it was made
from; as records are marked consumed, each source is marked with exactly the records of its own
among them. So ``state_dict()`` - the draw counter, which sources are exhausted and every source's
own state - is always the position after the last record consumed, whatever was read ahead.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncGenerator, Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any, Literal, cast

import numpy as np

from streamrec._portal import owned, owned_generator, owning, run_all
from streamrec.pipeline.dataset import Dataset
from streamrec.pipeline.mix.order import (
    Draws,
    IntArray,
    check_weights,
    first_stop_length,
    mix_key,
)
from streamrec.pipeline.mix.state import MIX_STATE_VERSION, parse_mix_state
from streamrec.pipeline.position.state import parse_state
from streamrec.pipeline.position.trackers import Where
from streamrec.pipeline.stats import Stats, clocked
from streamrec.pipeline.transforms.chainable import Chainable
from streamrec.pipeline.transforms.ledger import (
    Consumption,
    handed_out_async,
    handed_out_blocking,
)

__all__ = ["MixedDataset", "Stop", "mix"]

Stop = Literal["first", "all", "never"]


@dataclass(frozen=True)
class _Position:
    """The mix's own position: draws made, sources exhausted, the source objects read."""

    draws: int
    exhausted: tuple[bool, ...]
    sources: tuple[Dataset, ...]


@dataclass
class _Run:
    """Records handed on together: how many, the source of each, where the mix stood."""

    length: int
    choices: IntArray
    start: _Position


class _Passing:
    """The account of the mix's :class:`Consumption` of runs: each source is marked with
    exactly its own records among those consumed; a run consumed moves the mix's position."""

    def __init__(self, mix: MixedDataset) -> None:
        self._mix = mix

    def size(self, run: _Run) -> int:
        return run.length

    def opened(self, run: _Run) -> None:
        pass

    def consumed(self, run: _Run, start: int, stop: int) -> None:
        sources = run.start.sources
        counts = np.bincount(run.choices[start:stop], minlength=len(sources))
        for i in np.flatnonzero(counts):
            sources[i].mark_consumed(int(counts[i]))

    def closed(self, run: _Run) -> None:
        self._mix._at = dataclasses.replace(run.start, draws=run.start.draws + run.length)


class _Source:
    """One source being read: its chunks, and the part of the current one not drawn yet."""

    def __init__(self, dataset: Dataset, report: Callable[[], None]) -> None:
        self.dataset = dataset
        self._report = report
        self._chunks: AsyncGenerator[list[bytes], None] | None = None
        self._chunk: list[bytes] = []
        self._start = 0
        self.done = False

    @property
    def available(self) -> int:
        return len(self._chunk) - self._start

    async def fill(self) -> bool:
        """Pull the next chunk (the one in hand is used up); False at the source's end."""
        if self.done:
            return False
        if self._chunks is None:
            chunks = self.dataset.record_chunks(auto_consume=False, report_consumed=self._report)
            # (lists: chunks in place are asked for with in_place=True only)
            self._chunks = owned(cast(AsyncGenerator[list[bytes], None], chunks))
        try:
            self._chunk = await anext(self._chunks)
        except StopAsyncIteration:
            self._chunk, self._start, self.done = [], 0, True
            return False
        self._start = 0
        return True

    def take(self, n: int) -> list[bytes]:
        start = self._start
        self._start = start + n
        if start == 0 and n == len(self._chunk):
            return self._chunk
        return self._chunk[start : start + n]

    async def aclose(self) -> None:
        if self._chunks is not None:
            await self._chunks.aclose()


def _gather(choices: IntArray, sources: Sequence[_Source]) -> list[bytes]:
    """The records of a run of draws, in draw order, taken from the sources' chunks."""
    counts = np.bincount(choices, minlength=len(sources))
    used = np.flatnonzero(counts)
    if len(used) == 1:
        return sources[int(used[0])].take(len(choices))
    parts = [sources[int(i)].take(int(counts[i])) for i in used]
    out = np.empty(len(choices), dtype=object)
    # positions grouped by source (stable: each source's in draw order) get its records
    out[np.argsort(choices, kind="stable")] = list(chain.from_iterable(parts))
    records: list[bytes] = out.tolist()
    return records


class MixedDataset(Chainable[bytes]):
    """Records drawn from several datasets by weight (see :func:`mix`).

    Iterate with ``async for`` or ``for``; the transforms (``.parse(spec)``, ``.batch(n)``,
    ``.map(fn)``, ``.filter``, ``.take``, ``.skip``, ``.repeat``, ``.unbatch``) work as on a
    :class:`~streamrec.Dataset` (:class:`~streamrec.pipeline.transforms.chainable.Chainable`);
    ``state_dict()`` / ``load_state_dict()`` resume exactly; ``set_epoch(e)`` sets every source
    to epoch ``e`` and the draws to ``(seed, e)``; ``split_hosts`` splits every source (the
    PyTorch adapter's DDP split); DataLoader workers split each source, and each worker mixes
    its shares.
    """

    def __init__(
        self,
        datasets: Sequence[Dataset],
        weights: Sequence[float] | None = None,
        seed: int = 0,
        stop: Stop = "first",
    ) -> None:
        self.datasets = list(datasets)
        """The sources (after a ``stop="never"`` restart, reading goes on in copies of them)."""
        if not all(isinstance(ds, Dataset) for ds in self.datasets):
            kinds = sorted({type(ds).__name__ for ds in self.datasets})
            raise TypeError(f"mix takes streamrec Datasets (open_dataset), not {kinds}")
        if len({id(ds) for ds in self.datasets}) != len(self.datasets):
            raise ValueError("mix: a dataset appears twice (open it twice to mix it with itself)")
        self.weights = check_weights(weights, len(self.datasets))
        """The weights, normalised to sum to 1."""
        if stop not in ("first", "all", "never"):
            raise ValueError(f"stop must be 'first', 'all' or 'never', not {stop!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an int, not {seed!r}")
        self.seed = seed
        self.stop: Stop = stop
        self.epoch = 0
        self._resume: _Position | None = None  # loaded, for the next iteration
        self._finished = False
        self._at = self._start_position()  # after the last record consumed
        self._runs: Consumption[_Run] | None = None  # handed on, not all consumed yet
        self._copies: list[Dataset] = []  # restarted sources (stop="never"), for stats
        self._retired = Stats()  # the counters of copies read to their end (then dropped)
        self._own = Stats()  # the mix's own: its iterations' wall clock, parsing above it
        self._consumed = 0  # records consumed in this iteration
        self._consumed_before = 0
        self._report_consumed: Callable[[], None] | None = None
        self._handed_out: Callable[[], int] | None = None

    def _start_position(self) -> _Position:
        return _Position(0, (False,) * len(self.datasets), tuple(self.datasets))

    # ------------------------------------------------------------------ epochs, hosts

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch: every source's, and the draws'. A different epoch starts at its
        beginning; the epoch a loaded state is in keeps that position."""
        if epoch != self.epoch:
            self._resume, self._finished = None, False
            self._at = self._start_position()
        self.epoch = epoch
        if self._resume is not None:
            # the loaded state's sources keep their positions (after a stop="never" restart
            # a source is at a later epoch: setting it to ``epoch`` would drop its state)
            return
        for ds in self.datasets:
            ds.set_epoch(epoch)

    @property
    def num_hosts(self) -> int:
        """How many hosts share each source (the first source split by hand decides)."""
        split = [ds for ds in self.datasets if (ds.num_hosts, ds.host_index) != (1, 0)]
        return (split or self.datasets)[0].num_hosts

    @property
    def host_index(self) -> int:
        """Which share of each source this host reads."""
        split = [ds for ds in self.datasets if (ds.num_hosts, ds.host_index) != (1, 0)]
        return (split or self.datasets)[0].host_index

    def split_hosts(self, num_hosts: int, host_index: int) -> None:
        """Every source reads share ``host_index`` of ``num_hosts`` from the next iteration."""
        for ds in self.datasets:
            ds.split_hosts(num_hosts, host_index)

    # ------------------------------------------------------------------ state

    def _config(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "weights": list(self.weights),
            "stop": self.stop,
            "sources": len(self.datasets),
        }

    def _position(self) -> _Position:
        if self._report_consumed is not None:
            self._report_consumed()
        if self._resume is not None:
            return self._resume
        runs = self._runs
        if runs is not None and runs.pos:
            run = runs.pieces[0]
            return dataclasses.replace(run.start, draws=run.start.draws + runs.pos)
        return self._at

    def locate(self, payload: object) -> Where | None:
        """Where a record of the mix not yet consumed (the very object) comes from: the
        source dataset that holds it says (see :meth:`Dataset.locate`)."""
        for ds in self.datasets:
            where = ds.locate(payload)
            if where is not None:
                return where
        return None

    def state_dict(self) -> dict[str, Any]:
        """Where the consumer is: the mix's draw counter, which sources are exhausted, and
        every source's own ``state_dict()``, all as of the last record handed out (JSON).
        :meth:`load_state_dict` on a mix of the same configuration continues exactly."""
        at = self._position()
        return {
            "version": MIX_STATE_VERSION,
            "kind": "mix",
            "epoch": self.epoch,
            "config": self._config(),
            "draws": at.draws,
            "exhausted": list(at.exhausted),
            "finished": self._finished,
            "sources": [ds.state_dict() for ds in at.sources],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (from :meth:`state_dict`) on the next iteration. Raises
        :class:`~streamrec.errors.StateError` when it comes from another mix configuration
        or a field is wrong (each source checks its own state as ``Dataset`` does)."""
        epoch, draws, exhausted, finished, sources = parse_mix_state(state, self._config())
        for ds, source_state in zip(self.datasets, sources, strict=True):
            parse_state(source_state, ds._config())  # all checked before any is loaded
        for ds, source_state in zip(self.datasets, sources, strict=True):
            ds.load_state_dict(source_state)
        self.epoch = epoch
        self._resume = _Position(draws, exhausted, tuple(self.datasets))
        self._finished = finished

    # ------------------------------------------------------------------ reading

    def _begin(self) -> _Position | None:
        """A new iteration's start: the loaded position, or the epoch's beginning (None:
        a loaded state of a finished epoch, nothing to read)."""
        self._consumed_before += self._consumed
        self._consumed = 0
        self._runs = Consumption(_Passing(self))
        resume, self._resume = self._resume, None
        if resume is None:
            for ds in self.datasets:  # (a state loaded into a source directly is dropped)
                ds.set_epoch(self.epoch + 1)
                ds.set_epoch(self.epoch)
            resume = self._start_position()
        elif self._finished:
            self._at = resume
            return None
        self._finished = False
        self._at = resume
        return resume

    async def record_chunks(
        self,
        *,
        auto_consume: bool = True,
        report_consumed: Callable[[], None] | None = None,
        handed_out: Callable[[], int] | None = None,
    ) -> AsyncGenerator[list[bytes], None]:
        """The mixed records as chunks (lists): the consumers' fast path, with the same
        contract as ``Dataset.record_chunks`` (``auto_consume=False``: records count as
        consumed only once :meth:`mark_consumed` says so)."""
        start = self._begin()
        self._report_consumed = None if auto_consume else report_consumed
        self._handed_out = None if auto_consume else handed_out
        if start is None:
            return
        runs = self._runs
        assert runs is not None
        drawn = clocked(self._draw(start, runs), self._own)
        async with owning(drawn) as chunks:
            async for chunk in chunks:
                if auto_consume:
                    self.mark_consumed(len(chunk))
                yield chunk
        runs.end(self._finish)

    def mark_consumed(self, n: int) -> None:
        """``n`` more records from ``record_chunks(auto_consume=False)`` reached the consumer
        (in order); each source is marked with its own among them."""
        self._consumed += n
        if self._runs is not None:
            self._runs.consume(n)

    def _finish(self) -> None:
        self._finished = True  # the draws ended and every record drawn was consumed

    def _report(self) -> None:
        # a source describing its position first has the mix's consumer report its records
        if self._report_consumed is not None:
            self._report_consumed()

    @owned_generator
    async def _draw(
        self, start: _Position, runs: Consumption[_Run]
    ) -> AsyncGenerator[list[bytes], None]:
        """The runs of records of the draws from ``start`` on, until ``stop`` says so."""
        key = mix_key(self.seed, self.epoch)
        draws, exhausted = start.draws, list(start.exhausted)
        objects = list(start.sources)
        sources = [_Source(ds, self._report) for ds in objects]
        try:
            # every source's listing and first reads at once, not one after another
            await run_all(s.fill() for s, out in zip(sources, exhausted, strict=True) if not out)
            window: Draws | None = None
            while True:
                if window is None or draws >= window.end:
                    active = [not out for out in exhausted]
                    window = Draws(key, draws, self.weights, active)
                reach = window.reach(draws, [s.available for s in sources])
                if reach > draws:
                    choices = window.choices[draws - window.start : reach - window.start]
                    position = _Position(draws, tuple(exhausted), tuple(objects))
                    records = _gather(choices, sources)
                    runs.add(_Run(len(records), choices, position))
                    draws = reach
                    yield records
                    continue
                if reach == window.end:
                    continue
                j = int(window.choices[draws - window.start])
                if await sources[j].fill():
                    continue
                # the draw picked a source with no record left
                if self.stop == "first":
                    return
                if self.stop == "all":
                    exhausted[j] = True
                    window = None
                    if all(exhausted):
                        return
                    continue
                await sources[j].aclose()
                self._retire(objects[j])
                objects[j] = self._restarted(objects[j])
                sources[j] = _Source(objects[j], self._report)
                if not await sources[j].fill():
                    raise ValueError(
                        f"mix(stop='never'): source {j} has no records in epoch "
                        f"{objects[j].epoch}: it cannot be repeated forever"
                    )
        finally:
            for source in sources:
                await source.aclose()

    def _restarted(self, dataset: Dataset) -> Dataset:
        """A copy of ``dataset`` at its next epoch (the old one keeps the position of the
        records still to be consumed)."""
        copy = Dataset(dataset.urls, dataset.options)
        copy.set_epoch(dataset.epoch + 1)
        self._copies.append(copy)
        return copy

    def _retire(self, dataset: Dataset) -> None:
        """A restarted copy read to its end: its counters are kept, not the copy (an endless
        mix would otherwise keep one per restart)."""
        for i, copy in enumerate(self._copies):
            if copy is dataset:
                del self._copies[i]
                _add_stats(self._retired, dataset.stats)
                return

    # ------------------------------------------------------------------ consumers

    def __aiter__(self) -> AsyncGenerator[bytes, None]:
        return handed_out_async(self)

    def __iter__(self) -> Iterator[bytes]:
        return handed_out_blocking(self)

    # ------------------------------------------------------------------ counts, stats

    def __len__(self) -> int:
        """Records of one epoch for this consumer: ``stop="all"``, the sum of the sources'
        ``len()``; ``"first"``, the draws before the first that finds its source used up
        (computed from the sources' lengths; with DataLoader workers each worker's mix stops
        on its own, so the main process's figure is that of one mix of the whole sources);
        ``"never"``: a TypeError (infinite). Sources without known counts raise
        :class:`~streamrec.errors.RecordCountUnknownError` (a TypeError)."""
        if self.stop == "never":
            raise TypeError("a mix with stop='never' is infinite: it has no len()")
        lengths = [len(ds) for ds in self.datasets]
        if self.stop == "all":
            return sum(lengths)
        return first_stop_length(mix_key(self.seed, self.epoch), self.weights, lengths)

    @property
    def own_stats(self) -> Stats:
        """The counters the mix keeps itself (what transforms above it add to)."""
        return self._own

    @property
    def stats(self) -> Stats:
        """Every source's counters added up (``peak_prefetch_bytes``: the sum of their
        peaks, each within its own budget); ``records``: records the mix handed out."""
        total = dataclasses.replace(self._retired, settings=dict(self.datasets[0].stats.settings))
        _add_stats(total, self._own)
        total.iterate_s = self._own.iterate_s
        for ds in chain(self.datasets, self._copies):
            _add_stats(total, ds.stats)
        handed = self._handed_out() if self._handed_out is not None else self._consumed
        total.records = self._consumed_before + handed
        return total

    def __getstate__(self) -> dict[str, Any]:
        # pickled into DataLoader workers: configuration and position, no iteration in hand
        state = dict(self.__dict__)
        state["_report_consumed"] = state["_handed_out"] = None
        state["_runs"] = None
        return state

    def __repr__(self) -> str:
        return (
            f"MixedDataset({self.datasets!r}, weights={self.weights!r}, seed={self.seed}, "
            f"stop={self.stop!r})"
        )


def _add_stats(total: Stats, stats: Stats) -> None:
    for f in dataclasses.fields(Stats):
        if f.name in ("settings", "iterate_s"):  # (the mix clocks its own iterations)
            continue
        setattr(total, f.name, getattr(total, f.name) + getattr(stats, f.name))


def mix(
    datasets: Sequence[Dataset],
    weights: Sequence[float] | None = None,
    *,
    seed: int = 0,
    stop: Stop = "first",
) -> MixedDataset:
    """Mix datasets: each record comes from the dataset a seeded draw picks, by weight.

    Args:
        datasets: the sources, each from :func:`~streamrec.open_dataset` with its own urls
            and settings (stores, compression, shuffling, ``prefetch_bytes``).
        weights: how often each is drawn (normalised to sum to 1); None: equally.
        seed: the draws are a function of ``(seed, epoch, draw number)``: the same sequence of
            sources every run, on every machine (``set_epoch`` chooses the epoch).
        stop: ``"first"``: the mix ends at the first draw of a source with no record left;
            ``"all"``: that source drops out and the others go on at their weights
            renormalised, until every record of every source has come; ``"never"``: the
            source restarts at its next epoch (``epoch + 1``): an infinite dataset (iterate
            it once; ``set_epoch(e)`` starts every source at epoch ``e`` again, so mix epochs
            repeat the sources' epochs they share).

    Draws are stratified in blocks of 256 (each block picks every source within one of its
    weight's share, in random order), so the realised proportions match the weights closely
    at any length. Each source keeps its own prefetch budget: the mix reads ahead at most the
    sum of its sources' ``prefetch_bytes`` (see :mod:`streamrec.pipeline.mix.mixed`).

    Returns:
        A :class:`MixedDataset`.
    """
    return MixedDataset(datasets, weights, seed, stop)
