"""The structure rules of streamrec/, checked on the source (``ast``; nothing is imported).

* no import cycle among streamrec's modules: runtime imports count, wherever they are
  (module level, inside functions, ``importlib.import_module("...")`` with a literal name);
  imports under ``if TYPE_CHECKING:`` do not. Importing ``a.b.c`` runs the ``__init__`` of
  ``a`` and ``a.b`` first, but that is not an edge (every package that re-exports its own
  submodules would be a cycle);
* no module imports another module's ``_private`` name (``from streamrec.x import _name``);
  a private helper *module* (``streamrec._portal``, ``streamrec.format._cframing``) may be
  imported from inside the package that holds it;
* no Python module over 600 lines (generated ``*_pb2.py`` excluded);
* at most 8 modules directly in ``streamrec/``;
* ``streamrec/format/`` (the sans-I/O core) imports neither asyncio, fsspec nor aiofiles, and
  calls no ``open()``.

The benchmarks (``benchmarks/``) keep three rules of their own: no file over 600 lines, no
script imports (or loads) another (what they share lives in ``benchmarks/_harness/``), and only
``benchmarks/_harness/__init__.py`` touches ``sys.path``.

Each failure names the module and the rule. The checker itself is tested on a small made-up
package at the end.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

MAX_LINES = 600
MAX_TOP_LEVEL_MODULES = 8
NO_IO_PACKAGE = "streamrec.format"
IO_LIBRARIES = ("asyncio", "fsspec", "aiofiles")


@dataclass(frozen=True)
class Import:
    """One import in a module's source."""

    target: str  # the module imported (the longest known module of the dotted name)
    name: str | None  # for ``from target import name``: the name, when it is not a module
    line: int
    runtime: bool  # False under ``if TYPE_CHECKING:``
    internal: bool  # target is a module of the package checked (else an outside library)


@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    is_package: bool
    imports: tuple[Import, ...]
    calls_open: tuple[int, ...]  # lines calling the builtin open()

    def where(self, root: Path) -> str:
        return f"{self.name} ({self.path.relative_to(root)})"


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def extension_names(package_dir: Path, root: Path) -> set[str]:
    """C extensions (``_cframing.c``, or a built ``_cframing.cpython-311-....so``)."""
    names = set()
    for pattern in ("*.c", "*.so", "*.pyd"):
        for path in package_dir.rglob(pattern):
            stem = path.relative_to(root).parent / path.name.split(".")[0]
            names.add(".".join(stem.parts))
    return names


def _is_type_checking(test: ast.expr) -> bool:
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


class _Collector(ast.NodeVisitor):
    def __init__(self, name: str, is_package: bool, known: set[str]) -> None:
        self.package = name if is_package else name.rpartition(".")[0]
        self.known = known
        self.runtime = True
        self.imports: list[Import] = []
        self.calls_open: list[int] = []

    def _resolve(self, dotted: str) -> tuple[str, bool]:
        parts = dotted.split(".")
        for end in range(len(parts), 0, -1):
            prefix = ".".join(parts[:end])
            if prefix in self.known:
                return prefix, True
        return dotted, False

    def _add(self, dotted: str, name: str | None, line: int) -> None:
        target, internal = self._resolve(dotted)
        self.imports.append(Import(target, name, line, self.runtime, internal))

    def visit_If(self, node: ast.If) -> None:
        checking = _is_type_checking(node.test)
        negated = (
            isinstance(node.test, ast.UnaryOp)
            and isinstance(node.test.op, ast.Not)
            and _is_type_checking(node.test.operand)
        )
        if not (checking or negated):
            self.generic_visit(node)
            return
        self.visit(node.test)
        saved = self.runtime
        for branch, typing_only in ((node.body, checking), (node.orelse, negated)):
            self.runtime = saved and not typing_only
            for statement in branch:
                self.visit(statement)
        self.runtime = saved

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, None, node.lineno)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            parts = self.package.split(".")
            base = ".".join(parts[: len(parts) - (node.level - 1)])
            base = f"{base}.{node.module}" if node.module else base
        else:
            base = node.module or ""
        if base == "__future__":
            return
        for alias in node.names:
            full = f"{base}.{alias.name}"
            if alias.name != "*" and full in self.known:
                self._add(full, None, node.lineno)  # a submodule
            else:
                self._add(base, None if alias.name == "*" else alias.name, node.lineno)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Name) and func.id == "open":
            self.calls_open.append(node.lineno)
        dynamic = (isinstance(func, ast.Attribute) and func.attr == "import_module") or (
            isinstance(func, ast.Name) and func.id in ("import_module", "__import__")
        )
        if dynamic and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                self._add(first.value, None, node.lineno)
        self.generic_visit(node)


def scan(root: Path, package: str) -> dict[str, Module]:
    """Every Python module of ``root/package``, by dotted name, with its imports."""
    package_dir = root / package
    paths = sorted(package_dir.rglob("*.py"))
    known = {module_name(path, root) for path in paths} | extension_names(package_dir, root)
    modules = {}
    for path in paths:
        name = module_name(path, root)
        is_package = path.name == "__init__.py"
        collector = _Collector(name, is_package, known)
        collector.visit(ast.parse(path.read_text(), str(path)))
        modules[name] = Module(
            name, path, is_package, tuple(collector.imports), tuple(collector.calls_open)
        )
    return modules


def runtime_graph(modules: dict[str, Module]) -> dict[str, set[str]]:
    return {
        name: {
            i.target
            for i in module.imports
            if i.runtime and i.internal and i.target != name and i.target in modules
        }
        for name, module in modules.items()
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One import cycle (as a path that ends where it starts) per strongly connected group."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def connect(node: str) -> None:  # Tarjan (the graph is a few hundred modules at most)
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                connect(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            connect(node)
    found = []
    for group in groups:
        start = min(group)
        paths = {start: [start]}
        queue = [start]
        while queue:  # breadth first: the shortest way back to start inside the group
            node = queue.pop(0)
            for other in sorted(graph[node] & group):
                if other == start:
                    found.append([*paths[node], start])
                    queue = []
                    break
                if other not in paths:
                    paths[other] = [*paths[node], other]
                    queue.append(other)
    return sorted(found)


def _is_private(part: str) -> bool:
    return part.startswith("_") and not part.startswith("__")


def private_imports(modules: dict[str, Module], root: Path) -> list[str]:
    """Imports of another module's private name, or of a private module from outside the
    package that holds it."""
    problems = []
    for name, module in sorted(modules.items()):
        for i in module.imports:
            if not i.internal:
                continue
            if i.name is not None and _is_private(i.name):
                problems.append(
                    f"{module.where(root)} line {i.line}: imports the private name {i.name!r} "
                    f"of {i.target} (rule: no module imports another module's _private name)"
                )
            parts = i.target.split(".")
            for depth, part in enumerate(parts):
                owner = ".".join(parts[:depth])
                if _is_private(part) and not (name == owner or name.startswith(owner + ".")):
                    problems.append(
                        f"{module.where(root)} line {i.line}: imports {i.target}, private to "
                        f"{owner} (rule: a private module is imported only inside its package)"
                    )
    return problems


def line_count(path: Path) -> int:
    return len(path.read_text().splitlines())


# ------------------------------------------------------------------------ the rules, on streamrec

MODULES = scan(ROOT, "streamrec")


def test_the_scan_sees_the_package() -> None:
    assert "streamrec.format.example.batch" in MODULES
    assert "streamrec.pipeline.transforms.chainable" in MODULES
    batch = MODULES["streamrec.format.example.batch"]
    assert any(i.target == "streamrec.format.example.spec" for i in batch.imports)


def test_no_import_cycles() -> None:
    found = cycles(runtime_graph(MODULES))
    problems = [
        f"{cycle[0]}: import cycle {' -> '.join(cycle)} (rule: no import cycle among "
        "streamrec's modules; imports under TYPE_CHECKING do not count)"
        for cycle in found
    ]
    assert not problems, "\n".join(problems)


def test_no_private_imports() -> None:
    problems = private_imports(MODULES, ROOT)
    assert not problems, "\n".join(problems)


def test_modules_are_at_most_600_lines() -> None:
    problems = [
        f"{module.where(ROOT)}: {count} lines (rule: at most {MAX_LINES} lines per module)"
        for module in MODULES.values()
        if not module.path.name.endswith("_pb2.py")
        and (count := line_count(module.path)) > MAX_LINES
    ]
    assert not problems, "\n".join(problems)


def test_few_modules_directly_in_streamrec() -> None:
    top = sorted(path.name for path in (ROOT / "streamrec").glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, (
        f"streamrec/ holds {len(top)} modules directly ({', '.join(top)}) (rule: at most "
        f"{MAX_TOP_LEVEL_MODULES} .py files directly in streamrec/; put new ones in a subpackage)"
    )


def no_io_problems(modules: dict[str, Module], root: Path, package: str) -> list[str]:
    problems = []
    for name, module in sorted(modules.items()):
        if name != package and not name.startswith(package + "."):
            continue
        for i in module.imports:  # TYPE_CHECKING imports included
            if i.target.split(".")[0] in IO_LIBRARIES:
                problems.append(
                    f"{module.where(root)} line {i.line}: imports {i.target} (rule: "
                    f"{package} is sans-I/O, it imports none of {', '.join(IO_LIBRARIES)})"
                )
        problems.extend(
            f"{module.where(root)} line {line}: calls open() (rule: {package} is sans-I/O)"
            for line in module.calls_open
        )
    return problems


def test_format_core_does_no_io() -> None:
    assert any(name.startswith(NO_IO_PACKAGE + ".") for name in MODULES)
    problems = no_io_problems(MODULES, ROOT, NO_IO_PACKAGE)
    assert not problems, "\n".join(problems)


# ----------------------------------------------------------------------- the rules, on benchmarks/

BENCHMARKS = ROOT / "benchmarks"
PATH_SETUP = BENCHMARKS / "_harness" / "__init__.py"  # the one place that touches sys.path


def benchmark_problems(bench_dir: Path) -> list[str]:
    """Benchmark files over the line limit, scripts that import (or load) another script, and
    ``sys.path`` touched anywhere but the harness's ``__init__``."""
    share = "benchmark scripts share code through benchmarks/_harness/"
    problems = []
    for path in sorted(bench_dir.rglob("*.py")):
        where = str(path.relative_to(bench_dir.parent))
        found: list[tuple[int, str]] = []  # (line, problem), sorted by line at the end
        if (count := line_count(path)) > MAX_LINES:
            found.append((0, f"{where}: {count} lines (rule: at most {MAX_LINES} lines per file)"))
        sets_path = path.name == "__init__.py" and path.parent.name == "_harness"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            line = getattr(node, "lineno", 0)
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if any(name.split(".")[0].startswith("bench_") for name in names):
                what = f"imports {', '.join(names)} (rule: {share}, never import each other)"
                found.append((line, f"{where} line {line}: {what}"))
            if not isinstance(node, ast.Attribute):
                continue
            if node.attr == "spec_from_file_location":
                what = f"loads a module from a file (rule: {share}, never load each other)"
                found.append((line, f"{where} line {line}: {what}"))
            is_sys = isinstance(node.value, ast.Name) and node.value.id == "sys"
            if node.attr == "path" and is_sys and not sets_path:
                what = "uses sys.path (rule: only benchmarks/_harness/__init__.py sets it up)"
                found.append((line, f"{where} line {line}: {what}"))
        problems.extend(problem for _, problem in sorted(found))
    return problems


def test_benchmarks_share_code_through_the_harness() -> None:
    assert PATH_SETUP.exists()
    problems = benchmark_problems(BENCHMARKS)
    assert not problems, "\n".join(problems)


def test_benchmark_checker_finds_problems(tmp_path: Path) -> None:
    write_package(
        tmp_path,
        {
            "benchmarks/_harness/__init__.py": "import sys\nsys.path.insert(0, '.')\n",
            "benchmarks/bench_a.py": "import bench_b as b\nfrom bench_c import x\n",
            "benchmarks/bench_b.py": (
                "import importlib.util, sys\nsys.path.append('x')\n"
                "importlib.util.spec_from_file_location('m', 'm.py')\n" + "x = 1\n" * 600
            ),
        },
    )
    problems = [p.split(" (rule")[0] for p in benchmark_problems(tmp_path / "benchmarks")]
    assert problems == [
        "benchmarks/bench_a.py line 1: imports bench_b",
        "benchmarks/bench_a.py line 2: imports bench_c",
        "benchmarks/bench_b.py: 603 lines",
        "benchmarks/bench_b.py line 2: uses sys.path",
        "benchmarks/bench_b.py line 3: loads a module from a file",
    ]


# ------------------------------------------------------------- the checker, on a made-up package


def write_package(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


FAKE = {
    "pkg/__init__.py": "from pkg.a import run\n",  # a package re-exporting: not a cycle
    "pkg/a.py": "from pkg.b import helper\n\ndef run():\n    return helper()\n",
    "pkg/b.py": "def helper():\n    from pkg import a  # inside a function: counts\n",
    "pkg/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.d import X\n",
    "pkg/d.py": (
        "from pkg.c import Y\nfrom pkg.a import _hidden\nfrom . import _helper\n"
        "from pkg._helper import public\nimport asyncio.events\n"
    ),
    "pkg/_helper.py": "public = 1\n",
    "pkg/_ext.c": "",
    "pkg/sub/__init__.py": "",
    "pkg/sub/e.py": "from .. import _helper\nfrom pkg import _ext\nfrom ._inner import z\n",
    "pkg/sub/_inner.py": "z = 1\n",
    "pkg/other/__init__.py": "",
    "pkg/other/f.py": (
        "import importlib\nfrom pkg.sub import _inner\n"
        "def g():\n    importlib.import_module('pkg.other.h')\n    open('x')\n"
    ),
    "pkg/other/h.py": "import pkg.other.f\n",
}


def test_checker_finds_cycles_outside_type_checking(tmp_path: Path) -> None:
    write_package(tmp_path, FAKE)
    modules = scan(tmp_path, "pkg")
    assert cycles(runtime_graph(modules)) == [
        ["pkg.a", "pkg.b", "pkg.a"],
        ["pkg.other.f", "pkg.other.h", "pkg.other.f"],
    ]


def test_checker_finds_private_imports(tmp_path: Path) -> None:
    write_package(tmp_path, FAKE)
    problems = private_imports(scan(tmp_path, "pkg"), tmp_path)
    assert len(problems) == 2, problems
    assert problems[0].startswith("pkg.d (pkg/d.py) line 2: imports the private name '_hidden'")
    assert problems[1].startswith("pkg.other.f (pkg/other/f.py) line 2: imports pkg.sub._inner")


def test_checker_finds_io_in_a_sans_io_package(tmp_path: Path) -> None:
    write_package(tmp_path, FAKE)
    problems = no_io_problems(scan(tmp_path, "pkg"), tmp_path, "pkg")
    assert [p.split(" (rule")[0] for p in problems] == [
        "pkg.d (pkg/d.py) line 5: imports asyncio.events",
        "pkg.other.f (pkg/other/f.py) line 5: calls open()",
    ]


def _names(imports: Iterable[Import]) -> list[tuple[str, str | None, bool]]:
    return [(i.target, i.name, i.runtime) for i in imports if i.internal]


def test_checker_resolves_relative_and_submodule_imports(tmp_path: Path) -> None:
    write_package(tmp_path, FAKE)
    modules = scan(tmp_path, "pkg")
    assert _names(modules["pkg.sub.e"].imports) == [
        ("pkg._helper", None, True),
        ("pkg._ext", None, True),
        ("pkg.sub._inner", "z", True),
    ]
    assert _names(modules["pkg.c"].imports) == [("pkg.d", "X", False)]
