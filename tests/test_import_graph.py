"""The package's import graph: no circles, a finite depth, and no private names used across modules.

The graph is read from the source with `ast` (nothing is imported): every `import` and `from ...
import` anywhere in a module, at module level or inside a function, and every
`importlib.import_module("speculative....")` with a literal name, is an edge. A function-level
import still ties two modules together, so it counts as much as a top-level one.
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "speculative"


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, ast.Module]:
    return {
        _module_name(p): ast.parse(p.read_text(), filename=str(p))
        for p in sorted(PACKAGE.rglob("*.py"))
    }


def _resolve(name: str, known: set[str]) -> str | None:
    """The module `name` refers to: itself, or its longest known prefix (for `package.attr`)."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str, tree: ast.Module, known: set[str], is_package: bool):
    """Yields (imported module, local name bound to it or None) for every import in `tree`."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _resolve(alias.name, known)
                if target:
                    # `import a.b` binds `a`; `import a.b as c` binds c to a.b.
                    yield target, alias.asname
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(node, module, is_package)
            for alias in node.names:
                target = _resolve(f"{source}.{alias.name}", known)
                if target:
                    bound = alias.asname or alias.name
                    yield target, bound if target == f"{source}.{alias.name}" else None
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            target = _resolve(node.args[0].value, known)
            if target:
                yield target, None


def import_graph() -> dict[str, set[str]]:
    """{module: modules it imports}, over every module of the package."""
    trees = _modules()
    known = set(trees)
    packages = {_module_name(p) for p in PACKAGE.rglob("__init__.py")}
    return {
        name: {t for t, _ in _imports(name, tree, known, name in packages) if t != name}
        for name, tree in trees.items()
    }


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: finished
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start)
            if found:
                return found
    return None


def depth(graph: dict[str, set[str]]) -> int:
    """Edges on the longest import chain (the graph must have no circle)."""
    memo: dict[str, int] = {}

    def longest(node: str) -> int:
        if node not in memo:
            memo[node] = max((1 + longest(n) for n in graph[node]), default=0)
        return memo[node]

    return max(longest(n) for n in graph)


def private_uses() -> list[str]:
    """`module.attr` uses of another speculative module's private (single-underscore) names."""
    trees = _modules()
    known = set(trees)
    packages = {_module_name(p) for p in PACKAGE.rglob("__init__.py")}
    found = []
    for name, tree in trees.items():
        bound = {}
        for target, local in _imports(name, tree, known, name in packages):
            if local:
                bound[local] = target
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    if _private(alias.name) and _resolve(node.module, known):
                        found.append(f"{name}: from {node.module} import {alias.name}")
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in bound
                and bound[node.value.id] != name
                and _private(node.attr)
            ):
                found.append(f"{name}:{node.lineno}: {bound[node.value.id]}.{node.attr}")
    return sorted(found)


def _private(attr: str) -> bool:
    return attr.startswith("_") and not attr.startswith("__")


def test_graph_covers_the_package():
    graph = import_graph()
    assert {"speculative.decoding", "speculative.infer", "speculative.models.t5"} <= set(graph)
    assert "speculative.decoding" in graph["speculative.measure.runner"]
    # importlib and function-level imports count (both are in the package today).
    assert "speculative.seqio_tasks" in graph["speculative.job_config"]
    assert "speculative.configurables" in graph["speculative.measure.memory"]


def test_no_import_circle():
    graph = import_graph()
    cycle = find_cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(cycle)
    print(f"import graph: {len(graph)} modules, depth {depth(graph)}")
    assert 0 < depth(graph) < len(graph)


def test_no_job_imports_another():
    graph = import_graph()
    jobs = {"speculative.infer", "speculative.benchmark", "speculative.demo"}
    for job in jobs:
        assert not graph[job] & jobs, f"{job} imports {graph[job] & jobs}"


def test_no_private_names_across_modules():
    assert private_uses() == []


def test_cycle_and_depth_helpers_on_small_graphs():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert depth({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == 2
