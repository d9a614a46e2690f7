"""The package's dependency order, as docs/design.md's module table states it, checked on the source.

Each package may import only packages before it in ``ORDER`` (and itself); no import-time cycle
between modules (importing ``a.b.c`` runs ``a/__init__`` and ``a/b/__init__`` first, so those
count); a function-local import of one of our modules is allowed only when that module pulls in
a heavy or optional third-party library (deferred to keep ``agentrl --help`` and Ray-free code
paths fast, and optional benchmarks optional)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "agentrl"

# Lower layers first. A package may import itself and anything listed before it.
ORDER = ["common", "api", "llm", "tasks", "envs", "agent", "rewards", "algos", "rods", "config", "telemetry", "models",
         "weight_sync", "engines", "methods", "planning", "rollout", "learning", "checkpointing", "driver",
         "cli", "__main__"]
HEAVY = {"torch", "vllm", "deepspeed", "transformers", "ray", "openai", "matplotlib", "pyarrow", "bfcl_eval", "tau2",
         "safetensors", "tensorboard", "tokenizers", "gguf", "numpy"}
# our modules that load optional benchmark packages by name (importlib), invisible to the AST
OPTIONAL = ("agentrl.envs.tau2", "agentrl.envs.bfcl")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(tree: ast.AST, module: str, is_pkg: bool) -> list[tuple[str, bool]]:
    """(imported module, at top level?) for every import in ``tree``."""
    top = set()
    for node in getattr(tree, "body", []):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            top.add(id(node))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, id(node) in top) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            name = node.module or ""
            if node.level:
                base = module.split(".")[: len(module.split(".")) - node.level + (1 if is_pkg else 0)]
                name = ".".join(base + ([name] if name else []))
            if not name:
                continue
            out.append((name, id(node) in top))
            # `from agentrl.x import y` may import the submodule agentrl.x.y
            out += [(f"{name}.{a.name}", id(node) in top) for a in node.names]
    return out


def _graph() -> dict[str, list[tuple[str, bool]]]:
    graph = {}
    for path in sorted(PKG.rglob("*.py")):
        mod = _module_name(path)
        graph[mod] = _imports(ast.parse(path.read_text()), mod, path.name == "__init__.py")
    return {m: [(t, top) for t, top in deps if t in _known(graph) or not t.startswith("agentrl")] for m, deps in graph.items()}


def _known(graph):
    return set(graph)


GRAPH = _graph()


def _package(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_the_order_is_the_design_module_table():
    """docs/design.md's module table ("Packages") lists the packages in this order (lower layers first)."""
    import re

    design = (PKG.parent / "docs" / "design.md").read_text(encoding="utf-8")
    table = design[design.index("### Packages"):design.index("## 2. Data contracts")]
    rows = [re.sub(r"\.py$", "", name) for name in re.findall(r"^\| `([a-z_.]+)` \|", table, flags=re.M)]
    assert rows == [m for m in ORDER if m != "__main__"]


def test_every_package_has_a_layer():
    packages = {_package(m) for m in GRAPH} - {"__init__"}
    assert packages <= set(ORDER), f"packages missing from ORDER: {sorted(packages - set(ORDER))}"


def test_packages_import_only_lower_layers():
    bad = []
    for mod, deps in GRAPH.items():
        src = _package(mod)
        if src == "__init__":
            continue
        for target, _ in deps:
            if target.startswith("agentrl.") and ORDER.index(_package(target)) > ORDER.index(src):
                bad.append(f"{mod} imports {target}")
    assert not bad, "imports against the layer order:\n" + "\n".join(sorted(set(bad)))


def _with_parents(target: str) -> list[str]:
    parts = target.split(".")
    return [".".join(parts[:i]) for i in range(2, len(parts) + 1)]


def test_no_import_time_cycles():
    edges = {m: sorted({p for t, top in deps if top and t in GRAPH for p in _with_parents(t)
                        if p in GRAPH and p != m and not m.startswith(p + ".")})
             for m, deps in GRAPH.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for t in edges[m]:
            if state.get(t) == 1:
                pytest.fail("import cycle: " + " -> ".join(stack[stack.index(t):] + [t]))
            if t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m)


def test_no_import_circle_at_all():
    """Not even through a function-local import: a module that needs one above it at call time is
    a circle in the design, whichever import runs first."""
    edges = {m: {p for t, _ in deps if t in GRAPH for p in _with_parents(t)
                 if p in GRAPH and p != m and not m.startswith(p + ".")} for m, deps in GRAPH.items()}
    reach = {}

    def reachable(m):  # every module m leads to (iterative: the graph has hundreds of modules)
        if m not in reach:
            seen, todo = set(), list(edges[m])
            while todo:
                t = todo.pop()
                if t not in seen:
                    seen.add(t)
                    todo.extend(edges[t])
            reach[m] = seen
        return reach[m]

    circles = sorted({tuple(sorted(n for n in reachable(m) if m in reachable(n))) for m in GRAPH if m in reachable(m)})
    assert not circles, "import circles (function-local imports included):\n" + "\n".join(map(str, circles))


def _heavy(mod: str, seen: frozenset = frozenset()) -> bool:
    """Whether importing ``mod`` (or calling into it) loads a heavy library: it imports one, at
    the top or inside a function, or one of our modules it imports at the top does."""
    if mod.startswith(OPTIONAL):
        return True
    for target, top in GRAPH.get(mod, []):
        if target.split(".")[0] in HEAVY:
            return True
        if top and target in GRAPH and target not in seen and target != mod and _heavy(target, seen | {mod}):
            return True
    return False


def test_function_local_imports_only_defer_heavy_libraries():
    bad = [f"{mod}: {target}" for mod, deps in GRAPH.items() for target, top in deps
           if not top and target in GRAPH and not _heavy(target) and not mod.startswith(target)]
    assert not bad, "function-local imports of light modules (import them at the top):\n" + "\n".join(sorted(set(bad)))


# packages that may name a research method: the method's own, and the config tree (its sections,
# checked without torch or Ray)
METHOD_HOMES = {"rspo": ("methods/rspo/", "config/")}


@pytest.mark.parametrize("method", sorted(METHOD_HOMES))
def test_methods_are_named_only_in_their_packages(method):
    """The generic learner, losses, scheduler, cluster and weight sync reach a method only through
    its hooks (agentrl/methods/base.py), so no other module names it."""
    bad = [f"{path.relative_to(PKG)}:{n}" for path in sorted(PKG.rglob("*.py"))
           if not str(path.relative_to(PKG)).startswith(METHOD_HOMES[method])
           for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if method in line.lower()]
    assert not bad, f"{method} named outside {METHOD_HOMES[method]}:\n" + "\n".join(bad)
