"""layerzero's import graph: no module imports itself back through others, and nothing imports infer.

Every import statement counts, wherever it sits (module level, inside a function, under TYPE_CHECKING):
a lazy import that closes a circle is still a circle a reader has to untangle. The same check from a shell:

    python -m pytest tests/unit/layerzero/test_lz_import_graph.py
"""

from __future__ import annotations

import ast
from pathlib import Path

import layerzero

ROOT = Path(layerzero.__file__).resolve().parent
PACKAGE = "layerzero"


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = [PACKAGE, *path.relative_to(ROOT).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Every module of `modules` (or outside package) that `name` names in an import statement."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules and target.startswith(PACKAGE + "."):
                target = target.rpartition(".")[0]
            found.add(target)
    found.discard(name)
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

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
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    modules = _modules()
    imports = {name: _imports(name, path, modules) for name, path in modules.items()}
    inside = {name: {t for t in found if t in modules} for name, found in imports.items()}
    return inside, imports


def test_no_import_circles() -> None:
    inside, _ = _graph()
    assert _cycles(inside) == []


def test_the_check_finds_a_circle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_layerzero_imports_neither_infer_nor_omniscience() -> None:
    _, imports = _graph()
    bad = {name: sorted(t for t in found if t.split(".")[0] in ("infer", "omniscience")) for name, found in imports.items()}
    assert {name: found for name, found in bad.items() if found} == {}
