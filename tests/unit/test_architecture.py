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
* at most 8 modules directly in ``streamrec/``, at most 12 in any package folder (``__init__``
  counted, generated ``*_pb2.py`` not);
* no two modules (or package folders) and no two classes of the package whose names differ by
  a plural (``source``/``sources``, ``Piece``/``Pieces``), in whichever folders they are;
* ``streamrec/format/`` (the sans-I/O core) imports neither asyncio, fsspec nor aiofiles, and
  calls no ``open()``;
* no bare ``asyncio.gather`` (it leaves the others running when one fails): tasks run in
  ``streamrec._portal.run_all`` (the first error cancels and awaits the rest) or, on cleanup
  paths where every one must run whatever the others do, ``settle_all``; only the modules in
  :data:`GATHER_ALLOWED` call it, each for the reason given there;
* ``ARCHITECTURE.md`` names every package folder (a directory with an ``__init__.py``) as its
  dotted name (``streamrec.storage.s3``) or its path (``streamrec/storage/s3/``).
* no use of another library's ``_private`` names: no ``x._name`` (or ``getattr(x, "_name")``)
  where ``x`` is not ``self``/``cls`` and ``_name`` is not streamrec's own (defined in the
  module or a module it imports), and no ``from library import _name`` / ``import
  library._module``; fsspec's documented async coroutines (``_glob``, ``_info``, ``_rm_file``)
  excepted.

The benchmarks (``benchmarks/``) keep three rules of their own: no file over 600 lines, no
script imports (or loads) another (what they share lives in ``benchmarks/_harness/``), and only
``benchmarks/_harness/__init__.py`` touches ``sys.path``.

Each failure names the module and the rule. The checker itself is tested on a small made-up
package at the end.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

MAX_LINES = 600
MAX_TOP_LEVEL_MODULES = 8
MAX_MODULES_PER_FOLDER = 12
NO_IO_PACKAGE = "streamrec.format"
IO_LIBRARIES = ("asyncio", "fsspec", "aiofiles")
GATHER_ALLOWED = {
    "streamrec._portal": "run_all and settle_all, the helpers every other module uses",
}
ARCHITECTURE = ROOT / "ARCHITECTURE.md"


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
    gathers: tuple[int, ...] = ()  # lines calling asyncio's gather

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


def _base_name(node: ast.expr) -> str | None:
    """The name an attribute chain starts from (``asyncio`` of ``asyncio.tasks.gather``)."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def gather_calls(tree: ast.AST) -> tuple[int, ...]:
    """Lines calling asyncio's ``gather``: through the module (``asyncio.gather``, under any
    name asyncio or asyncio.tasks is imported as) or as a name imported from it."""
    modules: set[str] = set()  # names bound to asyncio or asyncio.tasks
    functions: set[str] = set()  # names bound to asyncio's gather
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "asyncio":
                    modules.add(alias.asname or "asyncio")
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            for alias in node.names if node.module.split(".")[0] == "asyncio" else ():
                if alias.name == "gather":
                    functions.add(alias.asname or alias.name)
                elif alias.name == "tasks":
                    modules.add(alias.asname or alias.name)
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if (isinstance(func, ast.Name) and func.id in functions) or (
            isinstance(func, ast.Attribute)
            and func.attr == "gather"
            and _base_name(func.value) in modules
        ):
            lines.append(node.lineno)
    return tuple(sorted(lines))


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
        tree = ast.parse(path.read_text(), str(path))
        collector.visit(tree)
        modules[name] = Module(
            name,
            path,
            is_package,
            tuple(collector.imports),
            tuple(collector.calls_open),
            gather_calls(tree),
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


def crowded_folders(root: Path) -> list[str]:
    """Package folders under ``root`` holding more than :data:`MAX_MODULES_PER_FOLDER`."""
    problems = []
    for init in sorted(root.rglob("__init__.py")):
        modules = [p.name for p in init.parent.glob("*.py") if not p.name.endswith("_pb2.py")]
        if len(modules) > MAX_MODULES_PER_FOLDER:
            problems.append(
                f"{init.parent.relative_to(root.parent)}/ holds {len(modules)} modules (rule: at "
                f"most {MAX_MODULES_PER_FOLDER} per package folder; group them in a wing)"
            )
    return problems


def test_at_most_12_modules_per_package_folder() -> None:
    problems = crowded_folders(ROOT / "streamrec")
    assert not problems, "\n".join(problems)


def _plural_twins(names: Iterable[str]) -> list[tuple[str, str]]:
    known = set(names)
    return sorted(
        (name, name + ending) for name in known for ending in ("s", "es") if name + ending in known
    )


def plural_problems(root: Path) -> list[str]:
    """Modules of one folder, and classes anywhere under ``root``, whose names differ by a
    plural."""
    problems = []
    modules: dict[str, str] = {}  # name -> its first path (modules and package folders)
    for path in sorted(root.rglob("*.py")):
        name = path.parent.name if path.name == "__init__.py" else path.stem
        modules.setdefault(name, str(path.relative_to(root.parent)))
    for one, many in _plural_twins(modules):
        problems.append(
            f"modules {modules[one]} and {modules[many]} (rule: no plural twins, anywhere)"
        )
    classes: dict[str, str] = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                classes.setdefault(node.name, str(path.relative_to(root.parent)))
    for one, many in _plural_twins(classes):
        problems.append(
            f"classes {one} ({classes[one]}) and {many} ({classes[many]}) (rule: no plural twins)"
        )
    return problems


def test_no_names_that_differ_by_a_plural() -> None:
    problems = plural_problems(ROOT / "streamrec")
    assert not problems, "\n".join(problems)


def test_checker_finds_crowded_folders_and_plural_twins(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    for i in range(MAX_MODULES_PER_FOLDER):
        (pkg / "sub" / f"m{i}.py").write_text("")
    (pkg / "sub" / "gen_pb2.py").write_text("")  # (generated: not counted)
    (pkg / "stage.py").write_text("class Piece:\n    pass\n")
    (pkg / "stages.py").write_text("class Pieces:\n    pass\n")
    assert crowded_folders(pkg) == [
        f"pkg/sub/ holds {MAX_MODULES_PER_FOLDER + 1} modules (rule: at most "
        f"{MAX_MODULES_PER_FOLDER} per package folder; group them in a wing)"
    ]
    (pkg / "sub" / "source.py").write_text("")
    (pkg / "sources.py").write_text("")
    found = plural_problems(pkg)
    assert any("pkg/stage.py and pkg/stages.py" in p for p in found), found
    assert any("pkg/sub/source.py and pkg/sources.py" in p for p in found), found
    assert any("classes Piece (pkg/stage.py) and Pieces" in p for p in found), found
    (pkg / "sub" / "m0.py").unlink()
    (pkg / "stages.py").unlink()
    (pkg / "sources.py").unlink()
    (pkg / "sub" / "source.py").unlink()
    assert crowded_folders(pkg) == [] and plural_problems(pkg) == []


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


def gather_problems(modules: dict[str, Module], root: Path, allowed: Iterable[str]) -> list[str]:
    """Calls of asyncio's gather outside the ``allowed`` modules."""
    return [
        f"{module.where(root)} line {line}: calls asyncio.gather (rule: run tasks with "
        "streamrec._portal.run_all, or settle_all where every one must run to its end)"
        for name, module in sorted(modules.items())
        if name not in allowed
        for line in module.gathers
    ]


def test_no_bare_gather() -> None:
    problems = gather_problems(MODULES, ROOT, GATHER_ALLOWED)
    assert not problems, "\n".join(problems)


def package_folders(modules: dict[str, Module]) -> list[str]:
    """Every package (a folder with an ``__init__.py``), by dotted name."""
    return sorted(name for name, module in modules.items() if module.is_package)


def is_named(package: str, text: str) -> bool:
    """Whether ``text`` names ``package`` as a whole: its dotted name or its folder's path
    (``a.b`` or ``a/b/``), not as the start of another name (``a.b.c``, ``a/b/c.py``)."""
    dotted = rf"(?<![\w./]){re.escape(package)}(?![\w/]|\.\w)"
    path = rf"(?<![\w./]){re.escape(package.replace('.', '/'))}/?(?![\w/]|\.\w)"
    return re.search(dotted, text) is not None or re.search(path, text) is not None


def unnamed_packages(modules: dict[str, Module], text: str) -> list[str]:
    return [
        f"{name}: not named in ARCHITECTURE.md (rule: the map names every package folder, as "
        f"{name} or {name.replace('.', '/')}/)"
        for name in package_folders(modules)
        if not is_named(name, text)
    ]


def test_architecture_names_every_package() -> None:
    problems = unnamed_packages(MODULES, ARCHITECTURE.read_text())
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


GATHERING = {
    "pkg/__init__.py": "",
    "pkg/a.py": "import asyncio\n\nasync def f(xs):\n    return await asyncio.gather(*xs)\n",
    "pkg/b.py": (
        "from asyncio import gather as g\nimport asyncio.tasks as t\n\n"
        "async def f(x):\n    await g(x)\n    await t.gather(x)\n"
    ),
    "pkg/c.py": (  # gathers that are not asyncio's
        "import numpy as np\n\ndef gather(x):\n    return x\n\n"
        "def f(self, x):\n    gather(x)\n    self.gather(x)\n    np.gather(x)\n"
    ),
    "pkg/_allowed.py": "import asyncio as aio\n\nasync def f(x):\n    await aio.gather(x)\n",
}


def test_checker_finds_bare_gathers(tmp_path: Path) -> None:
    write_package(tmp_path, GATHERING)
    modules = scan(tmp_path, "pkg")
    assert modules["pkg._allowed"].gathers == (4,)
    problems = gather_problems(modules, tmp_path, ["pkg._allowed"])
    assert [p.split(" (rule")[0] for p in problems] == [
        "pkg.a (pkg/a.py) line 4: calls asyncio.gather",
        "pkg.b (pkg/b.py) line 5: calls asyncio.gather",
        "pkg.b (pkg/b.py) line 6: calls asyncio.gather",
    ]


def test_checker_finds_packages_the_map_leaves_out(tmp_path: Path) -> None:
    write_package(tmp_path, FAKE)
    modules = scan(tmp_path, "pkg")
    assert package_folders(modules) == ["pkg", "pkg.other", "pkg.sub"]
    text = "`pkg/sub/` reads; pkg.other.f and pkg/other/h.py are modules; pkg.subway is not us"
    assert [p.split(":")[0] for p in unnamed_packages(modules, text)] == ["pkg", "pkg.other"]
    named = "The root `pkg/`, pkg.other (its f) and pkg/sub."
    assert unnamed_packages(modules, named) == []


# ------------------------------------------ no use of another library's private names

FSSPEC_ASYNC_API = frozenset({"_glob", "_info", "_rm_file"})
"""The only third-party ``_names`` streamrec may use: fsspec's async API, whose coroutines are
documented under their underscore names (the ``async def`` versions of ``AbstractFileSystem``'s
methods: https://filesystem-spec.readthedocs.io/en/latest/async.html)."""


@dataclass(frozen=True)
class PrivateUse:
    """A use of a ``_private`` name that streamrec does not define."""

    path: str  # relative to the root
    line: int
    what: str  # the expression, or the import

    def __str__(self) -> str:
        return (
            f"{self.path} line {self.line}: {self.what} uses a private name of another "
            "library (rule: no third-party _private attribute or import; where no public API "
            "gives what is needed, do without it)"
        )


def _self_or_cls(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id in ("self", "cls")


def own_private_names(trees: Iterable[ast.Module]) -> set[str]:
    """The ``_names`` the package defines: functions and classes, module- and class-level
    assignments, and ``self._x`` / ``cls._x`` assignments."""
    names: set[str] = set()

    def targets(node: ast.AST) -> Iterable[ast.expr]:
        if isinstance(node, ast.Assign):
            return node.targets
        if isinstance(node, ast.AnnAssign | ast.AugAssign):
            return [node.target]
        return []

    def add(body: Iterable[ast.stmt]) -> None:  # a module's or a class's own level
        for statement in body:
            for target in targets(statement):
                for node in ast.walk(target):
                    if isinstance(node, ast.Name):
                        names.add(node.id)

    for tree in trees:
        add(tree.body)
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            if isinstance(node, ast.ClassDef):
                add(node.body)
            for target in targets(node):
                for part in ast.walk(target):
                    if isinstance(part, ast.Attribute) and _self_or_cls(part.value):
                        names.add(part.attr)
    return {name for name in names if _is_private(name)}


def private_uses(
    modules: dict[str, Module], root: Path, allowed: frozenset[str]
) -> list[PrivateUse]:
    """Every ``x._name`` (and ``getattr(x, "_name")``) where ``x`` is not ``self``/``cls`` and
    ``_name`` is neither ``allowed`` nor defined by the module itself or by a module of the
    package it imports at run time (their own names: :func:`own_private_names`), and every
    import of a private name or module of another library. (The names are those of the
    module and what it imports, not the whole package's: a library's ``_session`` is not
    excused by some unrelated module's own ``_session``. A library's private name that the
    module happens to define itself still passes: the check reads names, not types.)"""
    trees = {name: ast.parse(m.path.read_text(), str(m.path)) for name, m in modules.items()}
    defined = {name: own_private_names([tree]) for name, tree in trees.items()}
    found = []
    for name, module in sorted(modules.items()):
        path = module.path.relative_to(root).as_posix()
        own = set(defined[name])
        for i in module.imports:
            if i.internal and i.runtime:
                own |= defined.get(i.target, set())
                if i.name is not None:  # ``from package import module``
                    own |= defined.get(f"{i.target}.{i.name}", set())
            dotted = [*i.target.split("."), *([i.name] if i.name else [])]
            if not i.internal and any(_is_private(part) for part in dotted):
                found.append(PrivateUse(path, i.line, f"import of {'.'.join(dotted)}"))
        for node in ast.walk(trees[name]):
            attr, value = None, None
            if isinstance(node, ast.Attribute):
                attr, value = node.attr, node.value
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr", "setattr")
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str)
            ):
                attr, value = node.args[1].value, node.args[0]
            if (
                attr is not None
                and value is not None
                and _is_private(attr)
                and not _self_or_cls(value)
                and attr not in own
                and attr not in allowed
            ):
                found.append(PrivateUse(path, node.lineno, ast.unparse(node)))
    return sorted(found, key=lambda u: (u.path, u.line, u.what))


def _tally(uses: Iterable[PrivateUse]) -> set[tuple[str, str, int]]:
    counts: dict[tuple[str, str], int] = {}
    for use in uses:
        counts[use.path, use.what] = counts.get((use.path, use.what), 0) + 1
    return {(path, what, n) for (path, what), n in counts.items()}


def test_no_third_party_private_names() -> None:
    uses = private_uses(MODULES, ROOT, FSSPEC_ASYNC_API)
    assert not uses, "\n".join(map(str, uses))


PRIVATE_FAKE = {
    "pkg/__init__.py": "",
    "pkg/own.py": (
        "class A:\n"
        "    _shared = 1\n"
        "    def __init__(self):\n"
        "        self._x = 1\n"
        "    def _helper(self):\n"
        "        return self._y\n"
        "def use(a, other):\n"
        "    return a._x, a._helper(), A._shared, other._secret\n"
    ),
    "pkg/third.py": (
        "import zlib\n"
        "import thirdlib._impl\n"
        "from thirdlib import _hidden, public\n"
        "from thirdlib._core import thing\n"
        "from pkg.own import A as _A\n"
        "inflater: zlib._Decompress\n"
        "conn = getattr(client, '_conn', None)\n"
        "found = fs._glob('x')\n"
        "fs._token = 'x'\n"
        "mine = obj._x  # (a name of pkg.own, imported here)\n"
    ),
    "pkg/lone.py": "def f(session):\n    return session._x  # pkg.own not imported\n",
    "pkg/typed.py": (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from pkg.own import A\n"
        "def f(a):\n"
        "    return a._helper()  # pkg.own imported for typing only\n"
    ),
}


def test_checker_finds_third_party_private_names(tmp_path: Path) -> None:
    write_package(tmp_path, PRIVATE_FAKE)
    uses = private_uses(scan(tmp_path, "pkg"), tmp_path, frozenset({"_glob"}))
    assert [(u.path, u.line, u.what) for u in uses] == [
        ("pkg/lone.py", 2, "session._x"),
        ("pkg/own.py", 8, "other._secret"),
        ("pkg/third.py", 2, "import of thirdlib._impl"),
        ("pkg/third.py", 3, "import of thirdlib._hidden"),
        ("pkg/third.py", 4, "import of thirdlib._core.thing"),
        ("pkg/third.py", 6, "zlib._Decompress"),
        ("pkg/third.py", 7, "getattr(client, '_conn', None)"),
        ("pkg/third.py", 9, "fs._token"),
        ("pkg/typed.py", 5, "a._helper"),
    ]
    assert own_private_names([ast.parse((tmp_path / "pkg/own.py").read_text())]) == {
        "_shared",
        "_x",
        "_helper",
    }
