"""The benchmarks' saved figures stay usable: every ``benchmarks/results/*.json`` keeps the schema
``benchmarks/charts.py`` draws from (each table with its date, commit, machine and command; every
row with every column), has its chart in ``benchmarks/charts/``, and benchmarks/README.md (kept
short) shows that chart. Reads only files of this repository; needs no matplotlib."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
RESULTS = BENCH / "results"
CHARTS = BENCH / "charts"
README = BENCH / "README.md"
MAX_CHART_BYTES = 64 * 1024
MAX_README_LINES = 250

FILES = sorted(RESULTS.glob("*.json"))
TABLE_TEXT = ("name", "date", "commit", "machine", "command")


def results_problems(doc: Any, name: str) -> list[str]:
    """What is wrong with one results file's content (``name``: its file name's stem)."""
    if not isinstance(doc, dict):
        return [f"{name}: not an object"]
    problems = []
    if doc.get("benchmark") != name:
        problems.append(f"{name}: 'benchmark' is {doc.get('benchmark')!r}, not its file name")
    if not (BENCH / f"{name}.py").exists() or doc.get("script") != f"benchmarks/{name}.py":
        problems.append(f"{name}: 'script' {doc.get('script')!r} is not benchmarks/{name}.py")
    if not isinstance(doc.get("title"), str) or not doc["title"]:
        problems.append(f"{name}: no title")
    tables = doc.get("tables")
    if not isinstance(tables, list) or not tables:
        return [*problems, f"{name}: no tables"]
    for n, table in enumerate(tables):
        where = f"{name} table {n} ({table.get('name', '?')!r})"
        problems += [f"{where}: no {key}" for key in TABLE_TEXT if not table.get(key)]
        if not re.match(r"^\d{4}-\d\d-\d\d( \d\d:\d\d \w+)?$", str(table.get("date", ""))):
            problems.append(f"{where}: date {table.get('date')!r} is not YYYY-MM-DD [HH:MM ZONE]")
        if not re.fullmatch(r"[0-9a-f]{7,40}", str(table.get("commit", ""))):
            problems.append(f"{where}: commit {table.get('commit')!r} is not a hash")
        if "benchmarks/" not in str(table.get("command", "")):
            problems.append(f"{where}: command {table.get('command')!r} names no benchmark")
        if not isinstance(table.get("notes", []), list):
            problems.append(f"{where}: notes is not a list")
        columns = table.get("columns")
        if not isinstance(columns, list) or not columns or len(set(columns)) != len(columns):
            problems.append(f"{where}: columns missing or repeated")
            continue
        units = table.get("units", {})
        problems += [f"{where}: unit of unknown column {c!r}" for c in units if c not in columns]
        rows = table.get("rows")
        if not isinstance(rows, list) or not rows:
            problems.append(f"{where}: no rows")
            continue
        for i, row in enumerate(rows):
            if not isinstance(row, dict) or list(row) != columns:
                problems.append(f"{where} row {i}: its keys are not the table's columns")
            elif bad := [
                k for k, v in row.items() if not isinstance(v, (str, int, float, type(None)))
            ]:
                problems.append(f"{where} row {i}: cells {bad} are not text, numbers or null")
        chart = table.get("chart")
        if chart is None:
            continue
        named = [chart.get("value"), *_names(chart.get("label")), *_names(chart.get("group"))]
        named += list(chart.get("only", {}))
        problems += [
            f"{where}: chart names unknown column {c!r}" for c in named if c not in columns
        ]
    if not any(table.get("chart") for table in tables):
        problems.append(f"{name}: no table has a chart entry")
    return problems


def _names(value: Any) -> list[Any]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def test_there_are_results() -> None:
    assert len(FILES) >= 10, FILES


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_results_file_keeps_the_schema(path: Path) -> None:
    problems = results_problems(json.loads(path.read_text()), path.stem)
    assert not problems, "\n".join(problems)


def test_every_results_file_has_its_chart_and_every_chart_its_results() -> None:
    charts = {p.stem: p for p in CHARTS.glob("*.png")}
    assert sorted(charts) == sorted(p.stem for p in FILES)
    big = {
        name: p.stat().st_size for name, p in charts.items() if p.stat().st_size > MAX_CHART_BYTES
    }
    assert not big, f"charts over {MAX_CHART_BYTES} bytes: {big}"


def test_the_readme_is_a_short_map_that_shows_every_chart() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= MAX_README_LINES
    missing = [p.stem for p in FILES if f"charts/{p.stem}.png" not in text]
    assert not missing, f"benchmarks/README.md shows no chart of {missing}"


def test_the_checker_finds_problems() -> None:
    doc = {
        "benchmark": "bench_local",
        "script": "benchmarks/bench_local.py",
        "title": "t",
        "tables": [
            {
                "name": "a",
                "date": "yesterday",
                "commit": "",
                "machine": "m",
                "command": "python benchmarks/bench_local.py",
                "columns": ["reader", "MB/s"],
                "units": {"GB/s": "GB/s"},
                "rows": [{"reader": "x", "MB/s": 1.0}, {"reader": "y"}],
                "chart": {"value": "MB/s", "label": ["who"]},
            }
        ],
    }
    assert results_problems(doc, "bench_local") == [
        "bench_local table 0 ('a'): no commit",
        "bench_local table 0 ('a'): date 'yesterday' is not YYYY-MM-DD [HH:MM ZONE]",
        "bench_local table 0 ('a'): commit '' is not a hash",
        "bench_local table 0 ('a'): unit of unknown column 'GB/s'",
        "bench_local table 0 ('a') row 1: its keys are not the table's columns",
        "bench_local table 0 ('a'): chart names unknown column 'who'",
    ]
    assert results_problems(dict(doc, tables=[]), "bench_cpu") == [
        "bench_cpu: 'benchmark' is 'bench_local', not its file name",
        "bench_cpu: 'script' 'benchmarks/bench_local.py' is not benchmarks/bench_cpu.py",
        "bench_cpu: no tables",
    ]
