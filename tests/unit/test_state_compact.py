"""The pieces that keep a resume state small (state version 3): the shuffle generator named by
the words it drew, finished shards as ranges, the urls by a digest once they are many, the
settings at their defaults left out."""

from __future__ import annotations

import itertools
import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamrec.errors import StateError
from streamrec.pipeline.listing.plan import seeded_random
from streamrec.pipeline.options import ReadOptions
from streamrec.pipeline.position.done import add_done, covered
from streamrec.pipeline.position.draws import WORDS_MOST, Draws, restore
from streamrec.pipeline.position.state import parse_state
from streamrec.pipeline.position.state_config import DEFAULTS, check_config, compact
from streamrec.pipeline.position.url_names import LISTED_BYTES, canonical, url_names


@settings(max_examples=100, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 5000) | st.sampled_from([1, 2, 3, 2**31, 2**32 - 1]), max_size=60)
)
def test_draws_are_randrange_and_shuffle_and_their_words_restore_the_generator(
    sizes: list[int],
) -> None:
    reference, ours = random.Random("r"), Draws(random.Random("r"))
    for n in sizes:
        assert ours.below(n) == reference.randrange(n)
    items = list(range(len(sizes) + 5))
    expected = list(items)
    reference.shuffle(expected)
    ours.shuffle(items)
    assert items == expected
    assert ours.words is not None
    again = restore(random.Random("r"), ours.words)
    assert again.rng.getstate() == reference.getstate()
    assert again.below(1000) == reference.randrange(1000)


def test_the_default_buffer_shuffle_draws_as_before() -> None:
    """The order of a fresh buffer shuffle stays what it was (random.Random.randrange)."""
    reference, ours = seeded_random(3, 1, "records"), Draws(seeded_random(3, 1, "records"))
    assert [ours.below(1000) for _ in range(2000)] == [
        reference.randrange(1000) for _ in range(2000)
    ]


def test_a_generator_is_saved_in_full_past_the_words_a_state_counts() -> None:
    draws = Draws(random.Random("x"), WORDS_MOST - 1)
    assert draws.saved() == WORDS_MOST - 1
    draws.below(2)
    draws.below(2)
    assert draws.words is not None and draws.words > WORDS_MOST
    assert draws.saved() == draws.rng.getstate()
    restored = restore(random.Random("y"), draws.rng.getstate())
    assert restored.words is None and restored.saved() == draws.rng.getstate()


@settings(max_examples=200, deadline=None)
@given(ordinals=st.lists(st.integers(0, 60), max_size=80))
def test_finished_shards_are_ranges_in_any_finishing_order(ordinals: list[int]) -> None:
    done: list[tuple[int, int]] = []
    for ordinal in ordinals:
        add_done(done, ordinal)
    assert {o for a, b in done for o in range(a, b)} == set(ordinals)
    assert all(a < b for a, b in done)
    assert all(b < c for (_, b), (c, _) in itertools.pairwise(done))  # apart
    assert all(covered(done, o) == (o in ordinals) for o in range(62))


def test_urls_are_listed_while_short_then_named_by_digest() -> None:
    few = ["s3://bucket/train/*.tfrecord"]
    assert url_names(few) == few
    many = [f"s3://bucket/train/part-{k:05d}.tfrecord" for k in range(20000)]
    named = url_names(many)
    assert isinstance(named, dict) and named["count"] == 20000
    assert named["first"] == many[0] and len(named["sha256"]) == 64
    assert len(json.dumps(named)) < 200
    assert canonical(many) == named and canonical(named) == named  # (a version 2 state's list)
    assert url_names(many[:1] + many[2:]) != url_names(many[1:]) != named
    assert len(json.dumps(many[:6])) <= LISTED_BYTES < len(json.dumps(many[:7]))
    assert url_names(many[:6]) == many[:6] and isinstance(url_names(many[:7]), dict)


def test_urls_with_credentials_are_named_without_them() -> None:
    signed = [f"https://user:secret@host/part-{k}.tfrecord?sig=SECRET" for k in range(40)]
    text = json.dumps(url_names(signed))
    assert "secret" not in text.lower()
    assert url_names(signed)["first"] == "https://***@host/part-0.tfrecord?sig=***"  # type: ignore[index]


def test_settings_at_their_defaults_are_left_out_and_read_back() -> None:
    options = ReadOptions(seed=3, cycle_length=2).config()
    recorded = compact({"urls": ["a"], **options})
    assert recorded == {"urls": ["a"], "cycle_length": 2, "seed": 3}
    assert check_config(recorded, {"urls": ["a"], **options}) == recorded
    assert check_config({"urls": ["a"], **options}, {"urls": ["a"], **options}) == recorded
    assert set(options) == set(DEFAULTS)  # a new setting needs its literal default here
    assert {k: v for k, v in ReadOptions().config().items()} == dict(DEFAULTS)
    with pytest.raises(StateError, match="seed: state has 0, dataset has 3"):
        check_config({"urls": ["a"]}, {"urls": ["a"], **options})
    with pytest.raises(StateError, match="cycle_length: state has True, dataset has 1"):
        check_config({"urls": ["a"], "cycle_length": True}, {"urls": ["a"]})


def test_a_state_of_other_urls_says_so_in_words() -> None:
    many = [f"data/part-{k:05d}.tfrecord" for k in range(20000)]
    config = {"urls": url_names(many), **ReadOptions().config()}
    state = {
        "version": 3,
        "epoch": 0,
        "config": compact({**config, "urls": url_names([*many[1:], "other.tfrecord"])}),
        "shards": None,
        "finished": False,
        "read": None,
        "shuffle": None,
    }
    with pytest.raises(StateError) as refused:
        parse_state(state, config)
    message = str(refused.value)
    assert (
        "the state was saved over 20000 other urls (the first 'data/part-00001.tfrecord'" in message
    )
    assert "the dataset reads 20000 urls (the first 'data/part-00000.tfrecord'" in message
    # a version 2 state listed them: named the same way, never quoted whole
    old = {**state, "version": 2, "config": {**ReadOptions().config(), "urls": many[::-1]}}
    with pytest.raises(StateError, match="saved over 20000 other urls") as refused:
        parse_state(old, config)
    assert len(str(refused.value)) < 500
    assert parse_state(
        {**old, "config": {**old["config"], "urls": many}}, config
    ).config == compact(config)


@pytest.mark.parametrize("words", [-1, WORDS_MOST + 1, 2**62, 1.5, True, "7"])
def test_a_word_count_past_the_bound_is_refused(words: object) -> None:
    config = {"urls": ["a"], **ReadOptions(shuffle_buffer=4).config()}
    state = {
        "version": 3,
        "epoch": 0,
        "config": compact(config),
        "shards": None,
        "finished": False,
        "read": {"kind": "cycle", "next": 0, "index": 0, "within": 0, "slots": [None]},
        "shuffle": {"buffer": None, "rng": words, "draining": False},
    }
    from streamrec.pipeline.position.buffer_codec import encode_buffer

    state["shuffle"]["buffer"] = encode_buffer([])  # type: ignore[index]
    with pytest.raises(StateError, match=r"shuffle\.rng"):
        parse_state(state, config)
    state["shuffle"]["rng"] = 5  # type: ignore[index]
    assert parse_state(state, config).shuffle.rng == 5  # type: ignore[union-attr]
