"""The prefetch budget's policy (streamrec.pipeline.budget.BudgetPlan): the numbers every
consumer of ``prefetch_bytes`` asks it for, and the rules that keep it the one place that
computes with them (issue 30)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from streamrec.pipeline.budget import BudgetPlan, ReaderSizes
from streamrec.pipeline.options import ReadOptions

MIB = 1 << 20
ROOT = Path(__file__).resolve().parents[2] / "streamrec"


@pytest.mark.parametrize(
    ("settings", "share"),
    [
        # 16 streams and 16 read ahead at a quarter share: 64 MiB / 20
        ({"cycle_length": 16}, 3_355_443),
        ({"cycle_length": 16, "deterministic": False}, 4 * MIB),  # no read-ahead: / 16
        ({"cycle_length": 16, "prefetch_bytes": MIB}, 64 << 10),  # the floor
        ({}, None),  # one shard at a time: no shares
    ],
)
def test_stream_share(settings: dict[str, Any], share: int | None) -> None:
    plan = BudgetPlan(ReadOptions(**settings))
    assert plan.stream_share == share
    assert plan.budget.limit == plan.options.prefetch_bytes


def test_reader_sizes_and_kept_shares() -> None:
    options = ReadOptions(cycle_length=3, prefetch_bytes=10_000_000, block_bytes=MIB)
    plan = BudgetPlan(options)
    assert plan.stream_share == 2_666_666
    # a quarter share per block; read ahead: a quarter share kept, a full share at most
    assert plan.reader_sizes() == ReaderSizes(666_666, 2_666_666, 2_666_666)
    assert plan.reader_sizes(ahead=True) == ReaderSizes(666_666, 666_666, 2_666_666)
    plan.keep_shares(4)  # three streams, one read ahead
    assert plan.budget.kept == 3 * 2_666_666 + 666_666
    plan.keep_shares(2)  # fewer shards than the cycle
    assert plan.budget.kept == 2 * 2_666_666
    tiny = BudgetPlan(ReadOptions(cycle_length=16, prefetch_bytes=MIB))
    tiny.keep_shares(40)  # floored shares add up to more than the limit: the limit
    assert tiny.budget.kept == MIB
    alone = BudgetPlan(ReadOptions())
    assert alone.reader_sizes(ahead=True) == ReaderSizes(4 * MIB, None, None)
    # one shard at a time: the shards opened ahead of the next one hold a quarter at most
    assert alone.read_ahead_bytes == 16 * MIB
    assert BudgetPlan(ReadOptions(prefetch_bytes=3)).read_ahead_bytes == 0
    alone.keep_shares(10)
    assert alone.budget.kept == 0


def test_indexed_and_lookup_sizes() -> None:
    plan = BudgetPlan(ReadOptions(prefetch_bytes=64 * MIB, block_bytes=4 * MIB))
    assert plan.chunk_bytes == 64 * MIB // 3
    assert plan.chunk_records(100 << 10) == 64 * MIB // 3 // (100 << 10)
    assert plan.chunk_records(1 << 40) == 1
    assert plan.lookup_span_bytes == 4 * MIB
    small = BudgetPlan(ReadOptions(prefetch_bytes=2, block_bytes=4 * MIB))
    assert (small.chunk_bytes, small.lookup_span_bytes) == (1, 2)


def _modules(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.py"))


def test_only_the_plan_computes_with_prefetch_bytes() -> None:
    # options.py holds the number, budget.py spends it, the CLI's common.py takes it as an
    # argument, probe prints the one it recommends; every other reader asks the BudgetPlan
    allowed = {"pipeline/options.py", "pipeline/budget.py", "cli/common.py", "cli/store/probe.py"}
    found = []
    for path in _modules(ROOT / "pipeline") + _modules(ROOT / "cli"):
        name = path.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if name in allowed or not isinstance(node, ast.Attribute):
                continue
            if node.attr == "prefetch_bytes":
                found.append(f"{name}:{node.lineno}")
    assert not found, found


def test_no_module_assigns_a_readers_fields() -> None:
    # ObjectReader is driven through its methods (set_share, limit_concurrency, hold_ramp ...)
    found = []
    for path in _modules(ROOT / "pipeline"):
        if path.name == "prefetch.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = list(node.targets)
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            for target in targets:
                for part in ast.walk(target):
                    if (
                        isinstance(part, ast.Attribute)
                        and isinstance(part.ctx, ast.Store)
                        and isinstance(part.value, (ast.Name, ast.Attribute))
                        and (
                            getattr(part.value, "id", None) == "reader"
                            or getattr(part.value, "attr", None) == "reader"
                        )
                    ):
                        found.append(f"{path.relative_to(ROOT)}:{part.lineno}")
    assert not found, found
