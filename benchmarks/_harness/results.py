"""A benchmark's published figures as data: ``benchmarks/results/<benchmark>.json``.

One file per benchmark holds its latest tables (a remeasure replaces the file; the history is in
git). The schema, which ``tests/unit/test_bench_results.py`` checks and ``benchmarks/charts.py``
draws from::

    {"benchmark": "bench_local", "script": "benchmarks/bench_local.py", "title": "...",
     "tables": [{"name": "...", "date": "2026-11-24 06:11 UTC", "commit": "a421cc9",
                 "machine": "...", "command": "python benchmarks/...", "notes": ["..."],
                 "columns": ["record", "reader", ...], "units": {"MB/s median": "MB/s"},
                 "rows": [{"record": "100 B", "reader": "streamrec for", ...}, ...],
                 "chart": {"value": "MB/s median", "label": ["reader"], "group": "record"}}]}

A cell is a number where the table shows one (``1,272`` -> 1272, ``10.97 M`` -> 10970000,
``0.16x`` -> 0.16, ``99%`` -> 99), else its text (markdown emphasis dropped), ``null`` when empty.
``save_results`` puts the tables of the markdown section a script prints into such a file
(the scripts' ``--json PATH``).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from .report import command_line, cpu_model, now, source_state

__all__ = ["JSON_HELP", "dumps", "parse_cell", "parse_tables", "save_results", "section_facts"]

JSON_HELP = "also save the tables as data in this results file (benchmarks/results/<script>.json)"
_NUMBER = re.compile(r"^([+-]?\d[\d,]*(?:\.\d+)?)\s*(k|M|x|%)?$")
_SCALE = {"k": 1e3, "M": 1e6}


def parse_cell(text: str) -> Any:
    """A table cell's value: a number if it shows one, else its text; None when empty."""
    text = text.strip().replace("**", "").replace("\\|", "|").strip()
    if not text:
        return None
    found = _NUMBER.match(text)
    if not found:
        return text
    number = float(found.group(1).replace(",", ""))
    number *= _SCALE.get(found.group(2) or "", 1.0)
    return int(number) if number.is_integer() and "." not in found.group(1) else number


def _cells(line: str) -> list[str]:
    body = line.strip()
    body = body[1:] if body.startswith("|") else body
    body = body[:-1] if body.endswith("|") else body
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", body)]


def _unit(column: str, raw: list[str]) -> str | None:
    """The unit a column's numbers are in: a suffix its cells show, else its header's."""
    cells = [cell.replace("**", "").strip() for cell in raw if cell.strip()]
    if cells and all(cell.endswith("x") and _NUMBER.match(cell) for cell in cells):
        return "x"
    if cells and all(cell.endswith("%") for cell in cells):
        return "%"
    for pattern, unit in (
        (r"MB/s", "MB/s"),
        (r"records/s|records/s", "records/s"),
        (r"CPU s/GB", "CPU s/GB"),
        (r"us/record", "us/record"),
        (r"\bms\b", "ms"),
        (r"MiB|\+MiB", "MiB"),
        (r"\bMB\b", "MB"),
        (r"\bs\b|seconds", "s"),
        (r"RTTs", "RTTs"),
        (r"vs |/ count|speed|new/old|x link|ratio", "x"),
    ):
        if re.search(pattern, column):
            return unit
    return None


def parse_tables(markdown: str) -> list[dict[str, Any]]:
    """Every pipe table of ``markdown``: its columns, units and rows (one dict per row)."""
    tables = []
    lines = markdown.splitlines()
    i = 0
    while i < len(lines) - 1:
        head, rule = lines[i].strip(), lines[i + 1].strip()
        if not (head.startswith("|") and re.fullmatch(r"\|?[\s:|-]+\|?", rule) and "-" in rule):
            i += 1
            continue
        columns = [col.replace("**", "").replace("\\|", "|") for col in _cells(head)]
        columns = [col or f"column {n + 1}" for n, col in enumerate(columns)]
        raw_rows = []
        i += 2
        while i < len(lines) and lines[i].strip().startswith("|"):
            cells = _cells(lines[i])
            cells += [""] * (len(columns) - len(cells))
            raw_rows.append(cells[: len(columns)])
            i += 1
        units = {}
        for n, column in enumerate(columns):
            numeric = [r[n] for r in raw_rows if isinstance(parse_cell(r[n]), (int, float))]
            if numeric and (unit := _unit(column, numeric)):
                units[column] = unit
        rows = [
            {col: parse_cell(cell) for col, cell in zip(columns, r, strict=True)} for r in raw_rows
        ]
        tables.append({"columns": columns, "units": units, "rows": rows})
    return tables


def section_facts(markdown: str) -> dict[str, str]:
    """The command, date, commit and machine a script's section states (those it states)."""
    facts = {}
    if found := re.search(r"Command: `([^`]+)` \((\d{4}-\d\d-\d\d(?: \d\d:\d\d \w+)?)", markdown):
        facts["command"], facts["date"] = found.group(1), found.group(2)
    if found := re.search(r"Source: commit (\w+)", markdown):
        facts["commit"] = found.group(1)
    if found := re.search(r"^Machine: (.+)$", markdown, flags=re.M):
        facts["machine"] = found.group(1).strip()
    return facts


def dumps(doc: dict[str, Any]) -> str:
    """``doc`` as the results files keep it: each table's fields and each row on a line."""

    def one(value: Any) -> str:
        return json.dumps(value, ensure_ascii=False)

    def fields(mapping: dict[str, Any], indent: str, nested: dict[str, str]) -> list[str]:
        out = []
        for key, value in mapping.items():
            if key in nested:
                inner = indent + "  "
                items = [inner + nested_item for nested_item in _items(value, inner, key)]
                out.append(f"{indent}{one(key)}: [\n" + ",\n".join(items) + f"\n{indent}]")
            else:
                out.append(f"{indent}{one(key)}: {one(value)}")
        return out

    def _items(values: list[Any], indent: str, key: str) -> list[str]:
        if key == "rows":
            return [one(row) for row in values]
        return [
            "{\n" + ",\n".join(fields(t, indent + "  ", {"rows": ""})) + f"\n{indent}}}"
            for t in values
        ]

    return "{\n" + ",\n".join(fields(doc, "  ", {"tables": ""})) + "\n}\n"


def save_results(
    path: Path | None, benchmark: str, section: str, names: list[str], command: str = ""
) -> None:
    """``--json PATH``: put the tables of a script's markdown ``section`` into the results file
    ``path`` (nothing when None) as the tables called ``names`` (in order), replacing the tables
    of those names and keeping the others and their chart entries; the command, date, commit
    and machine come from the section, else from this run (``command``, now, git, the CPU)."""
    if path is None:
        return
    facts = section_facts(section)
    source = re.search(r"commit (\w+)", source_state())
    doc: dict[str, Any] = {
        "benchmark": benchmark,
        "script": f"benchmarks/{benchmark}.py",
        "title": benchmark,
        "json_flag": "--json",
        "tables": [],
    }
    if path.exists():
        doc = json.loads(path.read_text())
    kept = {table["name"]: table for table in doc["tables"]}
    for n, table in enumerate(parse_tables(section)):
        name = names[n] if n < len(names) else f"table {n + 1}"
        entry: dict[str, Any] = {
            "name": name,
            "date": facts.get("date") or now(),
            "commit": facts.get("commit") or (source.group(1) if source else ""),
            "machine": facts.get("machine")
            or f"{cpu_model('unknown CPU')}, {os.cpu_count()} cores",
            "command": facts.get("command") or command or command_line(f"{benchmark}.py", None),
            "notes": [],
            **table,
        }
        if name in kept and kept[name].get("chart"):
            entry["chart"] = kept[name]["chart"]
        if name in kept:
            doc["tables"][doc["tables"].index(kept[name])] = entry
        else:
            doc["tables"].append(entry)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dumps(doc))
    print(f"wrote {path}")
