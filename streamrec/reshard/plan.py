"""Planning a reshard (sans-I/O): input shards -> deterministic tasks -> output names.

Everything here is a pure function of the sorted input listing and the job's arguments, so a
rerun (or another engine, or a Dask worker) computes exactly the same tasks, the same output
names and the same job fingerprint. See :mod:`streamrec.reshard.job` for how the plan is run and
resumed.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from streamrec.format.index.core import INDEX_SUFFIX
from streamrec.manifest.core import MANIFEST_NAME
from streamrec.pipeline.listing.plan import seeded_random
from streamrec.redact import unsigned_name
from streamrec.storage.base import ObjectInfo
from streamrec.write.template import parse_fields, template_directory

__all__ = [
    "DEFAULT_SHUFFLE_BUFFER",
    "MANIFEST_NAME",
    "PLAN_VERSION",
    "Mode",
    "Naming",
    "Plan",
    "TaskSpec",
    "default_task_bytes",
    "group_by_bytes",
    "make_plan",
    "split_counts",
    "split_groups",
    "split_rows",
]

PLAN_VERSION = 3  # 2: one rotation task numbers 0, 1, 2, ...; 3: so do tasks with known counts
SCRATCH_DIR = "_reshard"
DEFAULT_SHUFFLE_BUFFER = 4096
MIN_TASK_BYTES = 256 << 20
MAX_CYCLE = 16

Mode = Literal["rotate", "fixed"]


# ----------------------------------------------------------------------------------------------
# output names


def _escape(text: str) -> str:
    """``text`` as a str.format template that formats to itself."""
    return text.replace("{", "{{").replace("}", "}}")


class Naming:
    """The user's destination template and the names derived from it.

    Fields: ``{index}`` (the output shard's number), ``{num_shards}`` (with ``num_shards``
    only) and ``{task}`` (rotation only: the task that wrote the shard). In rotation mode
    (``max_records`` / ``max_bytes``) a template without ``{task}`` has its ``{index}`` field
    written as ``<task>-<index in task>``, both with the field's format spec:
    ``part-{index:05d}.tfrecord`` -> ``part-00003-00001.tfrecord``.
    """

    def __init__(self, template: str, mode: Mode, num_shards: int | None) -> None:
        self.text = template
        self.mode = mode
        self.num_shards = num_shards
        allowed = ("index", "num_shards") if mode == "fixed" else ("index", "task")

        def hint(name: str) -> str:
            if name == "num_shards":
                return "{num_shards} needs a fixed num_shards="
            if name == "task":
                return "{task} is only used with max_records / max_bytes"
            return "use {index}, and {num_shards} with num_shards"

        self.parts, fields = parse_fields(template, allowed, hint)
        self.fields = fields
        several = mode == "rotate" or (num_shards or 1) > 1
        if several and "index" not in fields:
            raise ValueError(
                f"{template}: more than one output shard may be written but the template has "
                "no {index} field to tell them apart, e.g. 'out/part-{index:05d}.tfrecord'"
            )
        try:
            if mode == "fixed":
                self.fixed_url(0)
            else:
                self.task_template(0).format(index=0)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{template}: not a valid shard template: {exc}") from exc
        self.directory = self._directory()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Naming):
            return NotImplemented
        return (self.text, self.mode, self.num_shards) == (other.text, other.mode, other.num_shards)

    def __hash__(self) -> int:
        return hash((self.text, self.mode, self.num_shards))

    def __repr__(self) -> str:
        return f"Naming({self.text!r}, {self.mode!r}, {self.num_shards!r})"

    def _directory(self) -> str:
        return template_directory(
            self.text,
            "the output directory must not vary by shard (the manifest is written beside the "
            "shards)",
        )

    def matches(self, url: str) -> bool:
        """True when ``url`` could be one of this template's output shards."""
        pattern = "".join(
            re.escape(literal) + ("" if name is None else "[^/]*")
            for literal, name, _, _ in self.parts
        )
        return re.fullmatch(pattern, url) is not None

    def matches_output(self, url: str) -> bool:
        """True when ``url`` could be an output shard or an output shard's index sidecar."""
        if url.endswith(INDEX_SUFFIX) and self.matches(url[: -len(INDEX_SUFFIX)]):
            return True
        return self.matches(url)

    def beside(self, name: str) -> str:
        """The url of ``name`` in the output directory."""
        return f"{self.directory.rstrip('/')}/{name}" if self.directory else name

    @property
    def manifest_url(self) -> str:
        """Where the final manifest goes (the writer's ``_manifest.json``)."""
        return self.beside(MANIFEST_NAME)

    def scratch_url(self, fingerprint: str, task: int) -> str:
        """The per-task manifest of ``task`` for the job ``fingerprint``."""
        return self.beside(f"{SCRATCH_DIR}/{fingerprint}/task-{task:05d}.json")

    def scratch_glob(self, fingerprint: str) -> str:
        """A glob matching every per-task manifest of the job."""
        return self.beside(f"{SCRATCH_DIR}/{fingerprint}/task-*.json")

    def fixed_url(self, index: int) -> str:
        """Fixed mode: the url of output shard ``index``."""
        return self.text.format(index=index, num_shards=self.num_shards or 1)

    def task_template(self, task: int, *, alone: bool = False) -> str:
        """Rotation mode: the writer template of ``task`` (``{index}``: its own count, which
        is the global one when the task is ``alone``, the job's only task)."""
        out: list[str] = []
        for literal, name, spec, _ in self.parts:
            out.append(_escape(literal))
            if name is None:
                continue
            if name == "task":
                out.append(_escape(format(task, spec or "")))
            elif "task" in self.fields or alone:
                out.append("{index" + (":" + spec if spec else "") + "}")
            else:
                prefix = _escape(format(task, spec or "")) + "-"
                out.append(prefix + "{index" + (":" + spec if spec else "") + "}")
        return "".join(out)

    def rule(self, tasks: int, global_index: bool = False) -> str:
        """How the output shards of a job of ``tasks`` tasks are named, with examples
        (``global_index``: the plan numbers them across tasks)."""
        if self.mode == "fixed":
            count = self.num_shards or 1
            names = self.fixed_url(0) + (f" .. {self.fixed_url(count - 1)}" if count > 1 else "")
            return f"output names: {names}"
        if tasks == 1 or global_index:
            first = self.task_template(0, alone=True)
            why = (
                "the input is one task"
                if tasks == 1
                else f"the {tasks} tasks' record counts are known from the input manifests"
            )
            return (
                f"output names: {first.format(index=0)}, {first.format(index=1)}, ... "
                f"({{index}} counts the shards: {why})"
            )
        one, two = self.task_template(0), self.task_template(1)
        names = f"{one.format(index=0)}, {one.format(index=1)}, ..., {two.format(index=0)}, ..."
        if "task" in self.fields:
            how = "{task} is the task, {index} the shard within it"
        else:
            how = "{index} is written '<task>-<shard of the task>'"
        return (
            f"output names: {names} ({how}: the {tasks} tasks, --task-bytes of input each, are "
            "written independently; the manifest numbers all shards 0, 1, 2, ... in order)"
        )


# ----------------------------------------------------------------------------------------------
# partitions


def group_by_bytes(sizes: Sequence[int], target: int) -> list[list[int]]:
    """Consecutive groups of positions, each closed once it holds ``target`` bytes or more."""
    groups: list[list[int]] = []
    current: list[int] = []
    held = 0
    for position, size in enumerate(sizes):
        current.append(position)
        held += size
        if held >= target:
            groups.append(current)
            current, held = [], 0
    if current:
        groups.append(current)
    return groups


def split_groups(sizes: Sequence[int], parts: int) -> list[list[int]]:
    """Exactly ``parts`` non-empty consecutive groups (``parts <= len(sizes)``), balanced by
    bytes: the k-th cut is the position whose running total is nearest to k parts' share."""
    n = len(sizes)
    if not 1 <= parts <= n:
        raise ValueError(f"cannot split {n} inputs into {parts} groups")
    prefix = [0]
    for size in sizes:
        prefix.append(prefix[-1] + size)
    total = prefix[-1]
    bounds = [0]
    for k in range(1, parts):
        goal = total * k / parts
        lowest, highest = bounds[-1] + 1, n - (parts - k)  # every group keeps >= 1 position
        first_over = bisect.bisect_left(prefix, goal, lowest, highest + 1)
        candidates = [c for c in (first_over - 1, first_over) if lowest <= c <= highest]
        bounds.append(min(candidates, key=lambda c: (abs(prefix[c] - goal), c)))
    bounds.append(n)
    return [list(range(bounds[k], bounds[k + 1])) for k in range(parts)]


def split_counts(sizes: Sequence[int], total: int) -> list[int]:
    """``total`` split over positions in proportion to ``sizes``, each >= 1 (largest
    remainder; ``total >= len(sizes)``)."""
    n = len(sizes)
    if not total >= n >= 1:
        raise ValueError(f"cannot split {total} outputs over {n} inputs, one each at least")
    weight = sum(sizes)
    ideal = [total * s / weight if weight else total / n for s in sizes]
    counts = [max(1, int(x)) for x in ideal]
    left = total - sum(counts)
    if left > 0:  # the largest remainders get one more each (left < n)
        for i in sorted(range(n), key=lambda i: (counts[i] - ideal[i], i))[:left]:
            counts[i] += 1
    while left < 0:  # raised to 1 somewhere: take back from those furthest above their share
        for i in sorted(range(n), key=lambda i: (ideal[i] - counts[i], i)):
            if left < 0 and counts[i] > 1:
                counts[i] -= 1
                left += 1
    return counts


@dataclass(frozen=True)
class RowTask:
    """One task of a plan by rows: ``shards`` consecutive output shards of ``sizes`` records,
    from ``ranges``: ``(position, first row, row after the last)`` of the inputs it reads."""

    first_shard: int
    sizes: tuple[int, ...]
    ranges: tuple[tuple[int, int, int], ...]


def split_rows(counts: Sequence[int], shards: int) -> list[RowTask]:
    """``shards`` output shards of consecutive rows whose sizes differ by one at most (the
    first ``total % shards`` hold one more; empty ones only when there are fewer rows than
    shards), from inputs of ``counts`` rows read in order. The shards whose first row lies in
    the same input make one task (the empty ones join the last task): each input is read by
    the task of the shards starting in it, and by the one before it when a shard spills over."""
    total = sum(counts)
    quotient, remainder = divmod(total, shards)
    sizes = [quotient + (1 if k < remainder else 0) for k in range(shards)]
    input_starts = [0]
    for count in counts:
        input_starts.append(input_starts[-1] + count)
    owner: list[int] = []  # the input holding each non-empty shard's first row
    start = 0
    for size in sizes:
        if size:
            owner.append(bisect.bisect_right(input_starts, start) - 1)
        start += size
    groups: list[list[int]] = []
    for k in range(len(owner)):
        if k and owner[k] == owner[k - 1]:
            groups[-1].append(k)
        else:
            groups.append([k])
    if not groups:
        groups.append([])
    groups[-1].extend(range(len(owner), shards))  # the empty shards (fewer rows than shards)
    tasks: list[RowTask] = []
    first_row = 0
    for group in groups:
        group_sizes = tuple(sizes[k] for k in group)
        last_row = first_row + sum(group_sizes)
        ranges = tuple(
            (
                p,
                max(first_row, input_starts[p]) - input_starts[p],
                min(last_row, input_starts[p + 1]) - input_starts[p],
            )
            for p in range(len(counts))
            if counts[p] and input_starts[p] < last_row and input_starts[p + 1] > first_row
        )
        tasks.append(RowTask(group[0] if group else 0, group_sizes, ranges))
        first_row = last_row
    return tasks


def default_task_bytes(max_bytes: int | None) -> int:
    """Input bytes per rotation task: 256 MiB, or 4 output shards' worth when larger."""
    return max(MIN_TASK_BYTES, 4 * (max_bytes or 0))


# ----------------------------------------------------------------------------------------------
# the plan


@dataclass(frozen=True)
class TaskSpec:
    """One unit of work: read ``inputs`` in order, write output shards, record a manifest.

    Rotation tasks (``outputs`` empty) write ``writer_template`` with the writer's rotation;
    fixed tasks write the urls in ``outputs`` (global indexes ``first_index`` onwards), records
    dealt round-robin when there are several, or, in a plan by rows, ``output_records`` of
    them to each output in turn from the ``input_rows`` of each input.
    """

    index: int
    inputs: tuple[ObjectInfo, ...]
    scratch_url: str
    writer_template: str | None = None
    outputs: tuple[str, ...] = ()
    first_index: int = 0
    seed: int | None = None  # None: no shuffling
    expected_records: int | None = None
    """The records its inputs hold by their manifests, when the numbering relies on them."""
    input_rows: tuple[tuple[int, int], ...] = ()
    """A plan by rows: the ``[first, last)`` rows to read of each input (empty: all rows)."""
    output_records: tuple[int, ...] = ()
    """A plan by rows: ``outputs`` hold these many records each, filled one after another
    (empty: records dealt round-robin)."""

    @property
    def input_bytes(self) -> int:
        return sum(obj.size for obj in self.inputs)

    @property
    def cycle_length(self) -> int:
        """Inputs read at once: all of them (up to 16) when shuffling, else one after another."""
        return min(len(self.inputs), MAX_CYCLE) if self.seed is not None else 1


@dataclass(frozen=True)
class Plan:
    """Every task of a job, and what identifies the job."""

    tasks: list[TaskSpec]
    naming: Naming
    fingerprint: str
    mode: Mode
    compression: str | None
    max_records: int | None = None
    max_bytes: int | None = None
    shuffle_buffer: int = 0
    inputs: list[ObjectInfo] = field(default_factory=list)
    global_index: bool = True
    """``{index}`` numbers the output shards 0, 1, 2, ... across all tasks (else each task
    numbers its own: ``<task>-<shard>``)."""
    index: bool = False
    """Every output shard has its record index sidecar (``<shard>.idx``)."""

    @property
    def manifest_url(self) -> str:
        return self.naming.manifest_url

    @property
    def input_bytes(self) -> int:
        return sum(obj.size for obj in self.inputs)

    @property
    def naming_rule(self) -> str:
        """How this job names its output shards (printed when a run starts)."""
        return self.naming.rule(len(self.tasks), self.global_index)


def _task_seed(seed: int, task: int) -> int:
    digest = hashlib.sha256(f"streamrec/reshard/{seed}/{task}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def fingerprint_of(inputs: Sequence[ObjectInfo], settings: dict[str, Any]) -> str:
    """16 hex digits naming the job: the inputs (url, size, version) and every setting that
    changes the output. Signed urls are named by their path (:func:`~streamrec.redact.
    unsigned_name`): a job resumes through freshly signed urls of the same objects."""
    document = {
        "plan": PLAN_VERSION,
        "inputs": [[unsigned_name(obj.url), obj.size, obj.version] for obj in inputs],
        **settings,
    }
    text = json.dumps(document, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def make_plan(
    inputs: Sequence[ObjectInfo],
    template: str,
    *,
    max_records: int | None,
    max_bytes: int | None,
    num_shards: int | None,
    compression: str | None,
    shuffle: bool,
    seed: int,
    shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER,
    task_bytes: int | None = None,
    index: bool = False,
    source: str | None = None,
    by_rows: bool = False,
) -> Plan:
    """The deterministic plan of a reshard of ``inputs`` (any order; sorted here by url);
    ``index``: the output shards get record index sidecars; ``source``: the inputs' format
    when they are not TFRecord shards (``"parquet/2"``). Both are part of the job's identity.
    ``by_rows`` (every input's ``records`` known): a fixed ``num_shards`` is planned by rows
    (:func:`split_rows`: balanced record counts, consecutive rows), not by whole inputs."""
    ordered = sorted({obj.url: obj for obj in inputs}.values(), key=lambda o: o.url)
    if not ordered:
        raise ValueError("nothing to reshard: no input shard")
    if num_shards is not None and (max_records is not None or max_bytes is not None):
        raise ValueError(
            "num_shards fixes the number of output shards: it cannot be combined with "
            "max_records / max_bytes (use one or the other)"
        )
    for name, value in (
        ("max_records", max_records),
        ("max_bytes", max_bytes),
        ("num_shards", num_shards),
        ("task_bytes", task_bytes),
        ("shuffle_buffer", shuffle_buffer if shuffle else None),
    ):
        if value is not None and (isinstance(value, bool) or value < 1):
            raise ValueError(f"{name} must be a positive integer, not {value!r}")
    mode: Mode = "rotate" if (max_records is not None or max_bytes is not None) else "fixed"
    shards = num_shards if mode == "fixed" else None
    if mode == "fixed" and shards is None:
        shards = 1  # no limit at all: everything into one output
    naming = Naming(template, mode, shards)
    order = list(ordered)
    if shuffle:
        seeded_random(seed, 0, "reshard-inputs").shuffle(order)
    chosen_task_bytes = task_bytes or default_task_bytes(max_bytes)
    settings: dict[str, Any] = {
        "template": template,
        "mode": mode,
        "max_records": max_records,
        "max_bytes": max_bytes,
        "num_shards": shards,
        "compression": compression,
        "shuffle": [seed, shuffle_buffer] if shuffle else None,
        "task_bytes": chosen_task_bytes if mode == "rotate" else None,
    }
    if index:  # (only when set: jobs without it keep the fingerprints of earlier versions)
        settings["index"] = True
    if source is not None:  # (likewise)
        settings["source"] = source
    if by_rows and mode == "fixed":  # (likewise; its shards differ from a plan by inputs')
        settings["by_rows"] = True
    fingerprint = fingerprint_of(ordered, settings)
    sizes = [obj.size for obj in order]
    tasks: list[TaskSpec] = []

    def add(positions: list[int], **kwargs: Any) -> None:
        t = len(tasks)
        tasks.append(
            TaskSpec(
                index=t,
                inputs=tuple(order[p] for p in positions),
                scratch_url=naming.scratch_url(fingerprint, t),
                seed=_task_seed(seed, t) if shuffle else None,
                **kwargs,
            )
        )

    firsts: list[int] | None = None
    if mode == "rotate":
        groups = group_by_bytes(sizes, chosen_task_bytes)
        firsts = _first_indexes(groups, order, max_records, max_bytes)
        known: list[int | None] = list(firsts) if firsts is not None else [None] * len(groups)
        for positions, first in zip(groups, known, strict=True):
            # one task, or shard counts known in advance: {index} is the global number
            alone = len(groups) == 1 or first is not None
            add(
                positions,
                writer_template=naming.task_template(len(tasks), alone=alone),
                first_index=first or 0,
                expected_records=(
                    None if first is None else sum(order[p].records or 0 for p in positions)
                ),
            )
    else:
        assert shards is not None
        if by_rows:
            counts = [obj.records for obj in order]
            if any(count is None for count in counts):
                raise ValueError("a plan by rows needs every input's row count")
            for row_task in split_rows([c or 0 for c in counts], shards):
                first = row_task.first_shard
                add(
                    [p for p, _, _ in row_task.ranges],
                    outputs=tuple(naming.fixed_url(first + j) for j in range(len(row_task.sizes))),
                    first_index=first,
                    input_rows=tuple((a, b) for _, a, b in row_task.ranges),
                    output_records=row_task.sizes,
                    expected_records=sum(row_task.sizes),
                )
        elif shards <= len(order):
            for k, positions in enumerate(split_groups(sizes, shards)):
                add(positions, outputs=(naming.fixed_url(k),), first_index=k)
        else:
            first = 0
            for position, count in enumerate(split_counts(sizes, shards)):
                urls = tuple(naming.fixed_url(first + j) for j in range(count))
                add([position], outputs=urls, first_index=first)
                first += count
    return Plan(
        tasks=tasks,
        naming=naming,
        fingerprint=fingerprint,
        mode=mode,
        compression=compression,
        max_records=max_records,
        max_bytes=max_bytes,
        shuffle_buffer=shuffle_buffer if shuffle else 0,
        inputs=ordered,
        global_index=mode == "fixed" or len(tasks) == 1 or firsts is not None,
        index=index,
    )


def _first_indexes(
    groups: list[list[int]],
    order: Sequence[ObjectInfo],
    max_records: int | None,
    max_bytes: int | None,
) -> list[int] | None:
    """The global ``{index}`` of each rotation task's first shard, when the plan can know it:
    rotation by ``max_records`` alone and every input's record count known (from a manifest).
    A task of n records writes max(1, ceil(n / max_records)) shards (an empty one for none)."""
    if max_records is None or max_bytes is not None:
        return None
    counts = [order[p].records for p in range(len(order))]
    if any(count is None for count in counts):
        return None
    firsts, first = [], 0
    for positions in groups:
        records = sum(counts[p] or 0 for p in positions)
        firsts.append(first)
        first += max(1, -(-records // max_records))
    return firsts
