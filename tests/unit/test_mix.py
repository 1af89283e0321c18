"""streamrec.mix on local files: the draws, the stop modes against a record-by-record model,
exact resume at many cut points (through parse/batch too), len(), early close, state checks."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from contextlib import aclosing
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import streamrec
from streamrec.errors import StateError
from streamrec.example import FixedLenFeature, decode, encode
from streamrec.format.framing import RecordEncoder
from streamrec.pipeline.mix import order as mix_order

SPEC = {"src": FixedLenFeature(np.int64), "i": FixedLenFeature(np.int64)}
SIZES = (130, 61, 23)  # uneven: every stop mode ends differently
WEIGHTS = (0.5, 0.3, 0.2)


def payload(src: int, i: int) -> bytes:
    return encode({"src": src, "i": i})


def write_source(root: Path, src: int, count: int, shards: int = 3) -> list[str]:
    root.mkdir(parents=True, exist_ok=True)
    paths, bounds = [], np.linspace(0, count, shards + 1).astype(int)
    for shard in range(shards):
        path = root / f"s{src}-{shard}.tfrecord"
        records = [payload(src, i) for i in range(bounds[shard], bounds[shard + 1])]
        path.write_bytes(RecordEncoder().encode_many(records))
        paths.append(str(path))
    return paths


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> list[list[str]]:
    root = tmp_path_factory.mktemp("mix")
    return [write_source(root, src, n) for src, n in enumerate(SIZES)]


def sources(files: list[list[str]]) -> list[streamrec.Dataset]:
    # different settings per source: a shuffle buffer and shard shuffling (epochs differ)
    return [
        streamrec.open_dataset(files[0], shuffle_buffer=16, seed=3),
        streamrec.open_dataset(files[1], shuffle_shards=True, seed=4),
        streamrec.open_dataset(files[2], prefetch_bytes=1 << 16, block_bytes=1 << 10),
    ]


def make(files: list[list[str]], stop: str, seed: int = 5) -> streamrec.MixedDataset:
    return streamrec.mix(sources(files), list(WEIGHTS), seed=seed, stop=stop)  # type: ignore[arg-type]


def key(record: bytes) -> tuple[int, int]:
    features = decode(record, SPEC)
    return int(features["src"]), int(features["i"])


def model(
    files: list[list[str]], stop: str, seed: int, limit: int, epoch: int = 0
) -> list[tuple[int, int]]:
    """The mix, one record at a time: each draw's uniform number picks among the sources still
    active by their cumulative weights; each source's records are what it yields alone."""
    key_ = mix_order.mix_key(seed, epoch)
    u = mix_order.uniforms(key_, 0, 64)
    alone: dict[tuple[int, int], list[tuple[int, int]]] = {}

    def records(src: int, ep: int) -> list[tuple[int, int]]:
        if (src, ep) not in alone:
            ds = sources(files)[src]
            ds.set_epoch(ep)
            alone[src, ep] = [key(r) for r in ds]
        return alone[src, ep]

    active, taken, epochs = [True] * 3, [0, 0, 0], [epoch] * 3
    out: list[tuple[int, int]] = []
    draw = 0
    while len(out) < limit:
        total = sum(w for w, on in zip(WEIGHTS, active, strict=True) if on)
        x, pick, acc = u[draw] * total, None, 0.0
        for src, (w, on) in enumerate(zip(WEIGHTS, active, strict=True)):
            if on:
                acc += w
                pick = src
                if x < acc:
                    break
        assert pick is not None
        mine = records(pick, epochs[pick])
        if taken[pick] < len(mine):
            out.append(mine[taken[pick]])
            taken[pick] += 1
            draw += 1
        elif stop == "first":
            break
        elif stop == "all":
            active[pick] = False
            if not any(active):
                break
        else:
            epochs[pick] += 1
            taken[pick] = 0
    return out


# ------------------------------------------------------------------------------ the draws


def test_draws_are_a_pure_function_of_seed_epoch_and_number() -> None:
    weights = mix_order.check_weights([2, 1, 1], 3)
    key_ = mix_order.mix_key(0, 0)
    whole = mix_order.Draws(key_, 0, weights, [True] * 3).choices
    later = mix_order.Draws(key_, 5000, weights, [True] * 3)  # a window far in: no replay
    again = mix_order.Draws(key_, 0, weights, [True] * 3).choices
    assert np.array_equal(whole, again)
    assert later.start == 5000 // mix_order.BLOCK * mix_order.BLOCK
    assert np.array_equal(
        later.choices[:100], mix_order.Draws(key_, later.start, weights, [True] * 3).choices[:100]
    )
    other_epoch = mix_order.Draws(mix_order.mix_key(0, 1), 0, weights, [True] * 3).choices
    other_seed = mix_order.Draws(mix_order.mix_key(1, 0), 0, weights, [True] * 3).choices
    assert not np.array_equal(whole, other_epoch) and not np.array_equal(whole, other_seed)


@pytest.mark.parametrize("weights", [[0.7, 0.3], [0.5, 0.3, 0.2], [0.9, 0.05, 0.05]])
def test_every_block_holds_each_source_by_its_weight(weights: list[float]) -> None:
    u = mix_order.uniforms(mix_order.mix_key(11, 2), 0, 40)
    choices = mix_order.choose(u, weights, [True] * len(weights))
    blocks = choices.reshape(40, mix_order.BLOCK)
    for src, w in enumerate(weights):
        counts = (blocks == src).sum(axis=1)
        assert np.all(np.abs(counts - w * mix_order.BLOCK) < 2)


def test_an_inactive_source_is_never_picked_and_the_rest_renormalise() -> None:
    u = mix_order.uniforms(mix_order.mix_key(0, 0), 0, 40)
    choices = mix_order.choose(u, [0.2, 0.5, 0.3], [True, False, True])
    assert not np.any(choices == 1)
    assert abs(np.mean(choices == 0) - 0.4) < 0.01


def test_bad_weights_and_arguments_are_refused(files: list[list[str]]) -> None:
    ds = sources(files)
    with pytest.raises(ValueError, match="weights"):
        streamrec.mix(ds, [1.0, 0.0, 1.0])
    with pytest.raises(ValueError, match="weights"):
        streamrec.mix(ds, [1.0, 2.0])
    with pytest.raises(ValueError, match="stop"):
        streamrec.mix(ds, stop="sometimes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="twice"):
        streamrec.mix([ds[0], ds[0]])
    with pytest.raises(TypeError):
        streamrec.mix([ds[0].parse(SPEC)])  # type: ignore[list-item]


# ------------------------------------------------------------------------------ reading


def test_proportions_within_one_percent_over_10000_records(files: list[list[str]]) -> None:
    mixed = streamrec.mix(sources(files)[:2], [0.7, 0.3], seed=0, stop="never")
    counts: Counter[int] = Counter()
    for n, record in enumerate(mixed):
        counts[key(record)[0]] += 1
        if n + 1 == 10_000:
            break
    assert abs(counts[0] / 10_000 - 0.7) < 0.01 and abs(counts[1] / 10_000 - 0.3) < 0.01


@pytest.mark.parametrize("stop", ["first", "all", "never"])
def test_each_stop_mode_matches_the_model(files: list[list[str]], stop: str) -> None:
    limit = 600  # "never": past several restarts of every source
    expected = model(files, stop, 5, limit)
    got = []
    for record in make(files, stop):
        got.append(key(record))
        if len(got) == limit:
            break
    assert got == expected
    if stop == "all":
        assert Counter(got) == Counter((s, i) for s, n in enumerate(SIZES) for i in range(n))
    if stop == "first":
        ended = Counter(s for s, _ in got)
        assert any(ended[s] == n for s, n in enumerate(SIZES))  # a source ran out
    # the same seed gives the same sequence, async for too
    again: list[tuple[int, int]] = []

    async def read() -> None:
        async for record in make(files, stop):
            again.append(key(record))
            if len(again) == limit:
                break

    asyncio.run(read())
    assert again == got


def test_epochs_and_seeds_change_the_order(files: list[list[str]]) -> None:
    first = [key(r) for r in make(files, "all")]
    mixed = make(files, "all")
    mixed.set_epoch(1)
    second = [key(r) for r in mixed]
    assert second == model(files, "all", 5, 10_000, epoch=1)
    assert Counter(first) == Counter(second) and first != second
    assert [key(r) for r in make(files, "all", seed=6)] != first


def test_len_where_it_is_known(files: list[list[str]]) -> None:
    # counts come from index sidecars: write them (and the model reads the same records)
    for paths in files:
        for path in paths:
            _write_index(path)
    assert len(make(files, "all")) == sum(SIZES)
    assert len(make(files, "first")) == len(model(files, "first", 5, 10_000))
    mixed = make(files, "first")
    mixed.set_epoch(3)
    assert len(mixed) == len(list(mixed))
    with pytest.raises(TypeError, match="infinite"):
        len(make(files, "never"))


def _write_index(path: str) -> None:
    """The shard's index sidecar in the plain (DALI) format: "offset framed-length" lines."""
    data = Path(path).read_bytes()
    lines, pos = [], 0
    while pos < len(data):
        length = int.from_bytes(data[pos : pos + 8], "little") + 16
        lines.append(f"{pos} {length}\n")
        pos += length
    Path(path + ".idx").write_text("".join(lines))


# ------------------------------------------------------------------------------ resume


def read_cut(mixed: Any, cut: int) -> tuple[list[Any], dict[str, Any]]:
    it = iter(mixed)
    head = list(islice(it, cut))  # (takes no item past the cut)
    state = json.loads(json.dumps(mixed.state_dict()))  # a checkpoint: JSON
    it.close()
    return head, state


@pytest.mark.parametrize("stop", ["first", "all", "never"])
def test_resume_at_many_cut_points(files: list[list[str]], stop: str) -> None:
    limit = 400
    expected = model(files, stop, 5, limit)
    ends = len(expected)
    for cut in sorted({0, 1, 17, 100, 256, ends - 1, ends} - {-1}):
        head, state = read_cut(make(files, stop), cut)
        resumed = make(files, stop)
        resumed.load_state_dict(state)
        tail: list[tuple[int, int]] = []
        for record in resumed:
            if len(head) + len(tail) == limit:
                break
            tail.append(key(record))
        assert [key(r) for r in head] + tail == expected, cut


@pytest.mark.parametrize(
    ("stop", "cut"), [("all", 0), ("all", 3), ("all", 11), ("never", 17), ("never", 33)]
)
def test_resume_after_parse_and_batch(files: list[list[str]], stop: str, cut: int) -> None:
    # "never": cuts after restarts of the small source, while a batch holds records of both
    # of its epochs
    limit = 50  # batches

    def batches(mixed: streamrec.MixedDataset) -> Any:
        return mixed.parse(SPEC).batch(7)

    def keys(batch: dict[str, Any]) -> list[tuple[int, int]]:
        return list(zip(batch["src"].tolist(), batch["i"].tolist(), strict=True))

    expected = model(files, stop, 5, 7 * limit)
    head, state = read_cut(batches(make(files, stop)), cut)
    resumed = batches(make(files, stop))
    resumed.load_state_dict(state)
    rest = list(islice(resumed, limit - cut))
    got = [k for b in head for k in keys(b)] + [k for b in rest for k in keys(b)]
    assert got == expected
    assert len(batches(make(files, stop)).dataset.datasets) == 3


def test_resume_between_records_of_async_for(files: list[list[str]]) -> None:
    expected = model(files, "never", 5, 300)

    async def main() -> None:
        for cut in (1, 130, 299):
            mixed = make(files, "never")
            head: list[tuple[int, int]] = []
            async with aclosing(mixed.__aiter__()) as records:
                async for record in records:
                    head.append(key(record))
                    if len(head) == cut:
                        break
                state = json.loads(json.dumps(mixed.state_dict()))  # between two records
            resumed = make(files, "never")
            resumed.load_state_dict(state)
            async with aclosing(resumed.__aiter__()) as records:
                async for record in records:
                    if len(head) == len(expected):
                        break
                    head.append(key(record))
            assert head == expected, cut

    asyncio.run(main())


def test_state_of_a_finished_mix_and_between_epochs(files: list[list[str]]) -> None:
    mixed = make(files, "first")
    everything = list(mixed)
    state = mixed.state_dict()
    assert state["finished"] is True
    resumed = make(files, "first")
    resumed.load_state_dict(state)
    assert list(resumed) == []
    resumed.set_epoch(1)
    assert [key(r) for r in resumed] == model(files, "first", 5, 10_000, epoch=1)
    assert len(everything) == len(model(files, "first", 5, 10_000))
    assert mixed.stats.records == len(everything)


def test_states_from_elsewhere_are_refused(files: list[list[str]]) -> None:
    _, state = read_cut(make(files, "all"), 20)
    other = streamrec.mix(sources(files), [0.4, 0.4, 0.2], seed=5, stop="all")
    with pytest.raises(StateError, match="another mix"):
        other.load_state_dict(state)
    for field, bad in [("draws", -1), ("exhausted", [True]), ("finished", "no"), ("sources", {})]:
        broken = {**state, field: bad}
        with pytest.raises(StateError, match=field):
            make(files, "all").load_state_dict(broken)
    with pytest.raises(StateError):
        make(files, "all").load_state_dict(state["sources"][0])
    tampered = json.loads(json.dumps(state))
    tampered["sources"][1]["config"]["seed"] = 99
    with pytest.raises(StateError):
        make(files, "all").load_state_dict(tampered)


# ------------------------------------------------------------------------------ closing


def test_closing_early_cancels_every_sources_reads(files: list[list[str]]) -> None:
    async def main() -> None:
        mixed = make(files, "never")
        n = 0
        async with aclosing(mixed.__aiter__()) as records:
            async for _ in records:
                n += 1
                if n == 50:
                    break
        assert asyncio.all_tasks() == {asyncio.current_task()}
        # the chunk path too, closed in the middle of a run of draws
        chunks = mixed.record_chunks()
        await anext(chunks)
        await chunks.aclose()
        assert asyncio.all_tasks() == {asyncio.current_task()}

    asyncio.run(main())


def test_read_ahead_stays_within_the_sum_of_the_sources_budgets(files: list[list[str]]) -> None:
    budgets = [1 << 12, 1 << 13, 1 << 12]
    datasets = [
        streamrec.open_dataset(paths, prefetch_bytes=budget, block_bytes=1 << 10)
        for paths, budget in zip(files, budgets, strict=True)
    ]
    mixed = streamrec.mix(datasets, list(WEIGHTS), stop="all")
    assert len(list(mixed)) == sum(SIZES)
    # each source within its own budget plus one block (see ByteBudget)
    assert 0 < mixed.stats.peak_prefetch_bytes <= sum(budgets) + 3 * (1 << 10)
    assert mixed.stats.records == sum(SIZES)


def test_a_failing_source_ends_the_mix_and_every_read(
    files: list[list[str]], tmp_path: Path
) -> None:
    async def main() -> None:
        missing = streamrec.open_dataset(str(tmp_path / "missing-*.tfrecord"))
        mixed = streamrec.mix([*sources(files)[:2], missing], stop="never")
        with pytest.raises(streamrec.errors.ObjectNotFoundError):
            async with aclosing(mixed.__aiter__()) as records:
                async for _ in records:
                    pass
        assert asyncio.all_tasks() == {asyncio.current_task()}

    asyncio.run(main())


def test_indexed_sources_mix_and_resume(files: list[list[str]]) -> None:
    for paths in files:
        for path in paths:
            _write_index(path)

    def make_indexed() -> streamrec.MixedDataset:
        datasets = [
            streamrec.open_dataset(files[0], shuffle="global", seed=1),
            streamrec.open_dataset(files[1], shuffle="block", window_records=10),
            streamrec.open_dataset(files[2], even="drop"),
        ]
        return streamrec.mix(datasets, list(WEIGHTS), seed=2, stop="all")

    everything = [key(r) for r in make_indexed()]
    assert Counter(everything) == Counter((s, i) for s, n in enumerate(SIZES) for i in range(n))
    head, state = read_cut(make_indexed(), 97)
    resumed = make_indexed()
    resumed.load_state_dict(state)
    assert [key(r) for r in head] + [key(r) for r in resumed] == everything


def test_an_endless_mix_keeps_no_copy_of_every_restarted_source(tmp_path: Path) -> None:
    # stop="never" restarts a small source again and again: the datasets of its finished
    # passes are not kept (memory grows with the run otherwise), their counters still count
    import gc

    small = write_source(tmp_path / "small", 0, 2, shards=1)
    big = write_source(tmp_path / "big", 1, 2000, shards=1)
    mixed = streamrec.mix(
        [streamrec.open_dataset(small), streamrec.open_dataset(big)], [0.5, 0.5], stop="never"
    )
    got = [key(r) for r in islice(iter(mixed), 600)]
    restarts = sum(1 for src, _ in got if src == 0) // 2
    assert restarts > 100
    gc.collect()
    alive = sum(1 for o in gc.get_objects() if type(o) is streamrec.Dataset)
    assert alive < 20, alive
    assert mixed.stats.records_read >= sum(1 for src, _ in got if src == 0) + 1
    assert mixed.stats.records == 600


def test_set_epoch_after_loading_keeps_a_restarted_sources_position(
    files: list[list[str]],
) -> None:
    # the usual loop after a checkpoint: load_state_dict, then set_epoch(the same epoch) before
    # iterating; a stop="never" source restarted at its next epoch must keep its position
    expected = model(files, "never", 5, 180)
    head, state = read_cut(make(files, "never"), 150)  # the small source restarted meanwhile
    assert state["sources"][2]["epoch"] > 0
    resumed = make(files, "never")
    resumed.load_state_dict(state)
    resumed.set_epoch(state["epoch"])
    tail = [key(r) for r in islice(iter(resumed), 30)]
    assert [key(r) for r in head] + tail == expected


def test_a_refused_state_leaves_the_loaded_one_whole(files: list[list[str]]) -> None:
    # a state whose second source is refused must not have loaded its first source already:
    # the mix would go on from the earlier state's draws with that source somewhere else
    expected = model(files, "all", 5, 120)
    head, state = read_cut(make(files, "all"), 30)
    _, later = read_cut(make(files, "all"), 60)
    later["sources"][1]["config"]["seed"] = 99
    resumed = make(files, "all")
    resumed.load_state_dict(state)
    with pytest.raises(StateError):
        resumed.load_state_dict(later)
    tail = [key(r) for r in islice(iter(resumed), 90)]
    assert [key(r) for r in head] + tail == expected
