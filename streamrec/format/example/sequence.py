"""``SequenceExample`` batches as Arrow: :func:`decode_sequence_batch`.

A ``SequenceExample`` is a context (a ``Features`` map, like an ``Example``'s) and feature
lists (per name, a list of steps, each a ``Feature``), as TensorFlow's
``tf.io.parse_sequence_example`` reads them. A batch becomes one ``pyarrow.RecordBatch``:

* each ``context`` feature is a column exactly as :func:`~streamrec.format.example.batch.
  decode_batch` ``(..., to="arrow")`` makes it. The context is the ``SequenceExample``'s field
  1, where an ``Example`` keeps its features, so the C parser decodes it straight from the
  payloads (the feature lists are a field it skips);
* each ``sequence`` feature is a ``large_list`` with one item per step, each step typed as
  that spec's column (``FixedLenFeature(dtype, shape)``: exactly ``prod(shape)`` values a step,
  like ``tf.io.FixedLenSequenceFeature``; ``VarLenFeature``: any number; ``RawFeature``: one
  raw array a step). A record without the feature list has no steps. The steps are decoded
  in C too (``_cexample.parse_sequence_arrow``: counted, then written into Arrow buffers of
  exactly that size), each as a record of ``decode_batch(..., to="arrow")``; a batch it
  declines (anything damaged or unexpected), or every batch without the C parser
  (``STREAMREC_PURE_PYTHON=1``), is decoded with protobuf, record by record, which raises the
  errors below: the same columns either way.

Errors are those of :func:`~streamrec.format.example.decoding.decode`: a damaged payload is an
:class:`~streamrec.errors.ExampleError`, a step that does not match its spec a
:class:`~streamrec.errors.FeatureError` naming the feature, the record of the batch and the
step. This module does no I/O; pyarrow is imported on first use.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from streamrec.errors import ExampleError
from streamrec.format.example import batch
from streamrec.format.example.arrow import (
    allocate,
    arrow_schema,
    batch_from_numpy,
    pyarrow,
    steps_from_c,
)
from streamrec.format.example.batch import decode_batch
from streamrec.format.example.decoding import decode_one, parse_message
from streamrec.format.example.spec import (
    FeatureSpec,
    FixedLenFeature,
    RawFeature,
    VarLenFeature,
    check_spec,
)
from streamrec.format.proto import example_pb2

__all__ = ["decode_sequence_batch", "sequence_schema"]


def decode_sequence_batch(
    payloads: Sequence[Any],
    context: Mapping[str, FeatureSpec] | None = None,
    sequence: Mapping[str, FeatureSpec] | None = None,
) -> Any:
    """Decode serialized ``SequenceExample`` payloads into one ``pyarrow.RecordBatch``: the
    ``context`` features' columns, then one ``large_list`` column of steps per ``sequence``
    feature (see the module docstring)."""
    context_items = check_spec(context or {})
    sequence_items = check_spec(sequence or {})
    # (a name in both specs: a ValueError; a type Arrow lacks: a TypeError)
    _schema(tuple(context_items), tuple(sequence_items))
    pa = pyarrow()
    contexts = decode_batch(payloads, dict(context_items), to="arrow")
    names = [name for name, _ in context_items]
    columns = [contexts.column(name) for name in names]
    # (even without sequence features: every payload must be a valid SequenceExample)
    parsed = batch.parse_sequence_c(payloads, sequence_items, allocate)
    if parsed is None:
        columns.extend(_steps_python(payloads, sequence_items))
    else:
        for (_, entry), counts, buffers in zip(sequence_items, *parsed, strict=True):
            steps = steps_from_c(entry, buffers, int(counts.sum()))
            offsets = np.zeros(len(payloads) + 1, dtype=np.int64)
            np.cumsum(counts, out=offsets[1:])
            columns.append(pa.LargeListArray.from_arrays(pa.array(offsets), steps))
    names.extend(name for name, _ in sequence_items)
    if not columns:
        return contexts  # n rows, no column
    return pa.RecordBatch.from_arrays(columns, names=names)


def sequence_schema(
    context: Mapping[str, FeatureSpec] | None = None,
    sequence: Mapping[str, FeatureSpec] | None = None,
) -> Any:
    """The ``pyarrow.Schema`` of ``decode_sequence_batch(payloads, context, sequence)``: the
    context's fields (as :func:`~streamrec.format.example.arrow.arrow_schema` types them),
    then per feature list a ``large_list`` of its steps' type. A TypeError for a spec with no
    Arrow type, a ValueError for a name in both."""
    return _schema(tuple(check_spec(context or {})), tuple(check_spec(sequence or {})))


@functools.lru_cache(maxsize=64)  # every batch of a dataset checks its specs: once
def _schema(
    context: tuple[tuple[str, FeatureSpec], ...], sequence: tuple[tuple[str, FeatureSpec], ...]
) -> Any:
    both = {name for name, _ in context} & {name for name, _ in sequence}
    if both:
        raise ValueError(f"features named in both context and sequence: {sorted(both)}")
    pa = pyarrow()
    fields = list(arrow_schema(dict(context)))
    for name, entry in sequence:
        step = arrow_schema({name: entry}).field(0).type
        fields.append(pa.field(name, pa.large_list(step)))
    return pa.schema(fields)


def _steps_python(
    payloads: Sequence[Any], sequence_items: list[tuple[str, FeatureSpec]]
) -> list[Any]:
    """The feature-list columns decoded with protobuf, record by record."""
    pa = pyarrow()
    steps: dict[str, list[Any]] = {name: [] for name, _ in sequence_items}
    counts = np.zeros((len(sequence_items), len(payloads)), dtype=np.int64)
    message = example_pb2.SequenceExample()
    for index, payload in enumerate(payloads):
        try:
            parse_message(message, payload, f"record {index} of the batch")
        except ExampleError as error:
            error.batch_index = index
            raise
        lists = message.feature_lists.feature_list
        for k, (name, entry) in enumerate(sequence_items):
            found = lists[name].feature if name in lists else ()
            counts[k, index] = len(found)
            for step, feature in enumerate(found):
                where = f"record {index} of the batch, step {step}: "
                try:
                    steps[name].append(decode_one({name: feature}, name, entry, where))
                except ExampleError as error:  # (a dataset then names the record's place)
                    error.batch_index = index
                    raise
    columns: list[Any] = []
    for k, (name, entry) in enumerate(sequence_items):
        stacked = {name: _stacked(steps[name], entry)}
        per_step = batch_from_numpy(stacked, [(name, entry)], len(steps[name]))
        offsets = np.zeros(len(payloads) + 1, dtype=np.int64)
        np.cumsum(counts[k], out=offsets[1:])
        columns.append(pa.LargeListArray.from_arrays(pa.array(offsets), per_step.column(0)))
    return columns


def _stacked(values: list[Any], entry: FeatureSpec) -> Any:
    """The steps of one feature as ``decode_batch`` would give them for as many records."""
    if isinstance(entry, VarLenFeature):
        return values
    if isinstance(entry, FixedLenFeature) and entry._kind == "bytes":
        dtype: Any = object
    elif isinstance(entry, RawFeature):
        dtype = entry._dtype
    else:
        dtype = np.int64 if entry._kind == "int64" else np.float32
    stacked = np.empty((len(values), *entry.shape), dtype=dtype)
    for index, value in enumerate(values):
        stacked[index, ...] = value
    return stacked
