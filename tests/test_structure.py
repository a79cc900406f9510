"""The package's shape: no import cycles at all, and one owner per trial-file name.

Imports are read wherever they are written, inside functions and `if TYPE_CHECKING:`
blocks too: an import that runs late is still a dependency a reader has to follow, and a
cycle through one is a cycle.
"""

import ast
from pathlib import Path

from orchestrator.trial_dir import SweepPaths, TrialPaths

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_DIRS = ("orchestrator", "launchers", "hydra_plugins")


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] == "launchers":  # shipped as orchestrator.launchers
        parts = ["orchestrator", *parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sources() -> list[Path]:
    return [f for d in PACKAGE_DIRS for f in ROOT.joinpath(d).rglob("*.py")]


def _graph() -> dict[str, set[str]]:
    imports = {}
    for f in _sources():
        deps = set()
        for node in ast.walk(ast.parse(f.read_text())):  # every import, at any depth
            if isinstance(node, ast.ImportFrom) and node.module:
                deps |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names}
        imports[_module(f)] = deps
    return {m: {d for d in deps if d in imports and d != m} for m, deps in imports.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    state, cycles = {}, []

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for dep in sorted(graph[module]):
            if state.get(dep) == "open":
                cycles.append(path[path.index(dep):] + [dep])
            elif dep not in state:
                visit(dep, path + [dep])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    return cycles


def test_no_import_cycles_even_through_imports_inside_functions():
    graph = _graph()
    assert len(graph) > 40 and _cycles(graph) == []


def test_the_cycle_finder_sees_a_cycle_through_a_function_level_import():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c", "a"]]


def _owned_file_names() -> set[str]:
    """The names of the files (and the sweep's SLURM log folder) TrialPaths and SweepPaths own."""
    names = set()
    for cls in (TrialPaths, SweepPaths):
        paths = cls(Path("/x"))
        for attr, value in vars(cls).items():
            if isinstance(value, property):
                names.add(getattr(paths, attr).name)
    names |= {p.name for p in TrialPaths(Path("/x")).hydra_files(".hydra").values()}
    names |= {TrialPaths(Path("/x")).rank_log(0).name, TrialPaths(Path("/x")).rank_error(0).name}
    return {n for n in names if "." in n or "-" in n}  # file names; bare folder names are ordinary words


def test_every_trial_file_name_is_written_in_trial_dir_only():
    owned = _owned_file_names()
    assert {"result.json", "claim.json", "tune.json", "multirun.yaml", "latest.json", "slurm-logs"} <= owned
    found = []
    for f in _sources():
        if f.name == "trial_dir.py":
            continue
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in owned:
                found.append(f"{f.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    assert found == [], "name these through TrialPaths / SweepPaths:\n" + "\n".join(found)
