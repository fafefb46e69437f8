"""The package's layout: its import graph (no circles, between modules or between folders; every
module in one layer and no arrow back up; no private names used across modules) and its size limits
(no module over 450 lines, no function over 60 lines of code). docs/design.md §7 draws the layers.

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
    assert "speculative.data.seqio_tasks" in graph["speculative.jobs.config"]
    assert "speculative.config.configurables" in graph["speculative.measure.memory"]


def test_no_import_circle():
    graph = import_graph()
    cycle = find_cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(cycle)
    print(f"import graph: {len(graph)} modules, depth {depth(graph)}")
    assert 0 < depth(graph) < len(graph)


def test_no_job_imports_another():
    """Each job is a command (speculative/<job>.py) over its own package (speculative/jobs/<job>/);
    they share jobs/common.py, jobs/config.py and jobs/spmd.py and no other job's modules."""
    graph = import_graph()
    commands = COMMANDS

    def job_of(module: str) -> str | None:
        name = module.removeprefix("speculative.").removeprefix("jobs.")
        head = name.split(".")[0]
        return head if head in commands else None

    crossing = [
        f"{m} imports {t}"
        for m, targets in graph.items()
        for t in sorted(targets)
        if job_of(m) and job_of(t) and job_of(m) != job_of(t)
    ]
    assert crossing == []
    assert job_of("speculative.jobs.infer.run") == job_of("speculative.infer") == "infer"
    assert job_of("speculative.jobs.common") is None


def test_no_private_names_across_modules():
    assert private_uses() == []


def test_cycle_and_depth_helpers_on_small_graphs():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert depth({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == 2


# docs/design.md §7, bottom up. A module's layer is its folder's: speculative/<folder>/... is in the
# layer that lists <folder>. Outside the folders, speculative/ holds only FLAT (at the bottom) and
# the COMMANDS users type (`python -m speculative.<command>`, at the top). A module may import its
# own layer and the layers below it only.
FLAT = ("errors", "version")
COMMANDS = (
    "infer", "benchmark", "demo", "train", "train_head", "fit_ngram", "memory", "ende_data", "fetch",
    "spec_bench", "certify",
)  # fmt: skip
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("foundation", (*FLAT, "data", "models", "parallel", "checkpoints", "vocab", "outputs")),
    ("decoding", ("decoding",)),
    ("drafts", ("drafts",)),
    ("measure", ("measure", "config")),
    ("loading", ("loading", "recipes")),
    ("jobs", ("jobs", "notebook")),
    ("commands", COMMANDS),
)  # fmt: skip


def layer_of(module: str) -> int:
    """Index in LAYERS of a speculative module (the package root itself is above every layer)."""
    if module == "speculative":
        return len(LAYERS)
    head = module.removeprefix("speculative.").split(".")[0]
    for index, (_, names) in enumerate(LAYERS):
        if head in names:
            return index
    raise AssertionError(f"{module} is in no layer of LAYERS (tests/test_import_graph.py)")


def misplaced() -> list[str]:
    """Modules outside a folder of LAYERS, top-level modules that are neither FLAT nor a command,
    and folders of LAYERS that are not there."""
    folders = {n for _, names in LAYERS for n in names} - set(FLAT) - set(COMMANDS)
    found = []
    for module in import_graph():
        parts = module.split(".")[1:]
        if len(parts) == 1 and parts[0] not in FLAT + COMMANDS and parts[0] not in folders:
            found.append(f"{module}: a top-level module that is neither FLAT nor a command")
        elif len(parts) > 1 and parts[0] not in folders:
            found.append(f"{module}: in a folder that is in no layer")
    found += [
        f"speculative/{f}/ is listed in LAYERS but is no package"
        for f in sorted(folders)
        if not (PACKAGE / f / "__init__.py").is_file()
    ]
    return found


def test_every_module_lives_in_a_listed_folder():
    assert misplaced() == []


def folder_of(module: str) -> str:
    """The folder a module lives in, for the folder-level graph ('speculative' for top level)."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 or module in _packages() else "speculative"


def _packages() -> set[str]:
    return {_module_name(p) for p in PACKAGE.rglob("__init__.py")}


def test_every_module_imports_its_layer_or_below():
    graph = import_graph()
    upward = [
        f"{m} ({LAYERS[layer_of(m)][0]}) imports {t} ({LAYERS[layer_of(t)][0]})"
        for m, targets in graph.items()
        for t in sorted(targets)
        if layer_of(t) > layer_of(m)
    ]
    assert upward == []


def test_no_folder_level_circle():
    graph = import_graph()
    folders: dict[str, set[str]] = {}
    for module, targets in graph.items():
        source = folder_of(module)
        if source == "speculative":  # top-level modules are each their own node
            source = module
        edges = folders.setdefault(source, set())
        for t in targets:
            target = folder_of(t) if folder_of(t) != "speculative" else t
            if target != source:
                edges.add(target)
                folders.setdefault(target, set())
    cycle = find_cycle(folders)
    assert cycle is None, "folder-level import circle: " + " -> ".join(cycle)


MAX_MODULE_LINES, MAX_FUNCTION_LINES = 450, 60


def code_lines(source: list[str], node: ast.AST) -> int:
    """Lines of a function's code: its docstring, blank lines and comment lines aside."""
    skip: set[int] = set()
    body = getattr(node, "body", [])
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        skip = set(range(body[0].lineno, body[0].end_lineno + 1))
    return sum(
        1
        for i in range(node.lineno, node.end_lineno + 1)
        if i not in skip and source[i - 1].strip() and not source[i - 1].strip().startswith("#")
    )


def oversized() -> list[str]:
    """Modules over MAX_MODULE_LINES and functions over MAX_FUNCTION_LINES lines of code, unless the
    module docstring gives a reason on a line starting with "Size:"."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        tree = ast.parse(text)
        if "\nSize: " in (ast.get_docstring(tree) or ""):
            continue
        lines = text.split("\n")
        name = path.relative_to(ROOT)
        if len(lines) - 1 > MAX_MODULE_LINES:
            found.append(f"{name}: {len(lines) - 1} lines")
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = code_lines(lines, node)
                if n > MAX_FUNCTION_LINES:
                    found.append(f"{name}:{node.lineno} {node.name}: {n} lines of code")
    return found


def test_no_module_or_function_over_the_size_limits():
    assert oversized() == []


def test_size_and_layer_checks_catch_violations():
    lines = ["def f():", '    """doc"""', "    # note", "", "    x = 1", "    return x"]
    assert code_lines(lines, ast.parse("\n".join(lines)).body[0]) == 3
    assert layer_of("speculative.decoding.loop") < layer_of("speculative.drafts.ngram")
    assert folder_of("speculative.drafts.ngram") == "speculative.drafts"
    assert folder_of("speculative.drafts") == "speculative.drafts"
    assert folder_of("speculative.errors") == "speculative"
    assert layer_of("speculative.decoding.sampling") < layer_of("speculative.drafts.ngram")
    assert layer_of("speculative.errors") == layer_of("speculative.data.inputs") == 0
    assert layer_of("speculative.infer") == len(LAYERS) - 1
