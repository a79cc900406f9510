"""The package's shape: no import cycles between its modules (module-level imports)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] == "launchers":  # shipped as orchestrator.launchers
        parts = ["orchestrator", *parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _graph() -> dict[str, set[str]]:
    files = [*ROOT.joinpath("orchestrator").rglob("*.py"), *ROOT.joinpath("launchers").rglob("*.py"),
             *ROOT.joinpath("hydra_plugins").rglob("*.py")]
    imports = {}
    for f in files:
        deps = set()
        for node in ast.parse(f.read_text()).body:  # module level: a function's import runs later
            if isinstance(node, ast.ImportFrom) and node.module:
                deps |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names}
        imports[_module(f)] = deps
    return {m: {d for d in deps if d in imports and d != m} for m, deps in imports.items()}


def test_no_import_cycles():
    graph, state, cycles = _graph(), {}, []

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for dep in graph[module]:
            if state.get(dep) == "open":
                cycles.append(path[path.index(dep):] + [dep])
            elif dep not in state:
                visit(dep, path + [dep])
        state[module] = "done"

    for module in graph:
        if module not in state:
            visit(module, [module])
    assert len(graph) > 30 and cycles == []
