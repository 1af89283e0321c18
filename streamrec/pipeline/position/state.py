"""Exact resume: the consumer's position as typed values, parsed and checked once.

A state is JSON on the outside (``Dataset.state_dict()`` returns it, checkpoints store it) and
:class:`DatasetState` inside: :func:`parse_state` turns untrusted JSON into it, checking every
field (states come from storage), and :meth:`DatasetState.to_json` writes it back. Nothing
past the parser reads a state's JSON.

The JSON (version 3)::

    {"version": 3, "epoch": 0, "config": {"urls": ..., ...}, "shards": "<digest>" | null,
     "finished": false,
     "read": {"kind": "cycle", "next": 3, "index": 1, "within": 0,
              "slots": [[ordinal, records, offset] | null, ...]}       // deterministic
           | {"kind": "ready", "open": [[ordinal, records, offset], ...],
              "done": [[first, end], ...]}                              // first-ready
           | {"kind": "indexed", ...}                                  // global/block, even
           | null,
     "shuffle": {"buffer": "<packed locations>", "draining": false,
                 "rng": words | [3, [624 + 1 words], null]} | null}

A shard's position is ``[ordinal, records, offset]``: records handed on from shard ``ordinal``
of the epoch's plan, and the byte offset after them in its uncompressed stream. The offset is
only used where it can be trusted (an uncompressed shard, no skipped corrupt records, no
record-level splitting); other shards resume by reading and dropping their first ``records``
records. The shuffle buffer is kept as record *locations* ``(ordinal, index, offset,
length)``, never as data (packed into one string: :mod:`~streamrec.pipeline.position.buffer_codec`;
version 1 listed them); resuming fetches those records again.

Nothing in a state grows with the number of shards or urls (a state stays within a few hundred
bytes for any dataset): the configuration leaves out the settings at their defaults and names
the urls by a digest once they are many (:mod:`~streamrec.pipeline.position.state_config`),
the shards by ``shards`` (a digest of their names, sizes and versions), the finished shards of
first-ready reading as ranges of ordinals ``[first, end)`` (they finish nearly in order: a few
ranges), the shuffle buffer's generator by the count of words it drew since it was seeded
(:mod:`~streamrec.pipeline.position.draws`; its full state, ~7 KB, only past
:data:`~streamrec.pipeline.position.draws.WORDS_MOST` words). Version 2 recorded every
setting, url and finished shard and the generator in full; states of versions 1 and 2 are
still loaded.

What the parser checks without the shards: every field's type and range, lengths against the
configuration (interleave slots, shuffle buffer), the generator's state and the packing of the
buffer. :func:`check_against_plan` checks the shard ordinals against the epoch's shards once
they are listed (and :class:`~streamrec.pipeline.stream.opener.ShardOpener` checks that a byte
offset it seeks to starts a record). Anything wrong is a :class:`~streamrec.errors.StateError`
naming the field (``read.slots[2][1]``); a state that passes cannot make the pipeline allocate by
its numbers, index out of range or mix types.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from streamrec.errors import StateError
from streamrec.pipeline.order import part_of, remaining_after
from streamrec.pipeline.position.buffer_codec import decode_buffer, encode_buffer
from streamrec.pipeline.position.done import Done, covered
from streamrec.pipeline.position.draws import WORDS_MOST
from streamrec.pipeline.position.state_config import DEFAULTS, check_config, compact

__all__ = [
    "STATE_VERSION",
    "CycleState",
    "DatasetState",
    "IndexedState",
    "Location",
    "ReadState",
    "ReadyState",
    "RngState",
    "ShardPosition",
    "ShuffleState",
    "check_against_plan",
    "merge_states",
    "parse_state",
]

STATE_VERSION = 3
"""Version 3 leaves out the settings at their defaults, names many urls by a digest,
first-ready reading's finished shards by ranges and the shuffle buffer's generator by a count;
version 2 packed the shuffle buffer's locations into one string (see buffer_codec). States of
versions 1 (the buffer as a list of locations) and 2 (every setting, url and finished shard
listed, the generator in full) are still loaded."""

_MAX = 2**63 - 1  # positions, counts and offsets fit a signed 64-bit integer
_MT_WORDS = 624  # Mersenne Twister state words (random.getstate()[1] has 624 + 1 entries)

Location = tuple[int, int, int, int]
"""A record's place: ``(ordinal, index, offset, length)`` -- shard, record number in it, byte
offset of its framing in the uncompressed stream, payload length."""

RngState = tuple[Any, ...]
"""``random.Random.getstate()``'s value."""


@dataclass(slots=True)
class ShardPosition:
    """Where reading shard ``ordinal`` stands: after ``records`` records, at stream byte
    ``offset`` (mutable: the trackers advance it)."""

    ordinal: int
    records: int
    offset: int

    def copy(self) -> ShardPosition:
        return ShardPosition(self.ordinal, self.records, self.offset)

    def to_json(self) -> list[int]:
        return [self.ordinal, self.records, self.offset]


@dataclass
class CycleState:
    """Deterministic interleaving (sequential reading: ``cycle_length == 1``): the next shard
    to open, the slot whose turn it is, records already taken in that turn, the open slots."""

    next: int
    index: int
    within: int
    slots: list[ShardPosition | None]

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": "cycle",
            "next": self.next,
            "index": self.index,
            "within": self.within,
            "slots": [s.to_json() if s is not None else None for s in self.slots],
        }


@dataclass
class ReadyState:
    """First-ready reading: the shards being read, and those finished (as ranges)."""

    open: list[ShardPosition]
    done: Done

    def to_json(self) -> dict[str, Any]:
        done = [[a, b] for a, b in self.done]
        return {"kind": "ready", "open": [p.to_json() for p in self.open], "done": done}


@dataclass
class IndexedState:
    """Indexed reading (:mod:`~streamrec.pipeline.order`): an epoch of ``records`` records;
    the positions ``remaining`` when this generation of consumers started; this consumer
    (``consumer`` of ``consumers``) took the first ``taken`` positions of its part.
    ``consumers == 0``: a merged state (:func:`merge_states`), where no consumer of the new
    generation has started: any number of consumers may continue from it."""

    records: int
    consumers: int
    consumer: int
    remaining: list[tuple[int, int]]
    taken: int

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": "indexed",
            "records": self.records,
            "consumers": self.consumers,
            "consumer": self.consumer,
            "remaining": [[a, b] for a, b in self.remaining],
            "taken": self.taken,
        }


ReadState = CycleState | ReadyState | IndexedState


@dataclass
class ShuffleState:
    """The shuffle buffer (as record locations), whether it is draining, its generator (the
    words drawn since seeding, or its full state: see :mod:`~streamrec.pipeline.position.draws`)."""

    buffer: list[Location]
    draining: bool
    rng: RngState | int

    def to_json(self) -> dict[str, Any]:
        rng: int | list[Any]
        if isinstance(self.rng, int):
            rng = self.rng
        else:
            version, internal, gauss = self.rng
            rng = [version, list(internal), gauss]
        return {"buffer": encode_buffer(self.buffer), "rng": rng, "draining": self.draining}


@dataclass
class DatasetState:
    """A dataset's whole position (see the module docstring)."""

    epoch: int
    config: dict[str, Any]
    shards: str | None = None
    finished: bool = False
    read: ReadState | None = None
    shuffle: ShuffleState | None = None
    version: int = field(default=STATE_VERSION)

    def to_json(self) -> dict[str, Any]:
        """The state as the JSON-serialisable dict ``state_dict()`` returns."""
        return {
            "version": STATE_VERSION,
            "epoch": self.epoch,
            "config": compact(self.config),
            "shards": self.shards,
            "finished": self.finished,
            "read": self.read.to_json() if self.read is not None else None,
            "shuffle": self.shuffle.to_json() if self.shuffle is not None else None,
        }


# ---------------------------------------------------------------------------- the parser


def _bad(where: str, value: object, problem: str) -> StateError:
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return StateError(f"resume state field {where} = {shown}: {problem}")


def _int(value: object, where: str, low: int = 0, high: int = _MAX) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(where, value, "not an integer")
    if not low <= value <= high:
        raise _bad(where, value, f"not in [{low}, {high}]")
    return value


def _bool(value: object, where: str) -> bool:
    if not isinstance(value, bool):
        raise _bad(where, value, "not true or false")
    return value


def _list(value: object, where: str, length: int | None = None, most: int = _MAX) -> list[Any]:
    if not isinstance(value, list):
        raise _bad(where, value, "not a list")
    if length is not None and len(value) != length:
        raise _bad(where, value, f"has {len(value)} entries, not {length}")
    if len(value) > most:
        raise _bad(where, value, f"has {len(value)} entries, more than {most}")
    return value


def _dict(value: object, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _bad(where, value, "not a mapping")
    return value


def _key(mapping: dict[str, Any], key: str, where: str) -> Any:
    if key not in mapping:
        raise StateError(f"resume state field {where}.{key} is missing")
    return mapping[key]


def parse_state(raw: object, config: Mapping[str, Any]) -> DatasetState:
    """The state ``raw`` (from ``state_dict()``, maybe altered in storage) of a dataset
    configured as ``config``; StateError when it comes from another configuration (the message
    lists the differences) or any field has the wrong type or range."""
    if not isinstance(raw, dict) or raw.get("version") not in (1, 2, STATE_VERSION):
        got = raw.get("version") if isinstance(raw, dict) else None
        raise StateError(
            f"not a streamrec dataset state of version 1 to {STATE_VERSION} (got {got!r})"
        )
    version: int = raw["version"]
    theirs = check_config(_dict(_key(raw, "config", "state"), "config"), config)
    config = {**DEFAULTS, **config}  # (merge_states: a state's own, its defaults left out)
    cycle_length, block_length = config["cycle_length"], config["block_length"]
    shuffle_buffer = config["shuffle_buffer"]
    epoch = _int(_key(raw, "epoch", "state"), "epoch", -_MAX, _MAX)
    digest = _key(raw, "shards", "state")
    if digest is not None and not (isinstance(digest, str) and len(digest) <= 64):
        raise _bad("shards", digest, "not a shard digest (a short string) or null")
    finished = _bool(_key(raw, "finished", "state"), "finished")
    read_raw, shuffle_raw = _key(raw, "read", "state"), _key(raw, "shuffle", "state")
    if config.get("shuffle") in ("global", "block") or config.get("even"):  # indexed reading
        if shuffle_raw is not None:
            raise _bad("shuffle", shuffle_raw, "a shuffle buffer state, but reading is indexed")
        even = _even_mode(config.get("even"))
        indexed = None if read_raw is None else _indexed(_dict(read_raw, "read"), even)
        return DatasetState(epoch, dict(theirs), digest, finished, indexed, None)
    if shuffle_buffer == 0 and shuffle_raw is not None:
        raise _bad("shuffle", shuffle_raw, "a shuffle buffer state, but shuffle_buffer is 0")
    if shuffle_buffer and (read_raw is None) != (shuffle_raw is None):
        raise StateError("resume state fields read and shuffle: one is null, the other not")
    read: ReadState | None = None
    if read_raw is not None:
        if config["deterministic"] or cycle_length == 1:
            read = _cycle(_dict(read_raw, "read"), cycle_length, block_length)
        else:
            read = _ready(_dict(read_raw, "read"), version)
    shuffle = None
    if shuffle_raw is not None:
        shuffle = _shuffle(_dict(shuffle_raw, "shuffle"), shuffle_buffer, version)
    return DatasetState(epoch, dict(theirs), digest, finished, read, shuffle)


def _position(value: object, where: str) -> ShardPosition:
    """``[ordinal, records, offset]``."""
    entries = _list(value, where, 3)
    ordinal, records, offset = (
        _int(entries[k], f"{where}[{k}] ({name})")
        for k, name in enumerate(("ordinal", "records", "offset"))
    )
    return ShardPosition(ordinal, records, offset)


def _cycle(read: dict[str, Any], cycle_length: int, block_length: int) -> CycleState:
    if read.get("kind") != "cycle":
        raise _bad("read.kind", read.get("kind"), "not 'cycle' (deterministic reading)")
    next_ordinal = _int(_key(read, "next", "read"), "read.next")
    index = _int(_key(read, "index", "read"), "read.index", 0, cycle_length - 1)
    # (sequential reading counts records of a chunk there, and never resumes from it)
    within_most = block_length - 1 if cycle_length > 1 else _MAX
    within = _int(_key(read, "within", "read"), "read.within", 0, within_most)
    slots: list[ShardPosition | None] = []
    opened: set[int] = set()
    for k, slot in enumerate(_list(_key(read, "slots", "read"), "read.slots", cycle_length)):
        if slot is None:
            slots.append(None)
            continue
        where = f"read.slots[{k}]"
        position = _position(slot, where)
        if position.ordinal >= next_ordinal or position.ordinal in opened:
            problem = f"shard {position.ordinal} is not one opened before read.next, or twice"
            raise _bad(where, slot, problem)
        opened.add(position.ordinal)
        slots.append(position)
    return CycleState(next_ordinal, index, within, slots)


def _ready(read: dict[str, Any], version: int) -> ReadyState:
    if read.get("kind") != "ready":
        raise _bad("read.kind", read.get("kind"), "not 'ready' (first-ready reading)")
    listed = _list(_key(read, "done", "read"), "read.done")
    done = _done_ranges(listed) if version >= 3 else _done_listed(listed)
    positions: list[ShardPosition] = []
    seen: set[int] = set()
    for k, value in enumerate(_list(_key(read, "open", "read"), "read.open")):
        position = _position(value, f"read.open[{k}]")
        if covered(done, position.ordinal) or position.ordinal in seen:
            raise _bad(f"read.open[{k}]", value, f"shard {position.ordinal} is open twice or done")
        seen.add(position.ordinal)
        positions.append(position)
    return ReadyState(positions, done)


def _done_ranges(listed: list[Any]) -> Done:
    """Version 3: ``[[first, end], ...]``, ascending and apart."""
    done: Done = []
    end = -1  # (ranges that touch would be one range)
    for k, pair in enumerate(listed):
        where = f"read.done[{k}]"
        entries = _list(pair, where, 2)
        a = _int(entries[0], f"{where}[0]", end + 1)
        b = _int(entries[1], f"{where}[1]", a + 1)
        done.append((a, b))
        end = b
    return done


def _done_listed(listed: list[Any]) -> Done:
    """Versions 1 and 2: every finished ordinal, in any order, once."""
    finished: set[int] = set()
    for k, ordinal in enumerate(listed):
        if _int(ordinal, f"read.done[{k}]") in finished:
            raise _bad(f"read.done[{k}]", ordinal, "listed twice")
        finished.add(ordinal)
    done: Done = []
    for ordinal in sorted(finished):  # (in order: each joins the last range or starts one)
        if done and done[-1][1] == ordinal:
            done[-1] = (done[-1][0], ordinal + 1)
        else:
            done.append((ordinal, ordinal + 1))
    return done


_MOST_INTERVALS = 1 << 16  # a state of this many intervals is far beyond any real job's


def _even_mode(even: object) -> Literal["drop", "pad"] | None:
    """The configuration's ``even`` as what it does (as ``ReadOptions.even_mode``)."""
    if even is True:
        return "pad"
    if even == "drop" or even == "pad":
        return even
    return None


def _indexed(read: dict[str, Any], even: Literal["drop", "pad"] | None = None) -> IndexedState:
    if read.get("kind") != "indexed":
        raise _bad("read.kind", read.get("kind"), "not 'indexed' (shuffle global/block, even)")
    records = _int(_key(read, "records", "read"), "read.records")
    consumers = _int(_key(read, "consumers", "read"), "read.consumers", 0, _MAX_CONSUMERS)
    consumer = _int(_key(read, "consumer", "read"), "read.consumer", 0, max(consumers - 1, 0))
    remaining: list[tuple[int, int]] = []
    end = 0
    for k, pair in enumerate(
        _list(_key(read, "remaining", "read"), "read.remaining", most=_MOST_INTERVALS)
    ):
        where = f"read.remaining[{k}]"
        entries = _list(pair, where, 2)
        a = _int(entries[0], f"{where}[0]", end, records)
        b = _int(entries[1], f"{where}[1]", a + 1, records)
        remaining.append((a, b))
        end = b
    taken = _key(read, "taken", "read")
    if not consumers:  # merged: no consumer of the new generation has started
        return IndexedState(records, 0, 0, remaining, _int(taken, "read.taken", 0, 0))
    # this consumer's own part, not all that remains: a count past it would resume at the
    # part's end and silently read nothing
    part = part_of(remaining, consumers, consumer, even).length
    if not isinstance(taken, bool) and isinstance(taken, int) and taken > part:
        raise _bad(
            "read.taken",
            taken,
            f"consumer {consumer} of {consumers} has {part} positions of the "
            f"{sum(b - a for a, b in remaining)} remaining to take, not more",
        )
    return IndexedState(records, consumers, consumer, remaining, _int(taken, "read.taken"))


_MAX_CONSUMERS = 1 << 20


def _shuffle(shuffle: dict[str, Any], shuffle_buffer: int, version: int) -> ShuffleState:
    packed = _key(shuffle, "buffer", "shuffle")
    if version >= 2:  # packed (decoding checks the packing; the locations are checked below)
        packed = decode_buffer(packed, "shuffle.buffer", most=shuffle_buffer)
    buffer: list[Location] = []
    for k, location in enumerate(_list(packed, "shuffle.buffer", most=shuffle_buffer)):
        where = f"shuffle.buffer[{k}]"
        entries = _list(location, where, 4)
        ordinal, index, offset, length = (
            _int(entries[j], f"{where}[{j}] ({name})")
            for j, name in enumerate(("ordinal", "index", "offset", "length"))
        )
        buffer.append((ordinal, index, offset, length))
    draining = _bool(_key(shuffle, "draining", "shuffle"), "shuffle.draining")
    rng_raw = _key(shuffle, "rng", "shuffle")
    rng: RngState | int
    if version >= 3 and not isinstance(rng_raw, list):  # words drawn since seeding
        rng = _int(rng_raw, "shuffle.rng (words drawn)", 0, WORDS_MOST)
    else:
        rng = _rng(rng_raw)
    return ShuffleState(buffer, draining, rng)


def _rng(value: object) -> RngState:
    where = "shuffle.rng"
    version, internal, gauss = _list(value, where, 3)
    _int(version, f"{where}[0] (version)", 3, 3)
    words = _list(internal, f"{where}[1]", _MT_WORDS + 1)
    for k in range(_MT_WORDS):
        _int(words[k], f"{where}[1][{k}]", 0, 2**32 - 1)
    _int(words[_MT_WORDS], f"{where}[1][{_MT_WORDS}] (position)", 0, _MT_WORDS)
    if gauss is not None and (isinstance(gauss, bool) or not isinstance(gauss, (int, float))):
        raise _bad(f"{where}[2]", gauss, "not a number or null")
    state = (version, tuple(words), gauss)
    try:
        random.Random().setstate(state)
    except (TypeError, ValueError) as exc:
        raise _bad(where, value, f"not a generator state ({exc})") from None
    return state


def check_against_plan(state: DatasetState, count: int) -> None:
    """The shard ordinals of a parsed state against the ``count`` shards of the epoch's plan
    (byte offsets are checked where a shard is seeked into: see ShardOpener)."""
    places: list[tuple[str, Sequence[int]]] = []
    read = state.read
    if isinstance(read, CycleState):
        if read.next > count:
            raise _bad("read.next", read.next, f"there are only {count} shards to read")
        places += [(f"read.slots[{k}]", p.to_json()) for k, p in enumerate(read.slots) if p]
    elif isinstance(read, ReadyState):
        places += [(f"read.open[{k}]", p.to_json()) for k, p in enumerate(read.open)]
    if state.shuffle is not None:
        places += [(f"shuffle.buffer[{k}]", list(p)) for k, p in enumerate(state.shuffle.buffer)]
    if isinstance(read, ReadyState):
        places += [(f"read.done[{k}]", [b - 1]) for k, (_, b) in enumerate(read.done)]
    for where, place in places:
        if place[0] >= count:
            raise _bad(where, list(place), f"names shard {place[0]}; there are only {count}")


def merge_states(states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One state from the states of *all* consumers of an indexed epoch (``shuffle="global"``
    or ``"block"``, or ``even``), from which any number of consumers continue: every record
    none of them consumed comes exactly once, none they consumed comes again.

    Each consumer (host x DataLoader worker) saves its own state; gather them (e.g. with
    ``torch.distributed.all_gather_object``, and :func:`streamrec.torch.worker_states` for a
    StatefulDataLoader's) and load the merged state into every consumer of the new job.
    StateError when they are not one complete generation of consumers of the same epoch.
    """
    if not states:
        raise StateError("merge_states needs the states of all consumers, got none")
    parsed: list[DatasetState] = []
    for k, raw in enumerate(states):
        if not isinstance(raw, Mapping) or not isinstance(raw.get("config"), dict):
            raise StateError(f"state {k} is not a streamrec dataset state")
        try:
            parsed.append(parse_state(dict(raw), raw["config"]))
        except StateError as exc:
            raise StateError(f"state {k}: {exc}") from None
    first = parsed[0]
    for k, state in enumerate(parsed[1:], start=1):
        if (state.config, state.epoch, state.shards) != (first.config, first.epoch, first.shards):
            raise StateError(f"state {k} comes from another dataset, epoch or set of shards")
    positions = [s.read for s in parsed]
    if not all(isinstance(p, IndexedState) or p is None for p in positions):
        raise StateError(
            "merge_states merges the states of indexed reading only (shuffle "
            "'global' or 'block', or even): other orders resume per consumer"
        )
    started = [p for p in positions if isinstance(p, IndexedState)]
    if not started:
        return first.to_json()  # nobody read anything yet
    generation = started[0]
    for p in started:
        if (p.records, p.consumers, p.remaining) != (
            generation.records,
            generation.consumers,
            generation.remaining,
        ):
            raise StateError(
                "the states come from different generations of consumers: merge "
                "the states of one run's consumers, all saved in that run"
            )
    if generation.consumers == 0:
        return first.to_json()  # merged already; nobody of the new generation started
    taken = [0] * generation.consumers
    seen = set()
    for p in started:
        if p.consumer in seen:
            raise StateError(f"two states of consumer {p.consumer}")
        seen.add(p.consumer)
        # (even="pad": positions past the part's own wrap around to records of others,
        # read again: the part itself is consumed)
        part = part_of(generation.remaining, generation.consumers, p.consumer)
        taken[p.consumer] = min(p.taken, sum(b - a for a, b in part.intervals))
    if len(seen) != generation.consumers:
        missing = sorted(set(range(generation.consumers)) - seen)
        raise StateError(f"missing the states of consumers {missing} of {generation.consumers}")
    try:
        remaining = remaining_after(generation.remaining, generation.consumers, taken)
    except ValueError as exc:  # parse_state checked every count: not reached by a state
        raise StateError(f"resume state field read.taken: {exc}") from None
    merged = DatasetState(
        first.epoch,
        first.config,
        first.shards,
        not remaining,
        IndexedState(generation.records, 0, 0, remaining, 0),
    )
    return merged.to_json()
