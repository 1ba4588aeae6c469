"""The import graph of src/perfcast: layers import only the ones below them (DESIGN.md,
``data <- features <- models <- training <- serve``) and no module imports itself in a circle."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "perfcast"
LAYERS = ("data", "features", "models", "training", "serve")


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """Every perfcast module and the perfcast modules it imports (at any depth in the file)."""
    modules = {_module(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            found |= {t for t in targets if t in modules and t != name}
        graph[name] = found
    return graph


def _layer(module: str) -> int | None:
    parts = module.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else None


def test_no_layer_imports_a_layer_above_it() -> None:
    graph = _imports()
    assert "perfcast.data.tables" in graph["perfcast.serve.batch"]  # the scan sees real imports
    upward = [
        f"{src} -> {dst}"
        for src, targets in graph.items()
        for dst in targets
        if _layer(src) is not None and _layer(dst) is not None and _layer(dst) > _layer(src)
    ]
    assert not upward, upward


def test_the_import_graph_has_no_circle() -> None:
    graph = _imports()
    state: dict[str, int] = {}
    circles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                circles.append([*path[path.index(nxt):], nxt] if nxt in path else [node, nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for start in sorted(graph):
        if start not in state:
            visit(start, [start])
    assert not circles, circles[:5]
