"""A feature spec inferred from a sample of Examples, and specs as JSON (sans-I/O).

:class:`SpecInference` takes records one at a time, as the dicts :func:`decode` returns without
a spec (or as payloads), and gives the spec that parses every one of them::

    inference = SpecInference()
    for payload in payloads:
        inference.add_payload(payload)
    spec = inference.spec()             # {"label": FixedLenFeature(np.int64), ...}
    decode_batch(payloads, spec)        # parses the whole sample

Per feature: its kind (``int64_list`` -> ``np.int64``, ``float_list`` -> ``np.float32``,
``bytes_list`` -> ``bytes``); present in every record with the same count ``c >= 1`` gives
``FixedLenFeature(dtype)`` (``c == 1``) or ``FixedLenFeature(dtype, (c,))``; a count that
varies, is 0, or a feature missing from some record gives ``VarLenFeature(dtype)``. A
kind-less ``Feature`` parses as zero values of any kind: it counts towards the count, not the
kind (payloads tell it apart; :func:`decode`'s dicts do not, where it is an empty float32
array, so :meth:`SpecInference.add_payload` is exact and ``add`` takes it as a float). A
feature seen with
two kinds has no spec that parses both: it is left out, with the reason in :attr:`skipped`.
The spec is only as good as the sample: pick the sample across the whole dataset
(:func:`sample_positions`, :func:`shard_quotas`), not from its first records.

:func:`spec_to_json` / :func:`spec_from_json` write and read a spec as plain JSON data
(``streamrec convert --spec FILE.json``), and :func:`spec_entry_source` gives the Python
expression of one entry (``inspect --schema`` prints a spec to paste).
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from streamrec.format.example.decoding import parse_message
from streamrec.format.example.spec import (
    DTYPE_OF_KIND,
    Decoded,
    FeatureSpec,
    FixedLenFeature,
    RawFeature,
    VarLenFeature,
    check_spec,
)
from streamrec.format.proto import example_pb2

__all__ = [
    "SpecInference",
    "infer_spec",
    "sample_positions",
    "shard_quotas",
    "spec_entry_source",
    "spec_from_json",
    "spec_to_json",
]

_DTYPES: dict[str, object] = {"int64": np.int64, "float32": np.float32, "bytes": bytes}
_SOURCE_DTYPES = {"int64": "np.int64", "float32": "np.float32", "bytes": "bytes"}


@dataclass
class _Seen:
    """What the sample showed of one feature."""

    records: int = 0
    kinds: Counter[str] = field(default_factory=Counter)
    counts: set[int] = field(default_factory=set)


def _kind_and_count(value: Decoded) -> tuple[str, int]:
    """``(kind, count)`` of a value as :func:`decode` returns it."""
    if isinstance(value, list):
        return "bytes", len(value)
    if value.dtype == np.int64:
        return "int64", int(value.size)
    if value.dtype == np.float32:
        return "float32", int(value.size)
    raise TypeError(f"a decoded feature is an int64 / float32 array or a list, not {value.dtype}")


class SpecInference:
    """Accumulates what a sample of Examples shows of their features; see :meth:`spec`."""

    def __init__(self) -> None:
        self.records = 0
        self._seen: dict[str, _Seen] = {}

    def add(self, features: Mapping[str, Decoded]) -> None:
        """Count one record, as :func:`decode` (without a spec) returns it."""
        self.records += 1
        for name, value in features.items():
            self._count(name, *_kind_and_count(value))

    def add_payload(self, payload: bytes) -> None:
        """Count one serialized Example (:class:`~streamrec.errors.ExampleError` if it is not)."""
        message = example_pb2.Example()
        parse_message(message, payload, "payload")
        self.records += 1
        for name, feature in message.features.feature.items():
            kind = feature.WhichOneof("kind")
            if kind is None:  # tf.train.Feature(): zero values of whatever kind is asked
                self._count(name, None, 0)
            else:
                self._count(name, DTYPE_OF_KIND[kind], len(getattr(feature, kind).value))

    def _count(self, name: str, kind: str | None, count: int) -> None:
        seen = self._seen.get(name)
        if seen is None:
            seen = self._seen[name] = _Seen()
        seen.records += 1
        if kind is not None:
            seen.kinds[kind] += 1
        seen.counts.add(count)

    def add_all(self, payloads: Iterable[bytes]) -> None:
        """:meth:`add_payload` each payload."""
        for payload in payloads:
            self.add_payload(payload)

    @property
    def skipped(self) -> dict[str, str]:
        """Features left out of :meth:`spec`, name -> why."""
        return {
            name: "seen with kinds " + " and ".join(sorted(seen.kinds))
            for name, seen in sorted(self._seen.items())
            if len(seen.kinds) > 1
        }

    def spec(self) -> dict[str, FeatureSpec]:
        """The spec that parses every record counted, features by name."""
        spec: dict[str, FeatureSpec] = {}
        for name, seen in sorted(self._seen.items()):
            if len(seen.kinds) > 1:
                continue
            kind = next(iter(seen.kinds), "float32")  # never a kind: zero values of any
            dtype = _DTYPES[kind]
            everywhere = seen.records == self.records
            if everywhere and len(seen.counts) == 1 and (count := min(seen.counts)) >= 1:
                spec[name] = FixedLenFeature(dtype, () if count == 1 else (count,))
            else:
                spec[name] = VarLenFeature(dtype)
        return spec


def infer_spec(payloads: Iterable[bytes]) -> dict[str, FeatureSpec]:
    """The spec that parses every one of ``payloads`` (serialized Examples)."""
    inference = SpecInference()
    inference.add_all(payloads)
    return inference.spec()


def sample_positions(total: int, n: int, seed: int = 0) -> list[int]:
    """``min(n, total)`` distinct record numbers drawn uniformly from ``range(total)``, sorted
    (the same for the same ``seed``)."""
    if n < 0 or total < 0:
        raise ValueError(f"total and n must be non-negative, not {total}, {n}")
    if n >= total:
        return list(range(total))
    return sorted(random.Random(seed).sample(range(total), n))


def shard_quotas(num_shards: int, n: int) -> list[tuple[int, int]]:
    """``(shard number, records to take)`` for a sample of ``n`` records when the shards'
    counts are not known: every shard when ``n >= num_shards`` (``ceil(n / num_shards)``
    records each), else ``n`` shards evenly spread over the listing, one record each."""
    if num_shards <= 0 or n <= 0:
        return []
    if n >= num_shards:
        return [(i, math.ceil(n / num_shards)) for i in range(num_shards)]
    return [((2 * j + 1) * num_shards // (2 * n), 1) for j in range(n)]


# ----------------------------------------------------------------------------------- text


def spec_entry_source(entry: FeatureSpec) -> str:
    """The Python expression of one spec entry (``np`` for numpy)."""
    if isinstance(entry, VarLenFeature):
        return f"VarLenFeature({_SOURCE_DTYPES[_kind_of(entry.dtype)]})"
    if isinstance(entry, FixedLenFeature):
        dtype = _SOURCE_DTYPES[_kind_of(entry.dtype)]
        if entry.default is not None:
            return f"FixedLenFeature({dtype}, {entry.shape!r}, default={entry.default!r})"
        return f"FixedLenFeature({dtype}" + (f", {entry.shape!r})" if entry.shape else ")")
    return f"RawFeature(np.dtype({entry.dtype.str!r}), {entry.shape!r})"  # type: ignore[attr-defined]


def _kind_of(dtype: object) -> str:
    if dtype is bytes:
        return "bytes"
    return "int64" if np.dtype(dtype) == np.int64 else "float32"  # type: ignore[call-overload]


def spec_to_json(spec: Mapping[str, FeatureSpec]) -> dict[str, Any]:
    """``spec`` as JSON data: ``{name: {"type": "fixed" | "varlen" | "raw", "dtype", "shape"}}``
    (dtype ``int64``, ``float32`` or ``bytes``; a raw entry's any numpy dtype string; a fixed
    entry's default is not kept)."""
    doc: dict[str, Any] = {}
    for name, entry in check_spec(spec):
        if isinstance(entry, VarLenFeature):
            doc[name] = {"type": "varlen", "dtype": _kind_of(entry.dtype)}
        elif isinstance(entry, FixedLenFeature):
            doc[name] = {
                "type": "fixed",
                "dtype": _kind_of(entry.dtype),
                "shape": list(entry.shape),
            }
        else:
            raw: Any = entry.dtype
            doc[name] = {"type": "raw", "dtype": raw.str, "shape": list(entry.shape)}
    return doc


def spec_from_json(doc: object) -> dict[str, FeatureSpec]:
    """The spec :func:`spec_to_json` wrote; ValueError naming the feature when it is not one."""
    if not isinstance(doc, dict):
        raise ValueError(f"a spec is a JSON object of feature name -> entry, not {doc!r}")
    spec: dict[str, FeatureSpec] = {}
    for name, item in doc.items():
        try:
            if not isinstance(item, dict):
                raise ValueError(f"an entry is an object with type and dtype, not {item!r}")
            kind, dtype, shape = item.get("type"), item.get("dtype"), item.get("shape", [])
            if not isinstance(shape, list):
                raise ValueError(f"shape must be a list of ints, not {shape!r}")
            if kind == "raw":
                spec[name] = RawFeature(np.dtype(str(dtype)), tuple(shape))
                continue
            if dtype not in _DTYPES:
                raise ValueError(f"dtype must be int64, float32 or bytes, not {dtype!r}")
            if kind == "fixed":
                spec[name] = FixedLenFeature(_DTYPES[str(dtype)], tuple(shape))
            elif kind == "varlen":
                spec[name] = VarLenFeature(_DTYPES[str(dtype)])
            else:
                raise ValueError(f"type must be fixed, varlen or raw, not {kind!r}")
        except (TypeError, ValueError) as exc:
            raise ValueError(f"spec entry {name!r}: {exc}") from exc
    return spec
