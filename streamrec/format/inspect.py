"""Look inside TFRecord payloads: render them as JSON, and summarise their features.

Used by ``streamrec head --decode`` and ``streamrec inspect``, and usable directly::

    from streamrec.format.inspect import Inspector, render_payload

    kind, rendering = render_payload(payload)     # ("example", {"has_features_field": ...})
    inspector = Inspector()
    for payload in payloads:
        inspector.add(payload)
    inspector.report()                              # per-feature stats + a suggested spec

Renderings follow the reference corpus manifest (``shared/corpus/manifest.json``): keys sorted,
a feature is ``{"bytes_list": [...]}``, ``{"int64_list": [...]}`` or ``{"float_list":
[repr(float32) ...], "float_list_hex": [big-endian bits ...]}`` (``{}`` when no kind is set);
bytes are base64, or ``{"length", "sha256"}`` when longer than ``max_inline_bytes``.

Which message a payload holds is not written anywhere, so :func:`classify` guesses: a payload
that parses as a ``SequenceExample`` with ``feature_lists`` is one, else a payload that parses
as an ``Example`` without unknown fields is one, else it is ``"raw"`` (not a protobuf of
either kind). An empty payload is an empty ``Example``.

This module does no I/O.
"""

from __future__ import annotations

import base64
import hashlib
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

import numpy as np
from google.protobuf.message import DecodeError, Message

from streamrec.errors import ExampleError
from streamrec.format.example.decoding import float_values
from streamrec.format.proto import example_pb2, feature_pb2

__all__ = [
    "DEFAULT_MAX_INLINE_BYTES",
    "FeatureStats",
    "Inspector",
    "PayloadKind",
    "classify",
    "render_feature",
    "render_payload",
    "spec_source",
]

#: What a payload holds: a tf.train.Example, a tf.train.SequenceExample, or neither.
PayloadKind: TypeAlias = Literal["example", "sequence_example", "raw"]
#: Bytes values up to this long are rendered inline (base64); longer ones as length + sha256.
DEFAULT_MAX_INLINE_BYTES = 64

_KIND_NAMES = {"bytes_list": "bytes", "float_list": "float", "int64_list": "int64"}
_SPEC_DTYPES = {"bytes": "bytes", "float": "np.float32", "int64": "np.int64"}
_PARSE_ERRORS = (DecodeError, ValueError, IndexError, OverflowError)

Parsed: TypeAlias = example_pb2.Example | example_pb2.SequenceExample | None


# ------------------------------------------------------------------------------- classify


def _parses(message: Message, payload: bytes) -> bool:
    """Parse ``payload`` into ``message``; True when it parsed without unknown fields."""
    try:
        message.ParseFromString(payload)
    except _PARSE_ERRORS:
        return False
    with_unknown = message.ByteSize()
    message.DiscardUnknownFields()
    return message.ByteSize() == with_unknown


def classify(
    payload: bytes, kind: str = "auto", *, prefer_sequence: bool = False
) -> tuple[PayloadKind, Parsed]:
    """Return ``(kind, parsed message)`` for ``payload`` (the message is None for ``"raw"``).

    ``kind="auto"`` guesses as the module docstring says; with ``prefer_sequence`` (say, once
    the same file has shown a SequenceExample) a payload valid as both, such as an empty one,
    is a SequenceExample. ``"example"`` and ``"sequence_example"`` insist, and raise
    :class:`~streamrec.errors.ExampleError` when the payload is not one; ``"raw"`` never
    parses.
    """
    if kind == "raw":
        return "raw", None
    if kind in ("auto", "sequence_example"):
        sequence = example_pb2.SequenceExample()
        if _parses(sequence, payload) and (
            kind == "sequence_example" or prefer_sequence or sequence.HasField("feature_lists")
        ):
            return "sequence_example", sequence
        if kind == "sequence_example":
            raise ExampleError("payload is not a valid serialized SequenceExample")
    if kind not in ("auto", "example"):
        raise ValueError(f"kind must be auto, example, sequence_example or raw, not {kind!r}")
    example = example_pb2.Example()
    if _parses(example, payload):
        return "example", example
    if kind == "example":
        raise ExampleError("payload is not a valid serialized Example")
    return "raw", None


# --------------------------------------------------------------------------------- render


def _render_bytes(value: bytes, max_inline_bytes: int) -> str | dict[str, Any]:
    if len(value) > max_inline_bytes:
        return {"length": len(value), "sha256": hashlib.sha256(value).hexdigest()}
    return base64.b64encode(value).decode("ascii")


def render_feature(
    feature: feature_pb2.Feature, max_inline_bytes: int = DEFAULT_MAX_INLINE_BYTES
) -> dict[str, Any]:
    """One ``Feature`` as JSON-able data, in the corpus manifest's style."""
    kind = feature.WhichOneof("kind")
    if kind == "bytes_list":
        values = [_render_bytes(v, max_inline_bytes) for v in feature.bytes_list.value]
        return {"bytes_list": values}
    if kind == "int64_list":
        return {"int64_list": list(feature.int64_list.value)}
    if kind == "float_list":
        floats = float_values(feature.float_list)
        bits = floats.astype(np.float32).view(np.uint32)
        return {
            "float_list": [repr(float(v)) for v in floats],
            "float_list_hex": [f"{int(b):08x}" for b in bits],
        }
    return {}


def _render_features(features: feature_pb2.Features, limit: int) -> dict[str, Any]:
    entries = features.feature
    return {name: render_feature(entries[name], limit) for name in sorted(entries)}


def _render_message(message: Parsed, limit: int) -> dict[str, Any]:
    if isinstance(message, example_pb2.Example):
        return {
            "has_features_field": message.HasField("features"),
            "features": _render_features(message.features, limit),
        }
    assert isinstance(message, example_pb2.SequenceExample)
    lists = message.feature_lists.feature_list
    return {
        "has_context_field": message.HasField("context"),
        "has_feature_lists_field": message.HasField("feature_lists"),
        "context": _render_features(message.context, limit),
        "feature_lists": {
            name: [render_feature(step, limit) for step in lists[name].feature]
            for name in sorted(lists)
        },
    }


def render_payload(
    payload: bytes,
    *,
    kind: str = "auto",
    prefer_sequence: bool = False,
    max_inline_bytes: int = DEFAULT_MAX_INLINE_BYTES,
) -> tuple[PayloadKind, dict[str, Any] | None]:
    """``(kind, rendering)`` of one payload; the rendering is None for ``"raw"`` payloads.

    ``kind`` and ``prefer_sequence`` are as for :func:`classify`; bytes values longer than
    ``max_inline_bytes`` are rendered as ``{"length", "sha256"}``.
    """
    found, message = classify(payload, kind, prefer_sequence=prefer_sequence)
    if message is None:
        return found, None
    return found, _render_message(message, max_inline_bytes)


# -------------------------------------------------------------------------------- inspect


@dataclass
class Summary:
    """Running min / max / mean of non-negative integers."""

    n: int = 0
    total: int = 0
    low: int = 0
    high: int = 0

    def add(self, value: int) -> None:
        """Count one more value."""
        if self.n == 0 or value < self.low:
            self.low = value
        if self.n == 0 or value > self.high:
            self.high = value
        self.n += 1
        self.total += value

    @property
    def constant(self) -> bool:
        """True when at least one value was seen and all were equal."""
        return self.n > 0 and self.low == self.high

    def as_dict(self) -> dict[str, float] | None:
        """``{"min", "max", "mean"}`` (mean rounded to 3 places), or None when empty."""
        if self.n == 0:
            return None
        return {"min": self.low, "max": self.high, "mean": round(self.total / self.n, 3)}

    def describe(self) -> str:
        """``"4"`` when constant, ``"1..7 (mean 3.2)"`` otherwise, ``"-"`` when empty."""
        if self.n == 0:
            return "-"
        if self.constant:
            return str(self.low)
        mean = f"{self.total / self.n:.2f}".rstrip("0").rstrip(".")
        return f"{self.low}..{self.high} (mean {mean})"


def _is_text(value: bytes) -> bool:
    try:
        return value.decode("utf-8").isprintable()
    except UnicodeDecodeError:
        return False


@dataclass
class FeatureStats:
    """What a sample says about one feature.

    ``section`` is ``"features"`` (Example), ``"context"`` or ``"feature_lists"``
    (SequenceExample). ``records`` counts sampled records holding the feature; ``kinds`` counts
    the kinds seen (``"bytes"``, ``"float"``, ``"int64"``, ``"none"`` for a kind-less Feature),
    per record, or per step for feature lists. ``values`` are value counts per record (per
    step for feature lists), ``steps`` the steps per record (feature lists only),
    ``value_bytes`` the size of each bytes value.
    """

    section: str
    name: str
    records: int = 0
    kinds: Counter[str] = field(default_factory=Counter)
    values: Summary = field(default_factory=Summary)
    steps: Summary = field(default_factory=Summary)
    value_bytes: Summary = field(default_factory=Summary)
    text: bool = True  # every bytes value seen is printable UTF-8

    def add(self, feature: feature_pb2.Feature) -> None:
        """Count one Feature (one record's value, or one step of a feature list)."""
        kind = feature.WhichOneof("kind")
        self.kinds[_KIND_NAMES.get(kind or "", "none")] += 1
        if kind is None:
            self.values.add(0)
            return
        values = getattr(feature, kind).value
        self.values.add(len(values))
        if kind == "bytes_list":
            for value in values:
                self.value_bytes.add(len(value))
                if self.text and not _is_text(value):
                    self.text = False

    @property
    def kind(self) -> str:
        """The one kind seen (ignoring kind-less Features), ``"mixed"`` or ``"none"``."""
        real = sorted(k for k in self.kinds if k != "none")
        if not real:
            return "none"
        return real[0] if len(real) == 1 else "mixed"

    def suggest(self, sampled: int) -> tuple[str | None, str]:
        """``(spec, note)``: a feature spec for :func:`streamrec.example.decode_batch`.

        ``sampled`` is the number of sampled records of this feature's message type. The spec
        is None when no spec fits (feature lists, mixed or missing kinds).
        """
        kind = self.kind
        if self.section == "feature_lists":
            return None, "feature list: decode with streamrec.example.decode_sequence"
        if kind == "mixed":
            return None, "mixed kinds: " + ", ".join(sorted(self.kinds))
        if kind == "none":
            return None, "no kind set in any sampled record"
        dtype = _SPEC_DTYPES[kind]
        missing = sampled - self.records
        if missing:
            note = f"missing in {missing} of {sampled} records"
            return f"VarLenFeature({dtype})", note
        if not self.values.constant or self.values.low == 0:
            return f"VarLenFeature({dtype})", ""
        return self._fixed(kind, dtype, self.values.low)

    def _fixed(self, kind: str, dtype: str, count: int) -> tuple[str, str]:
        if kind == "bytes" and count == 1 and self.value_bytes.constant and not self.text:
            size = self.value_bytes.low
            note = f"{size} raw bytes: put the dtype and shape they were written with"
            return f"RawFeature(np.uint8, ({size},))", note
        if count == 1:
            return f"FixedLenFeature({dtype})", ""
        return f"FixedLenFeature({dtype}, ({count},))", ""


class Inspector:
    """Accumulate feature statistics over a sample of payloads; see :meth:`report`.

    ``kind`` is as for :func:`classify`; in ``"auto"`` mode, once a SequenceExample has been
    seen, payloads valid as both kinds count as SequenceExamples.
    """

    def __init__(self, kind: str = "auto") -> None:
        self.kind = kind
        self.records = 0
        self.kinds: Counter[str] = Counter()
        self.payload_bytes = Summary()
        self.features: dict[tuple[str, str], FeatureStats] = {}

    def add(self, payload: bytes) -> None:
        """Count one payload (raises ExampleError only when ``kind`` insists on a type)."""
        found, message = classify(
            payload, self.kind, prefer_sequence=self.kinds["sequence_example"] > 0
        )
        self.records += 1
        self.kinds[found] += 1
        self.payload_bytes.add(len(payload))
        if isinstance(message, example_pb2.Example):
            self._add_features("features", message.features)
        elif isinstance(message, example_pb2.SequenceExample):
            self._add_features("context", message.context)
            self._add_lists(message.feature_lists)

    def add_all(self, payloads: Iterable[bytes]) -> None:
        """:meth:`add` each payload."""
        for payload in payloads:
            self.add(payload)

    def _stats(self, section: str, name: str) -> FeatureStats:
        key = (section, name)
        stats = self.features.get(key)
        if stats is None:
            stats = self.features[key] = FeatureStats(section, name)
        return stats

    def _add_features(self, section: str, features: feature_pb2.Features) -> None:
        for name, feature in features.feature.items():
            stats = self._stats(section, name)
            stats.records += 1
            stats.add(feature)

    def _add_lists(self, lists: feature_pb2.FeatureLists) -> None:
        for name, feature_list in lists.feature_list.items():
            stats = self._stats("feature_lists", name)
            stats.records += 1
            stats.steps.add(len(feature_list.feature))
            for step in feature_list.feature:
                stats.add(step)

    def sampled(self, section: str) -> int:
        """How many sampled records have ``section`` (Examples or SequenceExamples)."""
        return self.kinds["example" if section == "features" else "sequence_example"]

    def ordered(self) -> list[FeatureStats]:
        """Every feature: Example features, then context, then feature lists; by name."""
        order = {"features": 0, "context": 1, "feature_lists": 2}
        return sorted(self.features.values(), key=lambda s: (order[s.section], s.name))

    def spec(self) -> dict[str, str]:
        """Suggested spec of the Example features (or the context), name -> spec source."""
        examples, sequences = self.kinds["example"], self.kinds["sequence_example"]
        section = "features" if examples >= sequences else "context"
        found: dict[str, str] = {}
        for stats in self.ordered():
            if stats.section == section:
                spec, _ = stats.suggest(self.sampled(section))
                if spec is not None:
                    found[stats.name] = spec
        return found

    def report(self) -> dict[str, Any]:
        """Everything learnt, as JSON-able data (the ``--json`` output of ``inspect``)."""
        features = []
        for stats in self.ordered():
            spec, note = stats.suggest(self.sampled(stats.section))
            features.append(
                {
                    "section": stats.section,
                    "name": stats.name,
                    "kind": stats.kind,
                    "kinds": dict(sorted(stats.kinds.items())),
                    "records": stats.records,
                    "of_records": self.sampled(stats.section),
                    "values": stats.values.as_dict(),
                    "steps": stats.steps.as_dict(),
                    "value_bytes": stats.value_bytes.as_dict(),
                    "spec": spec,
                    "note": note,
                }
            )
        return {
            "records": self.records,
            "kinds": {k: self.kinds[k] for k in ("example", "sequence_example", "raw")},
            "payload_bytes": self.payload_bytes.as_dict(),
            "features": features,
            "spec": self.spec(),
        }


def spec_source(spec: dict[str, str]) -> str:
    """Python source for a spec mapping (name -> spec expression), ready to paste."""
    lines = ["import numpy as np", "from streamrec.example import "]
    used = sorted({entry.split("(", 1)[0] for entry in spec.values()})
    lines[1] += ", ".join(used) if used else "FixedLenFeature"
    lines.append("")
    lines.append("spec = {")
    lines += [f"    {name!r}: {entry}," for name, entry in spec.items()]
    lines.append("}")
    return "\n".join(lines)
