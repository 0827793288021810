"""No import circle in the package: the graph of every import of one of its modules by another,
at module level or inside a function, has no cycle (reward/code.py and reward/rules.py once
imported each other)."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "megatron_rlep"


def modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports(found: dict[str, Path]) -> dict[str, set[str]]:
    """Each module's imports of the package's other modules (``from pkg import module`` names
    the module, ``from pkg.module import name`` the module)."""
    def module_of(name: str) -> str:
        while name and name not in found:
            name = name.rpartition(".")[0]
        return name

    graph = {}
    for name, path in found.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PACKAGE.name):
                targets |= {module_of(f"{node.module}.{a.name}") for a in node.names}
            elif isinstance(node, ast.Import):
                targets |= {module_of(a.name) for a in node.names
                            if a.name.startswith(PACKAGE.name)}
        graph[name] = targets - {name, ""}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))
    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_the_cycle_finder_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circle_in_the_package():
    found = modules()
    graph = imports(found)
    assert "megatron_rlep.reward.sources" in graph["megatron_rlep.reward.code"]
    assert cycles(graph) == []
