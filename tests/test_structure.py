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


# What plan/ may import: itself, the config's schema, the error classes (and the masking
# they use). Lazy imports and `if TYPE_CHECKING:` blocks are read too; a type-only import
# of the TrialSpec is the one exception (the plan reads a spec's fields, it builds none).
PLAN_MAY_IMPORT = ("orchestrator.plan", "orchestrator.config", "orchestrator.errors", "orchestrator.redact")
PLAN_TYPES_ONLY = {"orchestrator.spec", "orchestrator.spec.TrialSpec"}
# what reads a file, the environment or the clock, or starts a process
IMPURE_MODULES = {"os", "subprocess", "socket", "time", "shutil", "multiprocessing", "pathlib", "io", "tempfile"}
IMPURE_CALLS = {"open", "read_text", "read_bytes", "write_text", "stat", "getenv", "environ", "Popen", "run",
                "system", "cpu_count", "gethostname", "time", "perf_counter", "monotonic"}


def _type_checking_imports(tree: ast.AST) -> set[int]:
    """Line numbers of the imports inside `if TYPE_CHECKING:` blocks."""
    return {n.lineno for node in ast.walk(tree) if isinstance(node, ast.If) and getattr(node.test, "id", "") ==
            "TYPE_CHECKING" for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom))}


def test_the_plan_is_a_pure_function_its_package_imports_no_measurement_and_reads_nothing():
    """plan/ computes from the trial, the machine's facts and what was measured (plan/inputs.py):
    it imports nothing that measures, launches or reads (hardware, kernel timing, links,
    torch, subprocess), calls nothing that reads a file or the environment, and importing
    it loads nothing else of the package."""
    import subprocess
    import sys

    wrong = []
    for f in sorted(ROOT.joinpath("orchestrator", "plan").rglob("*.py")):
        tree = ast.parse(f.read_text())
        typed = _type_checking_imports(tree)
        for node in ast.walk(tree):
            names = ([node.module] if isinstance(node, ast.ImportFrom) and node.module else
                     [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            for name in names:
                top = name.split(".")[0]
                if name.startswith(PLAN_MAY_IMPORT) or top in sys.stdlib_module_names and top not in IMPURE_MODULES:
                    continue
                if name in PLAN_TYPES_ONLY and node.lineno in typed:
                    continue
                wrong.append(f"{f.relative_to(ROOT)}:{node.lineno}: imports {name}")
            if isinstance(node, ast.Call):
                called = getattr(node.func, "attr", getattr(node.func, "id", ""))
                if called in IMPURE_CALLS:
                    wrong.append(f"{f.relative_to(ROOT)}:{node.lineno}: calls {called}")
    assert wrong == [], "\n".join(wrong)
    loaded = subprocess.run([sys.executable, "-c", "import sys, pkgutil, importlib, orchestrator.plan as p; "
                             "[importlib.import_module(f'orchestrator.plan.{m.name}') for m in pkgutil.iter_modules(p.__path__)]; "
                             "print(' '.join(sorted(sys.modules)))"], capture_output=True, text=True, check=True).stdout.split()
    outside = [m for m in loaded if m.startswith("orchestrator") and m != "orchestrator" and not m.startswith(PLAN_MAY_IMPORT)]
    assert outside == [] and "torch" not in loaded and "numpy" not in loaded, outside
