"""The configuration a resume state records, and its check against the dataset's.

A state records the settings that decide the order of records
(:data:`~streamrec.pipeline.options.CONFIG_KEYS`) and the urls, and is refused by a dataset
configured otherwise. From version 3 on, a setting is left out where it has its value of
:data:`DEFAULTS` (a literal of the format: it never follows the library's defaults) and the urls
are named as :mod:`~streamrec.pipeline.position.url_names` names them, so a state stays small
(a mix holds one per source): ``{"urls": ["data/*.tfrecord"], "seed": 3, "shuffle": "global"}``.
A setting missing from a state of any version has its value of :data:`DEFAULTS` (version 1 had
no ``shuffle``, ``even`` or ``window_records``: they were None, as there).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from streamrec.errors import StateError
from streamrec.pipeline.position.url_names import canonical, differences

__all__ = ["DEFAULTS", "check_config", "compact"]

DEFAULTS: Mapping[str, Any] = {
    "compression": "auto",
    "on_corrupt": "raise",
    "cycle_length": 1,
    "block_length": 1,
    "deterministic": True,
    "shuffle_shards": False,
    "shuffle_buffer": 0,
    "seed": 0,
    "num_hosts": 1,
    "host_index": 0,
    "shuffle": None,
    "even": None,
    "window_records": None,
}
"""The value a setting has where a state leaves it out (state version 3; a literal: a state
keeps its meaning when the library's defaults change)."""


def _is_default(key: str, value: object) -> bool:
    if key not in DEFAULTS:
        return False
    default = DEFAULTS[key]
    return type(value) is type(default) and value == default  # (True is not 1 here)


def compact(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` as a state records it: the urls first, then the settings that are not
    their default."""
    recorded = {"urls": config.get("urls")}
    recorded.update((k, v) for k, v in config.items() if k != "urls" and not _is_default(k, v))
    return recorded


def _setting(config: Mapping[str, Any], key: str) -> Any:
    return config[key] if key in config else DEFAULTS.get(key)


def _shown(value: object) -> str:
    shown = repr(value)
    return shown if len(shown) <= 80 else shown[:77] + "..."


def check_config(saved: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
    """The configuration ``saved`` by a state of any version, recorded as today's states
    record it (:func:`compact`, urls in today's form); StateError listing, in words, how it
    differs from the dataset's ``config``."""
    urls = canonical(saved.get("urls"))  # (every earlier version listed them)
    found = []
    urls_differ = differences(urls, canonical(config.get("urls")))  # type: ignore[arg-type]
    if urls_differ is not None:
        found.append(urls_differ)
    for key in sorted((set(saved) | set(config)) - {"urls"}):
        theirs, ours = _setting(saved, key), _setting(config, key)
        if theirs != ours or type(theirs) is not type(ours):
            found.append(f"{key}: state has {_shown(theirs)}, dataset has {ours!r}")
    if found:
        raise StateError(
            "the state comes from a differently configured dataset; " + "; ".join(found)
        )
    return compact({**saved, "urls": urls})
