"""The package's modules form layers without cycles, and the lower layers do not load torch.

Every ``import`` in every module of mlagen counts, at the top of a module or inside a function
(an import inside a function is a dependency too, only a late one); ``if TYPE_CHECKING:`` blocks
do not, since they never run. A module's implicit import
of its parent package is not counted: a package ``__init__`` that re-exports its submodules
would otherwise be a cycle by construction.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "mlagen"

# Import cycles allowed for now, each as the sorted tuple of the modules in it. Empty: none.
ALLOWED_CYCLES: set[tuple[str, ...]] = set()


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    """``if TYPE_CHECKING:`` blocks are read by type checkers only, never imported."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """mlagen modules ``name`` imports anywhere in its body."""
    is_pkg = path.name == "__init__.py"
    package = name if is_pkg else name.rpartition(".")[0]
    found = set()
    tree = ast.parse(path.read_text(), str(path))
    typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If) and _is_type_checking(block.test)
                   for stmt in block.body for n in ast.walk(stmt)}
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "mlagen":
                    found.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                base = ".".join(base + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if base.split(".")[0] != "mlagen":
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in modules else base)
    return {m for m in found if m in modules and m != name}


def graph() -> dict[str, set[str]]:
    modules = all_modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def cycles(g: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in g[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(tuple(sorted(comp)))

    sys.setrecursionlimit(10000)
    for v in g:
        if v not in index:
            visit(v)
    return out


def test_the_walker_sees_imports_inside_functions():
    g = graph()
    assert "mlagen.api" in g["mlagen"]  # mlagen.__getattr__ imports it lazily
    assert "mlagen.families.base" in g["mlagen.families"]


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [("a", "b", "c")]


def test_no_import_cycles():
    found = [c for c in cycles(graph()) if c not in ALLOWED_CYCLES]
    assert not found, "import cycles (every module in one imports the next):\n" + "\n".join(
        " <-> ".join(c) for c in found)


MAX_LINES = 800   # a module longer than this holds more than one step of the data flow
# Modules allowed to be longer for now, each with the change that splits it. Empty: none.
ALLOWED_LONG: dict[str, str] = {}


def test_no_module_is_over_800_lines():
    long = {name: n for name, path in all_modules().items()
            if (n := len(path.read_text().splitlines())) > MAX_LINES and name not in ALLOWED_LONG}
    assert not long, f"modules over {MAX_LINES} lines (split them by step): {long}"


def test_the_feasibility_search_sits_with_the_resource_model():
    """variant.py builds variants; the search for the ones that fit needs the resource model, so it
    lives in resources.py, which imports variant and not the other way round."""
    g = graph()
    assert "mlagen.variant" in g["mlagen.resources"]
    assert "mlagen.resources" not in g["mlagen.variant"]


def test_no_family_named_outside_its_package():
    """dispatch, tune, bench and the CLI reach families through the protocol only."""
    g = graph()
    for name in ("mlagen.dispatch", "mlagen.cli", "mlagen.spec", "mlagen.resources", "mlagen.render",
                 "mlagen.db", "mlagen.build", "mlagen.compiler", "mlagen.runtime", "mlagen.verify",
                 "mlagen.measure", "mlagen.progress", "mlagen.shapes", "mlagen.bench", "mlagen.peers",
                 "mlagen.check", "mlagen.cli_db", "mlagen.cli_common",
                 *(m for m in g if m == "mlagen.tune" or m.startswith("mlagen.tune."))):
        named = {m for m in g[name] if m.startswith("mlagen.families.") and m != "mlagen.families.base"}
        assert not named, f"{name} imports {sorted(named)}"


LEAVES = ["mlagen.errors", "mlagen.knobs", "mlagen.paths", "mlagen.arch", "mlagen.expr", "mlagen.abi",
          "mlagen.cache", "mlagen.source", "mlagen.spec", "mlagen.variant", "mlagen.resources", "mlagen.render",
          "mlagen.compiler", "mlagen.db", "mlagen.runtime", "mlagen.dispatch", "mlagen.build", "mlagen.cli",
          "mlagen.families", "mlagen.families.mla_prefill", "mlagen.shapes", "mlagen.verify", "mlagen.measure",
          "mlagen.progress", "mlagen.tune", "mlagen.tune.search", "mlagen.tune.runner", "mlagen.bench", "mlagen.peers", "mlagen.families.mla_prefill.peers",
          "mlagen.families.mla_sparse_prefill", "mlagen.families.mla_sparse_prefill.peers", "mlagen.cli_db",
          "mlagen.tune.compare", "mlagen.tune.worker"]


@pytest.mark.parametrize("module", LEAVES)
def test_importing_does_not_load_torch(module):
    code = f"import sys, {module}; print('torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False", f"importing {module} loads torch"


def test_a_leaf_module_loads_only_itself():
    code = "import sys, mlagen.expr; print(sorted(m for m in sys.modules if m.startswith('mlagen')))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert eval(proc.stdout) == ["mlagen", "mlagen.expr"]


def test_sibling_imports_bind_modules():
    """``from . import name`` inside a family package must bind the submodule: a package that
    re-exports a function of the same name (``launch``, ``reference``) would hand importers the
    function instead, once the package's ``__init__`` has run (an import-order bug the GPU tests
    met: ``'function' object has no attribute 'accepts'``)."""
    import ast
    import importlib
    import types

    families_dir = Path(ROOT) / "mlagen" / "families"
    for path in sorted(families_dir.glob("*/*.py")):
        package = importlib.import_module(f"mlagen.families.{path.parent.name}")
        if path.stem != "__init__":
            importlib.import_module(f"{package.__name__}.{path.stem}")  # runs its sibling imports
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module is None:
                for alias in node.names:
                    if (path.parent / f"{alias.name}.py").exists() or (path.parent / alias.name).is_dir():
                        bound = getattr(package, alias.name)
                        assert isinstance(bound, types.ModuleType), (
                            f"{path.relative_to(ROOT)}: 'from . import {alias.name}' gets "
                            f"{type(bound).__name__} {alias.name!r}, not the submodule: import it by name")
