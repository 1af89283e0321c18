"""Draw one PNG per benchmark from its saved results: ``benchmarks/results/<name>.json`` ->
``benchmarks/charts/<name>.png``.

``python benchmarks/charts.py [NAME ...]`` (no names: every results file). Needs matplotlib
(``pip install -e .[bench]``); the Agg backend, no display. Each table of a results file that has
a ``chart`` entry becomes one panel per group: horizontal bars of the column ``value``, one per
row, labelled by the ``label`` columns; rows whose label names streamrec (or a ``highlight``
word, and no ``peers`` word) are drawn dark, the peers light. ``1x`` is marked on ratio panels,
and ``target`` where the entry gives one. Each panel's title carries the date and commit its
table was measured at.
"""

from __future__ import annotations

import argparse
import io
import json
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # before pyplot: files only, never a window
import matplotlib.pyplot as plt
from PIL import Image  # matplotlib's own dependency

BENCH_DIR = Path(__file__).resolve().parent
RESULTS = BENCH_DIR / "results"
CHARTS = BENCH_DIR / "charts"
DPI = 100
WIDTH_IN = 8.0
DARK, LIGHT = "#1f5f99", "#b8c7d6"


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def panels(table: dict[str, Any]) -> list[tuple[str, list[tuple[str, float, bool]]]]:
    """A chart entry's panels: (group title, [(bar label, value, is streamrec's)])."""
    chart = table["chart"]
    value = chart["value"]
    labels = _as_list(chart.get("label"))
    groups = _as_list(chart.get("group"))
    only = chart.get("only", {})
    highlight = _as_list(chart.get("highlight", ["streamrec"]))
    peers = _as_list(chart.get("peers"))
    out: dict[str, list[tuple[str, float, bool]]] = {}
    for row in table["rows"]:
        if any(row.get(col) not in allowed for col, allowed in only.items()):
            continue
        number = row.get(value)
        if isinstance(number, bool) or not isinstance(number, (int, float)):
            continue  # a row without this figure (a control, a reference order)
        parts = [_text(row.get(col)) for col in labels]
        first = _text(row.get(table["columns"][0]))
        label = " · ".join(p for p in parts if p not in ("", "-")) or first
        ours = any(w in label for w in highlight) and not any(w in label for w in peers)
        group = " · ".join(_text(row.get(col)) for col in groups)
        out.setdefault(group, []).append((label, float(number), ours))
    return list(out.items())


def draw(doc: dict[str, Any], path: Path) -> int:
    """Draw ``doc``'s charted tables into ``path``; returns the number of panels drawn."""
    charted = [t for t in doc["tables"] if t.get("chart")]
    layout = [(t, title, bars) for t in charted for title, bars in panels(t)]
    if not layout:
        raise SystemExit(f"{doc['benchmark']}: no table with a chart entry and numbers to draw")
    heights = [0.5 + 0.22 * len(bars) for _, _, bars in layout]
    height = sum(heights) + 0.45 * len(layout) + 0.5
    fig, axes = plt.subplots(
        len(layout),
        1,
        figsize=(WIDTH_IN, height),
        gridspec_kw={"height_ratios": heights},
        squeeze=False,
    )
    for ax, (table, group, bars) in zip(axes[:, 0], layout, strict=True):
        chart = table["chart"]
        unit = table.get("units", {}).get(chart["value"], "")
        names = [label for label, _, _ in bars][::-1]
        values = [number for _, number, _ in bars][::-1]
        colours = [DARK if ours else LIGHT for _, _, ours in bars][::-1]
        ax.barh(range(len(bars)), values, color=colours, height=0.7)
        ax.set_yticks(range(len(bars)), names, fontsize=7)
        top = max(values) if values else 1.0
        for y, number in enumerate(values):
            shown = f"{number:,.2f}" if number < 10 else f"{number:,.0f}"
            ax.text(
                number + top * 0.01,
                y,
                shown + ("x" if unit == "x" else ""),
                va="center",
                fontsize=6,
            )
        if unit == "x":
            ax.axvline(1.0, color="#555555", linewidth=0.8)
        if "target" in chart:
            ax.axvline(chart["target"], color="#c0392b", linewidth=0.8, linestyle="--")
        ax.set_xlim(0, top * 1.15)
        ax.tick_params(axis="x", labelsize=7)
        head = f"{table['name']}{' · ' + group if group else ''}"
        ax.set_title(f"{head}  ({table['date']}, {table['commit']})", fontsize=8, loc="left")
        ax.set_xlabel(
            f"{chart['value']}" + (f" [{unit}]" if unit and unit not in chart["value"] else ""),
            fontsize=7,
        )
    title = textwrap.shorten(f"{doc['benchmark']}: {doc['title']}", 120, placeholder="...")
    fig.suptitle(title, fontsize=9, x=0.01, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.3 / height))  # room for the title
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI)
    plt.close(fig)
    # a palette of 64 colours: the bars use two, the text greys; a third of the bytes
    image = Image.open(io.BytesIO(buffer.getvalue())).convert("RGB").quantize(colors=64)
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, format="PNG", optimize=True)
    return len(layout)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("names", nargs="*", help="benchmarks to draw (default: every results file)")
    args = parser.parse_args(argv)
    files = [RESULTS / f"{name}.json" for name in args.names] or sorted(RESULTS.glob("*.json"))
    for file in files:
        doc = json.loads(file.read_text())
        out = CHARTS / f"{file.stem}.png"
        count = draw(doc, out)
        print(
            f"{out.relative_to(BENCH_DIR.parent)}: {count} panel(s), {out.stat().st_size:,} bytes"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
