"""The import rules of everything under src/: no import circles, and each package imports only what its layer may.

Every `import` and `from ... import` statement is read from the source (module level, inside a function, under
`if TYPE_CHECKING:`). A circle is a set of modules that import each other at run time, so imports under
TYPE_CHECKING (never executed) do not close one; every import, type-only included, obeys the layer rules:
- layerzero imports nothing from infer or omniscience; omniscience imports nothing from infer;
- infer reaches layerzero only through its public API: `import layerzero` or `from layerzero import X` with X in
  `layerzero.__all__`, never `layerzero.<module>`;
- infer.models never imports infer.engine (the scheduler included), infer.server or infer.runners;
- infer.server imports neither infer.runners nor infer.models;
- infer.kv imports no torch.
The few imports that break a rule today and are not fixed yet are in ALLOWED, each with its reason; an entry the
source no longer needs fails the test too, so the list only shrinks. From a shell:

    python -m pytest tests/unit/test_import_rules.py
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest

import layerzero

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGES = ("infer", "layerzero", "omniscience")

# (importing module, imported module) -> why it is still there. `python -m omniscience train` runs a model to collect
# the residuals it fits a probe on, importing infer inside collect_activations (importing omniscience never loads
# infer); moving the command under infer removes both. infer.server has no direct import of infer.runners or
# infer.models left (it reaches them through infer.engine), so none is listed and none may be added.
ALLOWED: dict[tuple[str, str], str] = {
    ("omniscience.cli", "infer"): "the probe trainer's command runs a model through infer.LLM",
    ("omniscience.cli", "infer.models.forward_batch"): "the probe trainer's command builds the model's batch",
}


@dataclass(frozen=True)
class Import:
    """One module an import statement of `source` names: `import M` or `from M import name`."""

    source: str  # the importing module
    module: str  # M, absolute (`from M import X` gives M.X when that is a module of the tree)
    target: str  # the module of the tree M lies in, else M as written (torch.nn)
    name: str | None  # X of `from M import X` when M.X is not a module
    statement: str
    file: str  # relative to src/
    line: int
    type_only: bool  # under `if TYPE_CHECKING:`
    in_function: bool

    def __str__(self) -> str:
        notes = [note for note, on in (("inside a function", self.in_function), ("under TYPE_CHECKING", self.type_only))
                 if on]
        return f"{self.file}:{self.line}: {self.statement}" + (f"  ({', '.join(notes)})" if notes else "")


def modules(src: Path, packages: Iterable[str] = PACKAGES) -> dict[str, Path]:
    """Every module of the packages: dotted name -> file (a package is its __init__.py)."""
    out = {}
    for package in packages:
        for path in sorted((src / package).rglob("*.py")):
            parts = list(path.relative_to(src).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(name: str, path: Path, tree: dict[str, Path], src: Path) -> list[Import]:
    """Every import statement of module `name`, each imported module resolved (relative ones too)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    file = path.relative_to(src).as_posix()
    found: list[Import] = []

    def add(node: ast.stmt, module: str, imported: str | None, type_only: bool, in_function: bool) -> None:
        found.append(Import(name, module, _owner(module, tree), imported, ast.unparse(node), file, node.lineno,
                            type_only, in_function))

    def visit(node: ast.AST, type_only: bool, in_function: bool) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(node, alias.name, None, type_only, in_function)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0]
                base = f"{anchor}.{base}" if base else anchor
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if full in tree:
                    add(node, full, None, type_only, in_function)
                else:
                    add(node, base, alias.name, type_only, in_function)
        in_function = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        if isinstance(node, ast.If) and _type_checking(node.test):
            for child in node.body:
                visit(child, True, in_function)
            for child in node.orelse:
                visit(child, type_only, in_function)
            return
        for child in ast.iter_child_nodes(node):
            visit(child, type_only, in_function)

    visit(ast.parse(path.read_text(), str(path)), False, False)
    return found


def _owner(target: str, tree: dict[str, Path]) -> str:
    """The module of the tree a dotted name lies in (`a.b.C` -> `a.b`), or the name itself outside the tree."""
    probe = target
    while probe and probe not in tree:
        probe = probe.rpartition(".")[0]
    return probe or target


def all_imports(src: Path, packages: Iterable[str] = PACKAGES) -> list[Import]:
    tree = modules(src, packages)
    return [imp for name, path in tree.items() for imp in imports_of(name, path, tree, src)]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted, in sorted order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

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
    return sorted(out)


def _shortest_cycle(start: str, edges: dict[str, dict[str, Import]]) -> list[Import]:
    """The fewest imports that lead from `start` back to it (breadth first)."""
    came: dict[str, Import] = {}
    frontier = [start]
    while frontier:
        following = []
        for v in frontier:
            for w, imp in sorted(edges[v].items()):
                if w == start:
                    path = [imp]
                    while path[0].source != start:
                        path.insert(0, came[path[0].source])
                    return path
                if w not in came:
                    came[w] = imp
                    following.append(w)
        frontier = following
    raise ValueError(f"{start} is on no cycle")


def circles(imports: list[Import], tree: Iterable[str]) -> list[str]:
    """Each import circle of the run-time graph: its modules, one shortest loop, and every import inside it."""
    names = set(tree)
    runtime = [i for i in imports if not i.type_only and i.target in names and i.target != i.source]
    graph: dict[str, set[str]] = {name: set() for name in names}
    for imp in runtime:
        graph[imp.source].add(imp.target)
    out = []
    for component in cycles(graph):
        members = set(component)
        inside = sorted({(i.file, i.line): i for i in runtime if i.source in members and i.target in members}.items())
        edges: dict[str, dict[str, Import]] = {m: {} for m in component}
        for _, imp in inside:
            edges[imp.source].setdefault(imp.target, imp)
        loop = _shortest_cycle(component[0], edges)
        out.append(f"circle of {len(component)} modules: {', '.join(component)}\n"
                   f"  shortest loop: {' -> '.join([component[0], *(i.target for i in loop)])}\n"
                   + "".join(f"    {imp}\n" for imp in loop)
                   + "  every import inside it:\n" + "".join(f"    {imp}\n" for _, imp in inside))
    return out


def _under(module: str, *prefixes: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


# (rule, the importing modules it covers, the modules they may not import)
RULES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("layerzero imports nothing from infer or omniscience", "layerzero", ("infer", "omniscience")),
    ("omniscience imports nothing from infer", "omniscience", ("infer",)),
    ("infer.models never imports infer.engine (scheduler included), infer.server or infer.runners", "infer.models",
     ("infer.engine", "infer.server", "infer.runners")),
    ("infer.server imports neither infer.runners nor infer.models", "infer.server", ("infer.runners", "infer.models")),
    ("infer.kv imports no torch", "infer.kv", ("torch",)),
)
LAYERZERO_RULE = "infer reaches layerzero only through `import layerzero` and the names of layerzero.__all__"


def violations(imports: list[Import], layerzero_public: set[str]) -> list[tuple[str, Import]]:
    """(rule, import) for every import that breaks a rule (once per statement); ALLOWED is not applied here."""
    out: dict[tuple[str, str, int, str], tuple[str, Import]] = {}
    for imp in imports:
        broken = [rule for rule, source, forbidden in RULES
                  if _under(imp.source, source) and _under(imp.module, *forbidden)]
        public = imp.module == "layerzero" and (imp.name is None or imp.name in layerzero_public)
        if _under(imp.source, "infer") and _under(imp.module, "layerzero") and not public:
            broken.append(LAYERZERO_RULE)
        for rule in broken:
            out.setdefault((rule, imp.file, imp.line, imp.module), (rule, imp))
    return list(out.values())


def test_no_import_circles() -> None:
    tree = modules(SRC)
    found = circles(all_imports(SRC), tree)
    if found:
        pytest.fail("import circles (type-only imports left out):\n" + "\n".join(found), pytrace=False)


def test_every_import_obeys_the_layer_rules() -> None:
    broken = [(rule, imp) for rule, imp in violations(all_imports(SRC), set(layerzero.__all__))
              if (imp.source, imp.module) not in ALLOWED]
    if broken:
        lines = "".join(f"  {imp}\n      breaks: {rule}\n" for rule, imp in broken)
        pytest.fail(f"imports that break the rules:\n{lines}", pytrace=False)


def test_the_allow_list_only_shrinks() -> None:
    used = {(imp.source, imp.module) for _, imp in violations(all_imports(SRC), set(layerzero.__all__))}
    stale = sorted(set(ALLOWED) - used)
    assert not stale, f"ALLOWED names imports the source no longer has; remove them: {stale}"


def _write(src: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = src / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_checks_find_circles_and_broken_rules(tmp_path: Path) -> None:
    _write(tmp_path, {
        "infer/__init__.py": "",
        "infer/a.py": "from infer import b\n",
        "infer/b.py": "def f():\n    from . import c\n",  # a late import still closes a circle
        "infer/c.py": "import infer.a\n",
        "infer/d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from infer import e\n",
        "infer/e.py": "from infer.d import x\n",  # d -> e only for type checking: no circle
        "infer/kv/__init__.py": "if TYPE_CHECKING:\n    import torch\n",  # type-only imports obey the rules
        "infer/models/m.py": "from infer.engine.scheduler import Scheduler\n",
        "infer/server/s.py": "from ..models import m\n",
        "infer/sampler.py": "import layerzero as lz\nfrom layerzero import top\nfrom layerzero.kernels import ref\n",
        "layerzero/__init__.py": "from omniscience import probe\n",
        "omniscience/__init__.py": "def f():\n    from infer import LLM\n",
    })
    imports = all_imports(tmp_path)
    loop = ("    infer/a.py:1: from infer import b\n"
            "    infer/b.py:2: from . import c  (inside a function)\n"
            "    infer/c.py:1: import infer.a\n")
    assert circles(imports, modules(tmp_path)) == [
        "circle of 3 modules: infer.a, infer.b, infer.c\n"
        "  shortest loop: infer.a -> infer.b -> infer.c -> infer.a\n" + loop + "  every import inside it:\n" + loop
    ]
    broken = sorted(f"{imp.file}:{imp.line} {rule.split()[0]}" for rule, imp in violations(imports, {"top"}))
    assert broken == [
        "infer/kv/__init__.py:2 infer.kv",
        "infer/models/m.py:1 infer.models",
        "infer/sampler.py:3 infer",
        "infer/server/s.py:1 infer.server",
        "layerzero/__init__.py:1 layerzero",
        "omniscience/__init__.py:2 omniscience",
    ]


# What an API server process may load: its own packages and the light modules they share with the core.
API_SERVER_ENTRIES = ("infer.server.launch", "infer.server.app")
API_SERVER_FORBIDDEN = ("torch", "triton", "transformers", "layerzero", "omniscience", "infer.runners", "infer.models",
                        "infer.distributed", "infer.engine", "infer.build", "infer.llm", "infer.offline")
API_SERVER_ALLOWED = ("infer.engine.config", "infer.engine.policy", "infer.engine.devices", "infer.build.core_process",
                      "infer.build.core_env", "infer.build.dp_cores", "infer.build.placement")
# the engine's settings (its policies' names, the devices "auto" picks among); starting a core; where it runs


def api_server_closure(imports: list[Import]) -> dict[str, Import | None]:
    """Every module the API server's entry modules load at import time (module-level imports, followed through the
    tree), each with the import that first reached it."""
    edges: dict[str, list[Import]] = {}
    for imp in imports:
        if not imp.in_function and not imp.type_only:
            edges.setdefault(imp.source, []).append(imp)
    reached: dict[str, Import | None] = dict.fromkeys(API_SERVER_ENTRIES)
    todo = list(API_SERVER_ENTRIES)
    while todo:
        for imp in edges.get(todo.pop(), []):
            if imp.target not in reached:
                reached[imp.target] = imp
                todo.append(imp.target)
    return reached


def test_the_api_server_loads_no_engine_code() -> None:
    """The API server process imports no torch, triton, transformers, layerzero, omniscience, runner, model or
    engine-core module: it starts in well under a second and holds no GPU library."""
    reached = api_server_closure(all_imports(SRC))
    bad = sorted((m, imp) for m, imp in reached.items() if imp is not None
                 and _under(m, *API_SERVER_FORBIDDEN) and not _under(m, *API_SERVER_ALLOWED))
    if bad:
        pytest.fail("the API server reaches engine code:\n" + "".join(f"  {m}  via {imp}\n" for m, imp in bad),
                    pytrace=False)


def test_the_api_server_modules_import_without_torch() -> None:
    """The same, as Python sees it: importing the entry modules leaves the heavy packages out of sys.modules."""
    code = (f"import sys; import {', '.join(API_SERVER_ENTRIES)}; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'triton', 'transformers', 'layerzero', "
            "'omniscience'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_model_s_sampling_defaults_are_read_without_torch() -> None:
    """Resolving the model's path (the bundled GGUF when none is named) and reading its generation config, which
    `infer serve` does before it starts the core, import no torch (the rank runner did, for the path: 2 s)."""
    code = ("import sys; from infer.cli.serve import show_sampling_defaults; "
            "from infer.engine.config import EngineConfig; show_sampling_defaults(EngineConfig(device='cpu')); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_the_cli_s_parser_and_a_node_0_launch_import_no_torch() -> None:
    """`infer --help` and the launcher's checks before the core starts read EngineConfig's defaults for the CPU and
    skip the distributed stack on node 0: no torch (~2 s of every command, and the launcher hosts API server 0)."""
    code = ("import sys; from infer.cli import build_parser; from infer.cli.nodes import headless_node; "
            "from infer.engine.config import EngineConfig; build_parser(); "
            "print(headless_node(EngineConfig(device='cpu')), 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={k: v for k, v in os.environ.items() if k != "RANK"}).stdout
    assert out.split() == ["False", "False"]
