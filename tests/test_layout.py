"""The package layout is the architecture: layers import downwards only, no import cycle, methods stay apart.

Every ``import`` in ``specbench/`` and ``methods/`` is read (those inside functions too), so a cycle
hidden in a function body fails here as well; ``bench/``'s scripts are checked for cycles among themselves and
for reading the tests.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Lower numbers sit lower; a module may import its own package and anything strictly below it.
LAYERS = {
    "specbench": -1,  # the package's __init__: its version alone
    "specbench.errors": 0,
    "specbench.paths": 0,
    "specbench.hub": 0,
    "specbench.provenance": 0,
    "specbench.core": 1,
    "specbench.models": 2,
    "specbench.data": 2,
    "specbench.results": 2,
    "specbench.stores": 3,
    "specbench.budget": 3,
    "specbench.peers": 3,
    "specbench.drafting": 4,
    "specbench.machine": 4,  # what this machine costs: the curve measured and cached
    "methods": 5,
    "specbench.run": 6,
    "specbench.gpucheck": 6,  # the lent-GPU check: models, methods and decoding, never a job
    "specbench.tables": 7,
    "specbench.cli": 8,
    "specbench.__main__": 9,  # `python -m specbench <verb>`: the command where it is not installed
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    files = [*ROOT.joinpath("specbench").rglob("*.py"), *ROOT.joinpath("methods").rglob("*.py")]
    return {_module_name(p): p for p in files}


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The project module an imported name lives in (``a.b.c`` may be a module or a name in ``a.b``)."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _imports(module: str, path: Path) -> set[str]:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names = [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            target = _resolve(name)
            if target and target != module:
                out.add(target)
    return out


GRAPH = {m: _imports(m, p) for m, p in MODULES.items()}


def _layer(module: str) -> tuple[str, int]:
    best = max((k for k in LAYERS if module == k or module.startswith(k + ".")), key=len, default=None)
    assert best is not None, f"{module} is in no layer: add its package to LAYERS"
    return best, LAYERS[best]


def test_every_module_sits_in_a_layer():
    for module in MODULES:
        _layer(module)


def test_imports_point_downwards():
    wrong = []
    for module, targets in GRAPH.items():
        pkg, level = _layer(module)
        for target in targets:
            tpkg, tlevel = _layer(target)
            if tpkg != pkg and tlevel >= level:
                wrong.append(f"{module} ({pkg}, layer {level}) imports {target} ({tpkg}, layer {tlevel})")
    assert not wrong, "\n".join(sorted(wrong))


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_no_import_cycle():
    """Every import, those inside functions included."""
    # a package __init__ that imports its own modules, which import the package, is not a cycle of design
    cycles = [c for c in _cycles(GRAPH) if not _only_package_init(c)]
    assert not cycles, f"import cycles: {cycles}"


BENCH = {p.stem: p for p in ROOT.joinpath("bench").glob("*.py")}
READS_TESTS = {"host_traffic"}  # it tables the simulated GPUs' traffic, which the tests' simulator defines


def _top_level_imports(path: Path) -> set[str]:
    """The top-level modules ``path`` imports, those inside functions too (a bench script's neighbours by bare name:
    bench/ is on its path)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module.split(".")[0])
    return out


def test_bench_scripts_import_no_cycle_and_no_tests():
    """bench/'s scripts import each other without a cycle (in function bodies too), and read nothing from the
    tests (but :data:`READS_TESTS`, named with why)."""
    imports = {name: _top_level_imports(path) for name, path in BENCH.items()}
    graph = {name: {t for t in targets if t in BENCH and t != name} for name, targets in imports.items()}
    assert not _cycles(graph), f"import cycles in bench/: {_cycles(graph)}"
    readers = {name for name, targets in imports.items() if "tests" in targets}
    assert readers == READS_TESTS, f"bench/ scripts reading tests/: {sorted(readers)}"


def test_the_bench_check_sees_a_cycle():
    assert _cycles({"compare": {"prompts"}, "prompts": {"compare"}, "baseline": set()}) == [["compare", "prompts"]]


def _only_package_init(comp: list[str]) -> bool:
    inits = [m for m in comp if MODULES[m].name == "__init__.py"]
    return len(inits) == 1 and all(m == inits[0] or m.startswith(inits[0] + ".") for m in comp)


def test_nothing_imports_the_command_line():
    users = sorted(m for m, targets in GRAPH.items() for t in targets
                   if t.startswith("specbench.cli") and _layer(m)[1] < LAYERS["specbench.__main__"]
                   and not m.startswith("specbench.cli"))
    assert not users, users


def test_core_imports_nothing_of_the_project_above_it():
    for module, targets in GRAPH.items():
        if module.startswith("specbench.core"):
            assert all(t.startswith("specbench.core") or t == "specbench.errors" for t in targets), (module, targets)


def _third_party(path: Path) -> set[str]:
    """The top-level packages outside the project that ``path`` imports (those inside functions too)."""
    return _top_level_imports(path) - {"specbench", "methods", "__future__"}


def test_the_budget_decides_from_numbers_alone():
    """budget/ prices and decides; timing the machine (torch) lives in machine/, so the planner is tested
    without a model."""
    heavy = {m: _third_party(p) & {"torch", "transformers"}
             for m, p in MODULES.items() if m.startswith("specbench.budget")}
    assert not any(heavy.values()), heavy
    assert _third_party(MODULES["specbench.machine.costs"]) & {"torch"}  # the checker reads imports at all


def test_a_method_imports_no_other_method():
    for module, targets in GRAPH.items():
        if module.startswith("methods.") and module != "methods.registry":
            others = [t for t in targets if t.startswith("methods") and t not in ("methods", "methods.registry")]
            assert not others, f"{module} imports {others}"


@pytest.mark.parametrize("limit", [400])
def test_modules_stay_small_or_say_why(limit):
    """A module over ~400 lines says in its docstring why it is one module (the word "one module")."""
    long = []
    for module, path in MODULES.items():
        text = path.read_text()
        if text.count("\n") > limit and "one module" not in (ast.get_docstring(ast.parse(text)) or ""):
            long.append(f"{module}: {text.count(chr(10))} lines")
    assert not long, long


def test_the_checker_catches_an_upward_import(tmp_path):
    """The layering check is not vacuous: a core module importing the runner would be reported."""
    GRAPH["specbench.core.decode"].add("specbench.run.runner")
    try:
        with pytest.raises(AssertionError, match="specbench.core.decode"):
            test_imports_point_downwards()
    finally:
        GRAPH["specbench.core.decode"].discard("specbench.run.runner")
