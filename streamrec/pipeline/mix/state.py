"""A mix's resume state: the JSON ``MixedDataset.state_dict()`` returns, checked on load.

::

    {"version": 1, "kind": "mix", "epoch": 0,
     "config": {"seed": 0, "weights": [0.7, 0.3], "stop": "all", "sources": 2},
     "draws": 1234, "exhausted": [false, true], "finished": false,
     "sources": [<each source's Dataset.state_dict()>, ...]}

States are untrusted (they come from storage): :func:`parse_mix_state` checks every field of the
mix's own part before any use; each source's state is checked by its dataset on load.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from streamrec.errors import StateError

__all__ = ["MIX_STATE_VERSION", "parse_mix_state"]

MIX_STATE_VERSION = 1


def parse_mix_state(
    raw: object, config: Mapping[str, Any]
) -> tuple[int, int, tuple[bool, ...], bool, list[dict[str, Any]]]:
    """A mix state's fields, each checked (states are untrusted), or StateError."""
    if not isinstance(raw, dict) or raw.get("kind") != "mix":
        raise StateError("not a streamrec mix state (no 'kind': 'mix')")
    if raw.get("version") != MIX_STATE_VERSION:
        raise StateError(f"mix state version {raw.get('version')!r} is not supported")
    theirs = raw.get("config")
    if theirs != dict(config):
        raise StateError(f"the state comes from another mix: state has {theirs!r}, not {config!r}")
    epoch, draws = raw.get("epoch"), raw.get("draws")
    for name, value in (("epoch", epoch), ("draws", draws)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**62:
            raise StateError(f"mix state field {name}: {value!r} is not a count")
    exhausted, finished = raw.get("exhausted"), raw.get("finished")
    sources = raw.get("sources")
    n = config["sources"]
    if not (
        isinstance(exhausted, list)
        and len(exhausted) == n
        and all(isinstance(e, bool) for e in exhausted)
    ):
        raise StateError(f"mix state field exhausted: {exhausted!r} is not {n} booleans")
    if not isinstance(finished, bool):
        raise StateError(f"mix state field finished: {finished!r} is not a boolean")
    if not (isinstance(sources, list) and len(sources) == n):
        raise StateError(f"mix state field sources: not a list of {n} states")
    if all(exhausted) and not finished:
        raise StateError("mix state: every source exhausted, yet not finished")
    assert isinstance(epoch, int) and isinstance(draws, int)
    return epoch, draws, tuple(exhausted), finished, sources
