"""How the jfa_prof modules import each other: no cycles, and reading result files stays free of torch.

Cycles are found on the source with ast, without importing anything, so the check costs nothing
and runs everywhere. Imports inside functions count: a cycle through one still ties the modules
together, and it breaks the day either import moves to the top. Only import statements are seen
(``importlib.import_module("jfa_prof....")`` with a string is not).
"""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Where each package's files are (pyproject.toml's package-dir).
PACKAGES = {"jfa_prof": ROOT / "jfa_prof", "jfa_prof.kernels": ROOT / "kernels", "jfa_prof.analyses": ROOT / "analyses"}
# The one cycle allowed: the kernel registry imports the kernel modules inside all_variants() so
# that they register their variants, and they import the registry to register (a plugin registry).
ALLOWED = {("jfa_prof.kernels.registry", "jfa_prof.kernels.fwd"), ("jfa_prof.kernels.registry", "jfa_prof.kernels.bwd")}


def package_modules() -> dict[str, Path]:
    """Module name -> file, for every module of the installed packages."""
    out = {}
    for pkg, folder in PACKAGES.items():
        for f in sorted(folder.rglob("*.py")):
            parts = list(f.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join([pkg, *parts])] = f
    return out


def _imported(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    """The dotted names one import statement in ``module`` may load, modules or not."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level:  # relative: from its own package, one level up per extra dot
        base = module.split(".")[:len(module.split(".")) - node.level + is_package]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    # `from pkg import name` loads pkg, and pkg.name where that is a module.
    return [target] + [f"{target}.{a.name}" for a in node.names]


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the package modules it imports anywhere in its file."""
    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        edges = graph.setdefault(module, set())
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for name in _imported(node, module, path.name == "__init__.py"):
                    target = owner(name)
                    if target and target != module:
                        edges.add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_the_cycle_finder_finds_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_sees_top_level_function_level_and_relative_imports():
    modules = package_modules()
    graph = import_graph(modules)
    assert {"jfa_prof.bench", "jfa_prof.inputs", "jfa_prof.kernels.fwd", "jfa_prof.analyses.limits"} <= set(graph)
    assert "jfa_prof.inputs" in graph["jfa_prof.recording"]  # at the top
    assert "jfa_prof.kernels.attention" in graph["jfa_prof.ablations"]  # inside a function
    assert "jfa_prof.kernels.fwd" in graph["jfa_prof.kernels.registry"]  # the allowed cycle is seen
    assert _imported(ast.parse("from .fwd import x").body[0], "jfa_prof.kernels.bwd", False) == [
        "jfa_prof.kernels.fwd", "jfa_prof.kernels.fwd.x"]
    assert _imported(ast.parse("from . import fwd").body[0], "jfa_prof.kernels", True)[1] == "jfa_prof.kernels.fwd"


def test_no_import_cycle_among_the_jfa_prof_modules():
    graph = import_graph(package_modules())
    for a, b in ALLOWED:
        graph[a].discard(b)
    found = cycles(graph)
    assert not found, "import cycles (break them by moving the shared names lower): " + "; ".join(
        " <-> ".join(group) for group in found)


@pytest.mark.parametrize("module", ["jfa_prof.bench", "jfa_prof.bench.results", "jfa_prof.ablations"])
def test_reading_result_files_does_not_import_torch(module):
    # `bench --results`, `waterfall --results` and the report read files with these modules alone.
    code = f"import json, sys, {module}; print(json.dumps('torch' in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert json.loads(out.stdout) is False


def test_names_that_moved_to_inputs_are_still_served_where_they_were():
    from jfa_prof import ablations, bench, inputs

    assert bench.upstream_grad is inputs.upstream_grad
    assert bench.rows_seeing_keys is inputs.rows_seeing_keys
    assert ablations.workload_dict is inputs.workload_dict and bench.workload_dict is inputs.workload_dict
    with pytest.raises(AttributeError):
        bench.no_such_name  # noqa: B018
