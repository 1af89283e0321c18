"""streamrec's Example decoding against TensorFlow's ``tf.io.parse_example`` on the same records.

The records are bench_example's (``_harness/examples.py``): ``fixed``, 1 KiB Examples (an int64
label, 64 float32 values, ~700 raw bytes) and ``var``, Examples with variable-length features
(a label, 0-39 int64 ids, 0-4 bytes tags, one 50-499 byte text; ~500 B). Readers, each over all
``--records`` records in batches of 256, 1,024 and 8,192:

* **numpy**: ``decode_batch(batch, spec)``; **arrow**: ``decode_batch(batch, spec, to="arrow")``
  (``to_arrow()``'s path: a ``pyarrow.RecordBatch``; threads by default from 2,048 records);
  **arrow 1 thread**: the same with ``num_threads=1``.
* **tf**: ``tf.io.parse_example(tf.constant(batch), tf_spec)`` in eager mode, the same spec as
  ``tf.io.FixedLenFeature`` / ``VarLenFeature`` (var-length features come back as
  ``SparseTensor`` s; the raw bytes as one ``tf.string`` per record, which TF would still have to
  ``decode_raw``: this favours TF). **tf + .numpy()**: the same, then every output tensor (a
  sparse one's indices, values and dense shape) converted with ``.numpy()``, as a consumer
  outside TF needs them.

Before timing, every reader's values are checked against TF's on the records (parity). The
readers take turns, one pass over the records each (the machine is shared: a neighbour's load
hits all alike), until each has run ``--seconds``; that is one round. The report gives the
medians over ``--rounds`` and the medians of each round's ratios arrow / numpy, arrow / tf.
Without TensorFlow (install it only in a separate environment; see benchmarks/README.md) the
tf rows are skipped with a message and numpy / arrow still run.

``--shapes sequence``: bench_example's SequenceExamples (a context label, 1-20 steps of 8 float32
frames, 0-9 int64 tokens and 0-2 bytes words), ``decode_sequence_batch`` (**arrow**) against
eager ``tf.io.parse_sequence_example`` (``FixedLenSequenceFeature`` / ``VarLenFeature``), values
checked alike first; its own table.

Usage: ``python benchmarks/bench_tf.py [--records N] [--rounds N] [--batches 256,1024,8192]
[--seconds S] [--shapes fixed,var,sequence] [--tf-threads N]`` (``--tf-threads 1``: TF on one
core, as streamrec's decoder).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from _harness.examples import (
    MIXED_SPEC,
    SEQUENCE_CONTEXT,
    SEQUENCE_SPEC,
    make_mixed_payloads,
    make_payloads,
    make_sequence_payloads,
    spec_for,
)
from _harness.report import cpu_model, now, source_state

from streamrec.format import example as ex

Spec = dict[str, ex.FeatureSpec]
NO_TF = (
    "TensorFlow is not installed in this Python: the tf rows are skipped "
    "(run this script with a Python that has tensorflow-cpu; see benchmarks/README.md)"
)


def load_tf() -> Any:
    """The ``tensorflow`` module, or None where it is not installed."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # its start-up banners hide the report
    try:
        import tensorflow as tf  # type: ignore[import-untyped, import-not-found, unused-ignore]
    except ImportError:
        return None
    return tf


def tf_spec(tf: Any, spec: Spec) -> dict[str, Any]:
    """``spec`` as ``tf.io`` features (raw bytes as a ``tf.string`` per record)."""

    def tf_dtype(dtype: object) -> Any:
        if dtype is bytes:
            return tf.string
        return {"int64": tf.int64, "float32": tf.float32}[np.dtype(dtype).name]  # type: ignore[call-overload]

    features: dict[str, Any] = {}
    for name, feature in spec.items():
        if isinstance(feature, ex.VarLenFeature):
            features[name] = tf.io.VarLenFeature(tf_dtype(feature.dtype))
        elif isinstance(feature, ex.RawFeature):
            features[name] = tf.io.FixedLenFeature([], tf.string)
        elif isinstance(feature, ex.FixedLenFeature):
            features[name] = tf.io.FixedLenFeature(list(feature.shape), tf_dtype(feature.dtype))
        else:
            raise TypeError(f"{name}: no TensorFlow equivalent of {feature!r}")
    return features


def tf_to_numpy(tf: Any, parsed: dict[str, Any]) -> dict[str, Any]:
    """Every output tensor of ``parse_example`` as numpy (a sparse one: its three parts)."""
    out: dict[str, Any] = {}
    for name, tensor in parsed.items():
        if isinstance(tensor, tf.SparseTensor):
            out[name] = (tensor.indices.numpy(), tensor.values.numpy(), tensor.dense_shape.numpy())
        else:
            out[name] = tensor.numpy()
    return out


def tf_rows(value: Any, n: int) -> list[list[Any]]:
    """Per-record lists of one feature from :func:`tf_to_numpy`'s output."""
    if isinstance(value, tuple):  # sparse: row index of every value, in row order
        indices, values, _ = value
        rows: list[list[Any]] = [[] for _ in range(n)]
        for row, item in zip(indices[:, 0].tolist(), values.tolist(), strict=True):
            rows[row].append(item)
        return rows
    return [as_list(item) for item in value]


def as_list(item: Any) -> list[Any]:
    """One record's value as a flat list (bytes kept whole: numpy's ``S`` arrays would drop
    their trailing zero bytes)."""
    if isinstance(item, np.ndarray):
        flat: list[Any] = item.reshape(-1).tolist()
        return flat
    if isinstance(item, list):
        return [as_list(part)[0] if isinstance(part, np.generic) else part for part in item]
    return [item.item() if isinstance(item, np.generic) else item]


def check_parity(tf: Any, payloads: list[bytes], spec: Spec) -> None:
    """Assert that numpy, Arrow and TensorFlow decode ``payloads`` to the same values."""
    n = len(payloads)
    ours = ex.decode_batch(payloads, spec)
    arrow = ex.decode_batch(payloads, spec, to="arrow")
    theirs = tf_to_numpy(tf, tf.io.parse_example(tf.constant(payloads), tf_spec(tf, spec)))
    for name, feature in spec.items():
        expected = tf_rows(theirs[name], n)
        if isinstance(feature, ex.RawFeature):  # TF leaves the bytes; ours are the array
            expected = [np.frombuffer(row[0], np.dtype(feature.dtype)).tolist() for row in expected]  # type: ignore[call-overload]
        numpy_rows = [as_list(row) for row in ours[name]]
        arrow_rows = [as_list(row) for row in arrow[name].to_pylist()]
        assert numpy_rows == expected, f"{name}: numpy differs from TensorFlow"
        assert arrow_rows == expected, f"{name}: Arrow differs from TensorFlow"
    one_thread = ex.decode_batch(payloads, spec, to="arrow", num_threads=1)
    assert arrow.equals(one_thread), "Arrow on threads differs from Arrow on one"


def readers(tf: Any, spec: Spec) -> dict[str, Callable[[list[bytes]], object]]:
    """The decoders timed, by name (the tf ones only with TensorFlow)."""
    found: dict[str, Callable[[list[bytes]], object]] = {
        "numpy": lambda batch: ex.decode_batch(batch, spec),
        "arrow": lambda batch: ex.decode_batch(batch, spec, to="arrow"),
        "arrow 1 thread": lambda batch: ex.decode_batch(batch, spec, to="arrow", num_threads=1),
    }
    if tf is not None:
        features = tf_spec(tf, spec)
        found["tf"] = lambda batch: tf.io.parse_example(tf.constant(batch), features)
        found["tf + .numpy()"] = lambda batch: tf_to_numpy(
            tf, tf.io.parse_example(tf.constant(batch), features)
        )
    return found


def side_by_side(
    batches: list[list[bytes]], decoders: dict[str, Callable[[list[bytes]], object]], seconds: float
) -> dict[str, float]:
    """records/s of each decoder over all ``batches``: one pass each in turn (so that a
    neighbour's load hits all alike), until each has run for at least ``seconds``."""
    records = sum(len(batch) for batch in batches)
    spent = dict.fromkeys(decoders, 0.0)
    passes = dict.fromkeys(decoders, 0)
    names, order = list(decoders), random.Random(len(batches))
    while min(spent.values()) < seconds:
        # a new order each pass, so that no reader always follows the same one (in a fixed
        # order arrow, right after numpy, ran 0.86-0.97x arrow 1 thread, the same code)
        order.shuffle(names)
        for name in names:
            started = time.perf_counter()
            for batch in batches:
                decoders[name](batch)
            spent[name] += time.perf_counter() - started
            passes[name] += 1
    return {name: passes[name] * records / spent[name] for name in decoders}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=32_768)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--batches", default="256,1024,8192")
    parser.add_argument("--seconds", type=float, default=0.5, help="per reader and round")
    parser.add_argument("--tf-threads", type=int, help="TF's thread pools (default: all cores)")
    parser.add_argument("--shapes", default="fixed,var", help="fixed, var, sequence")
    args = parser.parse_args()
    tf = load_tf()
    if tf is not None and args.tf_threads:  # per core against streamrec's one thread
        tf.config.threading.set_intra_op_parallelism_threads(args.tf_threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.tf_threads)
    if tf is None:
        print(NO_TF, flush=True)
    sizes = [int(size) for size in args.batches.split(",")]
    if "sequence" in args.shapes:
        sequence_vs_tf(args, tf, sizes)
    fixed = make_payloads(args.records)
    shapes: dict[str, tuple[list[bytes], Spec]] = {}
    if "fixed" in args.shapes:
        shapes["fixed 1 KiB"] = (fixed, spec_for(fixed[0]))
    if "var" in args.shapes:
        shapes["var ~500 B"] = (make_mixed_payloads(args.records), MIXED_SPEC)
    if not shapes:
        return
    if tf is not None:
        for name, (payloads, spec) in shapes.items():
            check_parity(tf, payloads[:2048], spec)
            print(f"{name}: numpy, Arrow and TensorFlow decode the same values", flush=True)
    for payloads, spec in shapes.values():  # first calls (imports, TF's kernels): not timed
        for decode in readers(tf, spec).values():
            decode(payloads[: sizes[-1]])
    rates: dict[tuple[str, int, str], list[float]] = {}
    for round_ in range(args.rounds):
        for name, (payloads, spec) in shapes.items():
            for size in sizes:
                batches = [payloads[i : i + size] for i in range(0, len(payloads), size)]
                for reader, value in side_by_side(batches, readers(tf, spec), args.seconds).items():
                    rates.setdefault((name, size, reader), []).append(value)
        print(f"round {round_ + 1} of {args.rounds} done", flush=True)
    report(args, tf, shapes, sizes, rates)


def report(
    args: argparse.Namespace,
    tf: Any,
    shapes: dict[str, tuple[list[bytes], Spec]],
    sizes: list[int],
    rates: dict[tuple[str, int, str], list[float]],
) -> None:
    """Print the medians and the ratios as a markdown table."""
    names = ["numpy", "arrow", "arrow 1 thread"] + (["tf", "tf + .numpy()"] if tf else [])
    header = " | ".join(f"{name} rec/s" for name in names)
    ratios = ["arrow / numpy", "arrow / arrow 1 thread"]
    ratios += ["arrow / tf", "arrow / (tf + .numpy())", "arrow 1 thread / tf"] if tf else []
    print()
    print(
        f"Command: `python benchmarks/bench_tf.py --records {args.records} --rounds "
        f"{args.rounds} --batches {args.batches} --seconds {args.seconds} --shapes {args.shapes}"
        f"{f' --tf-threads {args.tf_threads}' if args.tf_threads else ''}` ({now()}, load "
        f"{os.getloadavg()[0]:.1f} at the end)."
    )
    versions = f"TensorFlow {tf.__version__}" if tf is not None else "no TensorFlow"
    print(f"Machine: {cpu_model('unknown CPU')}, {os.cpu_count()} cores, {versions}.")
    print(
        f"Source: {source_state()}. Medians of {args.rounds} rounds; "
        "ratios: medians of each round's side-by-side ratio."
    )
    print()
    print(f"| records | batch | {header} | {' | '.join(ratios)} |")
    print("|---|--:|" + "--:|" * (len(names) + len(ratios)))
    for shape in shapes:
        for size in sizes:
            runs = {n: rates[(shape, size, n)] for n in names}
            cells = [f"{statistics.median(runs[n]) / 1e6:.2f} M" for n in names]
            pairs = [("arrow", "numpy"), ("arrow", "arrow 1 thread")]
            if tf is not None:
                pairs += [("arrow", "tf"), ("arrow", "tf + .numpy()"), ("arrow 1 thread", "tf")]
            for mine, other in pairs:
                ratio = statistics.median(
                    a / b for a, b in zip(runs[mine], runs[other], strict=True)
                )
                cells.append(f"{ratio:.2f}x")
            print(f"| {shape} | {size:,} | {' | '.join(cells)} |")
    if tf is None:
        print()
        print(NO_TF)


def sequence_readers(tf: Any) -> dict[str, Callable[[list[bytes]], object]]:
    """``decode_sequence_batch`` and (with TensorFlow) ``tf.io.parse_sequence_example``."""
    found: dict[str, Callable[[list[bytes]], object]] = {
        "arrow": lambda batch: ex.decode_sequence_batch(batch, SEQUENCE_CONTEXT, SEQUENCE_SPEC)
    }
    if tf is not None:
        context = {"label": tf.io.FixedLenFeature([], tf.int64)}
        steps = {
            "frames": tf.io.FixedLenSequenceFeature([8], tf.float32),
            "tokens": tf.io.VarLenFeature(tf.int64),
            "words": tf.io.VarLenFeature(tf.string),
        }
        found["tf"] = lambda batch: tf.io.parse_sequence_example(
            tf.constant(batch), context_features=context, sequence_features=steps
        )
    return found


def check_sequence_parity(tf: Any, payloads: list[bytes]) -> None:
    """Assert that ``decode_sequence_batch`` and TensorFlow decode the same values (every
    record's lists have as many steps as its frames: TF gives only their lengths)."""
    context, steps, lengths = sequence_readers(tf)["tf"](payloads)  # type: ignore[misc]
    ours = ex.decode_sequence_batch(payloads, SEQUENCE_CONTEXT, SEQUENCE_SPEC)
    assert ours.column("label").to_pylist() == context["label"].numpy().tolist()
    counts = lengths["frames"].numpy().tolist()
    frames = steps["frames"].numpy()
    expected = [frames[i, :count].tolist() for i, count in enumerate(counts)]
    assert ours.column("frames").to_pylist() == expected, "frames differ from TensorFlow"
    for name in ("tokens", "words"):
        rows: list[list[list[Any]]] = [[[] for _ in range(count)] for count in counts]
        sparse = steps[name]
        for (row, step, _), value in zip(
            sparse.indices.numpy().tolist(), sparse.values.numpy().tolist(), strict=True
        ):
            rows[row][step].append(value)
        assert ours.column(name).to_pylist() == rows, f"{name} differs from TensorFlow"


def sequence_vs_tf(args: argparse.Namespace, tf: Any, sizes: list[int]) -> None:
    """The ``--shapes sequence`` table: records/s, medians of ``--rounds`` side-by-side runs."""
    payloads = make_sequence_payloads(args.records)
    if tf is not None:
        check_sequence_parity(tf, payloads[:2048])
        print("SequenceExamples: streamrec and TensorFlow decode the same values", flush=True)
    decoders = sequence_readers(tf)
    for decode in decoders.values():  # first calls: not timed
        decode(payloads[: sizes[-1]])
    rates: dict[tuple[int, str], list[float]] = {}
    for _ in range(args.rounds):
        for size in sizes:
            batches = [payloads[i : i + size] for i in range(0, len(payloads), size)]
            for reader, value in side_by_side(batches, decoders, args.seconds).items():
                rates.setdefault((size, reader), []).append(value)
    print(f"\nSequenceExamples, {args.records:,} records ({now()}, load {os.getloadavg()[0]:.1f}):")
    print("| batch | arrow rec/s | tf rec/s | arrow / tf |\n|--:|--:|--:|--:|")
    for size in sizes:
        arrow = rates[(size, "arrow")]
        if tf is None:
            print(f"| {size:,} | {statistics.median(arrow) / 1e6:.2f} M | - | - |")
            continue
        theirs = rates[(size, "tf")]
        ratio = statistics.median(a / b for a, b in zip(arrow, theirs, strict=True))
        print(
            f"| {size:,} | {statistics.median(arrow) / 1e6:.2f} M | "
            f"{statistics.median(theirs) / 1e6:.2f} M | {ratio:.2f}x |"
        )


if __name__ == "__main__":
    main()
