"""Checking a resume state before any of it is used: states come from storage (checkpoints),
so every field is untrusted.

:func:`check_header` (before the configuration is compared) and :func:`check_state` (after)
check what a state can be checked against without the shards: every field's type and range,
lengths against the configuration (interleave slots, shuffle buffer), the generator's state,
and the packing of the shuffle buffer (version 2; version 1 lists its locations).
:func:`check_against_plan` checks the shard ordinals and byte offsets against the epoch's
shards, once they are listed (and :class:`~streamrec.pipeline.opener.ShardOpener` checks that a
byte offset it seeks to starts a record). Anything wrong is a :class:`~streamrec.errors.StateError`
naming the field (``read.slots[2][1]``) and what is wrong with it; a state that passes cannot
make the pipeline allocate by its numbers, index out of range or mix types.
"""

from __future__ import annotations

import random
from typing import Any

from streamrec.errors import StateError
from streamrec.pipeline.buffer_codec import decode_buffer

__all__ = ["check_against_plan", "check_header", "check_state"]

_MAX = 2**63 - 1  # positions, counts and offsets fit a signed 64-bit integer
_MT_WORDS = 624  # Mersenne Twister state words (random.getstate()[1] has 624 + 1 entries)


def _bad(field: str, value: object, problem: str) -> StateError:
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return StateError(f"resume state field {field} = {shown}: {problem}")


def _int(value: object, field: str, low: int = 0, high: int = _MAX) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(field, value, "not an integer")
    if not low <= value <= high:
        raise _bad(field, value, f"not in [{low}, {high}]")
    return value


def _list(value: object, field: str, length: int | None = None, most: int = _MAX) -> list[Any]:
    if not isinstance(value, list):
        raise _bad(field, value, "not a list")
    if length is not None and len(value) != length:
        raise _bad(field, value, f"has {len(value)} entries, not {length}")
    if len(value) > most:
        raise _bad(field, value, f"has {len(value)} entries, more than {most}")
    return value


def _dict(value: object, field: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _bad(field, value, "not a mapping")
    return value


def _key(mapping: dict[str, Any], key: str, field: str) -> Any:
    if key not in mapping:
        raise StateError(f"resume state field {field}.{key} is missing")
    return mapping[key]


def check_header(state: object, versions: tuple[int, ...]) -> dict[str, Any]:
    """The state as a dict, if it is one of ``versions`` with a configuration mapping."""
    if not isinstance(state, dict) or state.get("version") not in versions:
        got = state.get("version") if isinstance(state, dict) else None
        shown = " or ".join(map(str, versions))
        raise StateError(f"not a streamrec dataset state of version {shown} (got {got!r})")
    _dict(_key(state, "config", "state"), "config")
    return state


def check_state(
    state: dict[str, Any],
    *,
    cycle_length: int,
    block_length: int,
    deterministic: bool,
    shuffle_buffer: int,
) -> None:
    """Every field of a state of the configuration given (see the module docstring)."""
    _int(_key(state, "epoch", "state"), "epoch", -_MAX, _MAX)
    digest = _key(state, "shards", "state")
    if digest is not None and not (isinstance(digest, str) and len(digest) <= 64):
        raise _bad("shards", digest, "not a shard digest (a short string) or null")
    if not isinstance(_key(state, "finished", "state"), bool):
        raise _bad("finished", state["finished"], "not true or false")
    read, shuffle = _key(state, "read", "state"), _key(state, "shuffle", "state")
    if shuffle_buffer == 0 and shuffle is not None:
        raise _bad("shuffle", shuffle, "a shuffle buffer state, but shuffle_buffer is 0")
    if shuffle_buffer and (read is None) != (shuffle is None):
        raise StateError("resume state fields read and shuffle: one is null, the other not")
    if read is not None:
        if deterministic or cycle_length == 1:
            _check_cycle(_dict(read, "read"), cycle_length, block_length)
        else:
            _check_ready(_dict(read, "read"))
    if shuffle is not None:
        _check_shuffle(_dict(shuffle, "shuffle"), shuffle_buffer, state["version"])


def _position(value: object, field: str) -> list[int]:
    """``[ordinal, records, offset]``."""
    position = _list(value, field, 3)
    for k, name in enumerate(("ordinal", "records", "offset")):
        _int(position[k], f"{field}[{k}] ({name})")
    return position


def _check_cycle(read: dict[str, Any], cycle_length: int, block_length: int) -> None:
    if read.get("kind") != "cycle":
        raise _bad("read.kind", read.get("kind"), "not 'cycle' (deterministic reading)")
    next_ordinal = _int(_key(read, "next", "read"), "read.next")
    _int(_key(read, "index", "read"), "read.index", 0, cycle_length - 1)
    # (sequential reading counts records of a chunk there, and never resumes from it)
    within_most = block_length - 1 if cycle_length > 1 else _MAX
    _int(_key(read, "within", "read"), "read.within", 0, within_most)
    ordinals: set[int] = set()
    for k, slot in enumerate(_list(_key(read, "slots", "read"), "read.slots", cycle_length)):
        if slot is None:
            continue
        field = f"read.slots[{k}]"
        ordinal = _position(slot, field)[0]
        if ordinal >= next_ordinal or ordinal in ordinals:
            raise _bad(field, slot, f"shard {ordinal} is not one opened before read.next, or twice")
        ordinals.add(ordinal)


def _check_ready(read: dict[str, Any]) -> None:
    if read.get("kind") != "ready":
        raise _bad("read.kind", read.get("kind"), "not 'ready' (first-ready reading)")
    done: set[int] = set()
    for k, ordinal in enumerate(_list(_key(read, "done", "read"), "read.done")):
        if _int(ordinal, f"read.done[{k}]") in done:
            raise _bad(f"read.done[{k}]", ordinal, "listed twice")
        done.add(ordinal)
    seen: set[int] = set()
    for k, position in enumerate(_list(_key(read, "open", "read"), "read.open")):
        ordinal = _position(position, f"read.open[{k}]")[0]
        if ordinal in seen or ordinal in done:
            raise _bad(f"read.open[{k}]", position, f"shard {ordinal} is open twice or done")
        seen.add(ordinal)


def _check_shuffle(shuffle: dict[str, Any], shuffle_buffer: int, version: int) -> None:
    buffer = _key(shuffle, "buffer", "shuffle")
    if version >= 2:  # packed (decoding checks the packing; the locations are checked below)
        buffer = decode_buffer(buffer, "shuffle.buffer", most=shuffle_buffer)
    buffer = _list(buffer, "shuffle.buffer", most=shuffle_buffer)
    for k, location in enumerate(buffer):
        field = f"shuffle.buffer[{k}]"
        _list(location, field, 4)
        for j, name in enumerate(("ordinal", "index", "offset", "length")):
            _int(location[j], f"{field}[{j}] ({name})")
    if not isinstance(_key(shuffle, "draining", "shuffle"), bool):
        raise _bad("shuffle.draining", shuffle["draining"], "not true or false")
    _check_rng(_key(shuffle, "rng", "shuffle"))


def _check_rng(value: object) -> None:
    field = "shuffle.rng"
    version, internal, gauss = _list(value, field, 3)
    _int(version, f"{field}[0] (version)", 3, 3)
    words = _list(internal, f"{field}[1]", _MT_WORDS + 1)
    for k in range(_MT_WORDS):
        _int(words[k], f"{field}[1][{k}]", 0, 2**32 - 1)
    _int(words[_MT_WORDS], f"{field}[1][{_MT_WORDS}] (position)", 0, _MT_WORDS)
    if gauss is not None and (isinstance(gauss, bool) or not isinstance(gauss, (int, float))):
        raise _bad(f"{field}[2]", gauss, "not a number or null")
    try:
        random.Random().setstate((version, tuple(words), gauss))
    except (TypeError, ValueError) as exc:
        raise _bad(field, value, f"not a generator state ({exc})") from None


def check_against_plan(resume: dict[str, Any], count: int) -> None:
    """The shard ordinals of a checked state against the ``count`` shards of the epoch's plan
    (byte offsets are checked where a shard is seeked into: see ShardOpener)."""
    read = resume.get("read") or {}
    shuffle = resume.get("shuffle") or {}
    if read.get("kind") == "cycle" and read["next"] > count:
        raise _bad("read.next", read["next"], f"there are only {count} shards to read")
    places: list[tuple[str, list[int]]] = []
    places += [(f"read.slots[{k}]", p) for k, p in enumerate(read.get("slots", [])) if p]
    places += [(f"read.open[{k}]", p) for k, p in enumerate(read.get("open", []))]
    places += [(f"shuffle.buffer[{k}]", p) for k, p in enumerate(shuffle.get("buffer", []))]
    places += [(f"read.done[{k}]", [o]) for k, o in enumerate(read.get("done", []))]
    for field, place in places:
        if place[0] >= count:
            raise _bad(field, place, f"names shard {place[0]}; there are only {count}")
