"""The package layout: no import cycles between mdv's modules, not even through imports inside functions
(a late import is how a cycle hides: ``mdv.assets`` <-> ``mdv.data.sources`` did)."""
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def module_graph() -> dict[str, set[str]]:
    """mdv module -> the mdv modules it imports anywhere in its body (``from a.b import c`` counts as
    ``a.b.c`` when that is a module, else ``a.b``).  An import of one's own parent package is left out:
    Python has it loaded (or loading) before the module runs."""
    mods: dict[str, Path] = {}
    for path in (REPO / "mdv").rglob("*.py"):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name in mods}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for a in node.names:
                    full = f"{node.module}.{a.name}"
                    if full in mods:
                        deps.add(full)
                    elif node.module in mods:
                        deps.add(node.module)
        graph[name] = {d for d in deps if d != name and not name.startswith(d + ".")}
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the stack, 2: done

    def visit(u: str, stack: list[str]) -> None:
        state[u] = 1
        stack.append(u)
        for v in sorted(graph.get(u, ())):
            if state.get(v) == 1:
                cycles.append(stack[stack.index(v):] + [v])
            elif v not in state:
                visit(v, stack)
        stack.pop()
        state[u] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])
    return cycles


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_mdv_has_no_import_cycles() -> None:
    graph = module_graph()
    assert {"mdv.assets", "mdv.data.sources", "mdv.sweep.runner", "mdv.bench.e2e"} <= set(graph)
    assert "mdv.assets" in graph["mdv.data.registry"]  # the graph sees real edges
    assert "mdv.sweep.store" in graph["mdv.paired.measure"]  # imports inside functions count
    assert find_cycles(graph) == []
