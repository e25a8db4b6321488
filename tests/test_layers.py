"""The package's layers point down only, and no modules import each other in a circle.

Each folder is one responsibility (`../shared/DESIGN.md`); this table is the order, top to bottom. A module may
import from its own layer or any layer below it, never above: hardware facts, checkpoint IO and RNG live in utils/
(any layer may use them), the hybrid engine's weight sync reads training weights through rollout.base.WeightSource
instead of importing engine/. Every import counts, including ones inside functions and under TYPE_CHECKING: a
lazy import is still a dependency. A new upward import or circle fails here with the modules named.
"""

import ast
import pathlib

import rlcore

LAYERS = [  # top to bottom
    ("entry points", ("rlcore.train", "rlcore.train_rm", "rlcore.train_sft", "rlcore.cli")),
    ("trainer loops", ("rlcore.trainer",)),
    ("telemetry", ("rlcore.telemetry",)),
    ("workers", ("rlcore.workers",)),
    ("training engines", ("rlcore.engine",)),
    ("plans", ("rlcore.plan",)),  # the planner reads each engine's own terms (rlcore.rollout.sizing)
    ("rollout engines", ("rlcore.rollout",)),
    ("single controller", ("rlcore.controller",)),
    ("algorithms and rewards", ("rlcore.algos", "rlcore.reward", "rlcore.tools")),
    ("data", ("rlcore.data",)),
    ("models", ("rlcore.models",)),
    ("model families", ("rlcore.families",)),
    ("config", ("rlcore.config",)),
    ("batch type", ("rlcore.protocol",)),
    ("utils", ("rlcore.utils", "rlcore")),
]


def module_imports() -> dict[str, set[str]]:
    """rlcore module -> the rlcore modules it imports (a `from pkg import name` of a submodule counts as that module)."""
    root = pathlib.Path(rlcore.__file__).parent
    modules = {}
    for path in root.rglob("*.py"):
        parts = ("rlcore", *path.relative_to(root).with_suffix("").parts)
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in modules.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name.startswith("rlcore")}
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("rlcore"):
                deps |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module for a in node.names}
        graph[name] = {d for d in deps if d in modules and d != name}
    return graph


def layer_of(module: str) -> int:
    best = max((len(p), i) for i, (_, prefixes) in enumerate(LAYERS) for p in prefixes if module == p or module.startswith(p + "."))
    return best[1]


def test_no_import_points_up_a_layer():
    upward = [f"{m} ({LAYERS[layer_of(m)][0]}) imports {d} ({LAYERS[layer_of(d)][0]})"
              for m, deps in module_imports().items() for d in sorted(deps) if layer_of(d) < layer_of(m)]
    assert not upward, "upward imports:\n" + "\n".join(upward)


def test_no_modules_import_each_other_in_a_circle():
    graph = module_imports()
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v):  # Tarjan's strongly connected components
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
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not cycles, f"import circles: {cycles}"
