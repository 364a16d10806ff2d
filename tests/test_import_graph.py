"""pytest_devplug has no import cycles, not even ones hidden in a function-local or TYPE_CHECKING import.

A cycle dodged by a late import still couples the two modules both ways (and breaks as soon as someone hoists the
import), so the graph here is built from the AST of every module and counts every import statement wherever it is:
module level, inside functions, under ``if TYPE_CHECKING:``, relative or absolute, and ``from pkg import sub``
where ``sub`` is a submodule. An edge goes to the module an import names, not to its parent packages (importing
``a.b.c`` runs ``a/__init__`` too, but counting that would make every package's ``__init__`` that imports one of
its submodules a "cycle" with nothing to fix).
"""

from __future__ import annotations

import ast
from collections import deque
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import pytest

PACKAGE = "pytest_devplug"
PACKAGE_DIR = Path(__file__).resolve().parents[1] / "src" / PACKAGE


@dataclass(frozen=True)
class Source:
    """One module's text, and whether it is a package's ``__init__`` (relative imports resolve from it)."""

    text: str
    is_package: bool = False


# module -> imported module -> line numbers of the import statements
Graph = dict[str, dict[str, list[int]]]


def package_sources(root: Path = PACKAGE_DIR, package: str = PACKAGE) -> dict[str, Source]:
    """Every module under ``root`` by dotted name."""
    sources: dict[str, Source] = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        sources[".".join([package, *parts])] = Source(path.read_text(encoding="utf-8"), is_package)
    return sources


def _resolve_from(module: str, source: Source, node: ast.ImportFrom) -> str:
    """The absolute module a ``from ... import`` names (``from .x import y`` in ``a.b`` is ``a.x``)."""
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    if not source.is_package:
        base.pop()
    if node.level > 1:
        base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imported(module: str, source: Source, known: set[str]) -> list[tuple[str, int]]:
    """(imported module, line) for every import in ``module``, kept only when it names one of ``known``."""
    found: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(source.text, filename=module)):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve_from(module, source, node)
            for alias in node.names:
                # `from pkg import sub` imports the submodule pkg.sub; `from mod import name` imports mod.
                submodule = f"{base}.{alias.name}"
                found.append((submodule if submodule in known else base, node.lineno))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                found.append((node.args[0].value, node.lineno))
    return [(target, line) for target, line in found if target in known]


def import_graph(sources: dict[str, Source]) -> Graph:
    """Edges between the given modules, each with the lines of the imports that make it."""
    known = set(sources)
    graph: Graph = {module: {} for module in sources}
    for module, source in sources.items():
        for target, line in _imported(module, source, known):
            lines = graph[module].setdefault(target, [])
            if line not in lines:
                lines.append(line)
    return graph


def _strongly_connected(graph: Graph) -> list[list[str]]:
    """Tarjan's components (iterative), as sorted lists."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for succ in successors:
                if succ not in index:
                    index[succ] = low[succ] = len(index)
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(graph[succ]))))
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component: list[str] = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    components.append(sorted(component))
    return components


def _shortest_path(graph: Graph, start: str, goal: str, within: set[str]) -> list[str]:
    """Breadth-first path start -> goal inside one component (it exists: they are strongly connected)."""
    came_from: dict[str, str] = {start: start}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        if node == goal:
            break
        for succ in sorted(graph[node]):
            if succ in within and succ not in came_from:
                came_from[succ] = node
                queue.append(succ)
    path = [goal]
    while path[-1] != start:
        path.append(came_from[path[-1]])
    return path[::-1]


def import_cycles(graph: Graph) -> list[list[str]]:
    """Cycles that together use every edge lying on any cycle: for each such edge u -> v, u -> v -> ... -> u.

    Listing every elementary cycle can explode; this set is small and still shows each import to break.
    Each cycle starts at its smallest module (so rotations are one cycle) and ends where it started.
    """
    cycles: set[tuple[str, ...]] = set()
    for component in _strongly_connected(graph):
        members = set(component)
        for node in component:
            for succ in graph[node]:
                if succ not in members:
                    continue
                loop = [node] if succ == node else [node, *_shortest_path(graph, succ, node, members)[:-1]]
                turn = loop.index(min(loop))
                rotated = loop[turn:] + loop[:turn]
                cycles.add((*rotated, rotated[0]))
    return [list(cycle) for cycle in sorted(cycles)]


def describe(graph: Graph, cycle: list[str]) -> str:
    """``a -> b -> a`` with the import lines of each step, so the failure says what to change."""
    steps = [f"{src} imports {dst} (line {', '.join(map(str, graph[src][dst]))})" for src, dst in pairwise(cycle)]
    return " -> ".join(cycle) + "\n      " + "\n      ".join(steps)


def test_package_has_no_import_cycles() -> None:
    graph = import_graph(package_sources())
    assert len(graph) > 50, f"found only {len(graph)} modules under {PACKAGE_DIR}: is the path right?"
    cycles = import_cycles(graph)
    assert not cycles, f"{len(cycles)} import cycle(s) in {PACKAGE}:\n" + "\n".join(
        f"  {describe(graph, cycle)}" for cycle in cycles
    )


#: The modules outside ``sim/`` that may import the embedded kubelet: its backend, the backend's DRA side, and the
#: factory that picks a backend. The real-cluster side, the control plane and everything a user imports read the
#: kubelet's rules from ``kubeletmodel`` and run processes through ``procs``, never through ``sim``.
SIM_IMPORTERS = {f"{PACKAGE}.backends", f"{PACKAGE}.backends.sim", f"{PACKAGE}.backends.sim_dra"}


def sim_importers(graph: Graph) -> dict[str, list[str]]:
    """Modules outside ``sim`` importing a ``sim`` module, with what they import."""
    sim = f"{PACKAGE}.sim"
    return {
        module: sorted(t for t in targets if t == sim or t.startswith(sim + "."))
        for module, targets in graph.items()
        if not (module == sim or module.startswith(sim + "."))
        and any(t == sim or t.startswith(sim + ".") for t in targets)
    }


def test_only_the_sim_backend_imports_the_embedded_kubelet() -> None:
    found = sim_importers(import_graph(package_sources()))
    stray = {m: t for m, t in found.items() if m not in SIM_IMPORTERS}
    assert not stray, (
        f"modules outside sim/ importing it (the kubelet's rules are in kubeletmodel, processes in procs): {stray}"
    )
    gone = SIM_IMPORTERS - set(found) - {f"{PACKAGE}.backends"}
    assert not gone, f"no longer import sim: {sorted(gone)}; drop them from SIM_IMPORTERS"


# The checker itself: each kind of import makes an edge, so a cycle through any of them is found.
HIDDEN = {
    "top level": "from p.b import thing\n",
    "absolute module": "import p.b\n",
    "function local": "def f() -> None:\n    from p.b import thing\n",
    "TYPE_CHECKING": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from p.b import Thing\n",
    "relative": "from .b import thing\n",
    "relative package": "from . import b\n",
    "package submodule": "from p import b as bee\n",
    "import_module": "import importlib\nimportlib.import_module('p.b')\n",
}


@pytest.mark.parametrize("kind", sorted(HIDDEN))
def test_cycle_through_each_import_kind_is_found(kind: str) -> None:
    sources = {
        "p": Source("", is_package=True),
        "p.a": Source(HIDDEN[kind]),
        "p.b": Source("def g() -> None:\n    from .a import other\n"),
        "p.c": Source("import p.a\nimport os\n"),
    }
    graph = import_graph(sources)
    assert import_cycles(graph) == [["p.a", "p.b", "p.a"]], graph


def test_relative_import_from_a_package_init_resolves_inside_it() -> None:
    sources = {
        "p": Source("", is_package=True),
        "p.s": Source("from .m import x\n", is_package=True),
        "p.s.m": Source("from .. import s\n"),
        "p.m": Source(""),
    }
    graph = import_graph(sources)
    assert graph["p.s"] == {"p.s.m": [1]} and graph["p.s.m"] == {"p.s": [1]}
    assert import_cycles(graph) == [["p.s", "p.s.m", "p.s"]]


def test_every_cycle_edge_is_reported_and_acyclic_graph_passes() -> None:
    graph: Graph = {"a": {"b": [1], "c": [2]}, "b": {"a": [3]}, "c": {"b": [4]}, "d": {"a": [5]}}
    assert import_cycles(graph) == [["a", "b", "a"], ["a", "c", "b", "a"]]
    assert "a imports c (line 2)" in describe(graph, ["a", "c", "b", "a"])
    del graph["b"]["a"]
    assert import_cycles(graph) == []
