"""The package's shape: no import cycles at all, and one owner per trial-file name.

Imports are read wherever they are written, inside functions and `if TYPE_CHECKING:`
blocks too: an import that runs late is still a dependency a reader has to follow, and a
cycle through one is a cycle.
"""

import ast
from pathlib import Path

from orchestrator.records.trial_dir import SweepPaths, TrialPaths

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_DIRS = ("orchestrator", "hydra_plugins")


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sources() -> list[Path]:
    return [f for d in PACKAGE_DIRS for f in ROOT.joinpath(d).rglob("*.py")]


MODULES = {_module(f) for f in _sources()}


def _graph() -> dict[str, set[str]]:
    imports: dict[str, set[str]] = {}
    for f in _sources():
        deps = set()
        for node in ast.walk(ast.parse(f.read_text())):  # every import, at any depth
            if isinstance(node, ast.ImportFrom) and node.module:
                # `from pkg import module` depends on the module; its package's __init__ is no dependency
                deps |= {f"{node.module}.{a.name}" for a in node.names}
                deps |= {node.module} if any(f"{node.module}.{a.name}" not in MODULES for a in node.names) else set()
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
                cycles.append(path[path.index(dep) :] + [dep])
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
PLAN_MAY_IMPORT = ("orchestrator.plan", "orchestrator.config", "orchestrator.core.errors", "orchestrator.core.redact")
PLAN_TYPES_ONLY = {"orchestrator.spec", "orchestrator.spec.TrialSpec"}
# what reads a file, the environment or the clock, or starts a process
IMPURE_MODULES = {"os", "subprocess", "socket", "time", "shutil", "multiprocessing", "pathlib", "io", "tempfile"}
IMPURE_CALLS = {
    "open",
    "read_text",
    "read_bytes",
    "write_text",
    "stat",
    "getenv",
    "environ",
    "Popen",
    "run",
    "system",
    "cpu_count",
    "gethostname",
    "time",
    "perf_counter",
    "monotonic",
}


def _type_checking_imports(tree: ast.AST) -> set[int]:
    """Line numbers of the imports inside `if TYPE_CHECKING:` blocks."""
    return {
        n.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING"
        for n in ast.walk(node)
        if isinstance(n, (ast.Import, ast.ImportFrom))
    }


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
            names = (
                [node.module]
                if isinstance(node, ast.ImportFrom) and node.module
                else [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else []
            )
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
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, pkgutil, importlib, orchestrator.plan as p; "
            "[importlib.import_module(f'orchestrator.plan.{m.name}') for m in pkgutil.iter_modules(p.__path__)]; "
            "print(' '.join(sorted(sys.modules)))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    packages = {"orchestrator", "orchestrator.core"}  # their __init__ holds a docstring alone
    outside = [
        m for m in loaded if m.startswith("orchestrator") and m not in packages and not m.startswith(PLAN_MAY_IMPORT)
    ]
    assert outside == [] and "torch" not in loaded and "numpy" not in loaded, outside


# The layers, top to bottom (docs/architecture.md, "The layers"): a module may import its
# own layer and those below it, never one above. A module belongs to the longest prefix
# named; `orchestrator` alone is the package's root (core).
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("entry points", ("orchestrator.cli", "orchestrator.commands", "orchestrator.__main__", "hydra_plugins")),
    ("analysis", ("orchestrator.analysis",)),
    ("orchestration", ("orchestrator.run",)),
    ("launch", ("orchestrator.launchers",)),
    ("the ranks", ("orchestrator.workload",)),
    ("translate", ("orchestrator.translate",)),
    ("measure", ("orchestrator.measure",)),
    ("model", ("orchestrator.workload.model", "orchestrator.workload.transformers_compat")),
    ("a trial's result", ("orchestrator.records.results",)),
    (
        "what a trial is",
        (
            "orchestrator.spec",
            "orchestrator.validation",
            "orchestrator.hydra_glue",
            "orchestrator.token_file",
            "orchestrator.network_table",
            "orchestrator.deepspeed_sections",
            "orchestrator.hardware_presets",
            "orchestrator.machine",
        ),
    ),
    ("the plan", ("orchestrator.plan",)),
    ("the schema", ("orchestrator.config",)),
    ("a trial's files", ("orchestrator.records.trial_dir", "orchestrator.records.trial_meta")),
    ("core", ("orchestrator", "orchestrator.core")),
)
# The imports that run the wrong way, each with where it goes: none is left (the last, the SLURM
# node's re-plan, is a process launch starts by its module's name, run/node_plan.py). An entry
# here must name its reason; one that is fixed must leave.
WRONG_WAY: dict[tuple[str, str], str] = {}
# The plan reads a TrialSpec's fields, and names its type: an `if TYPE_CHECKING:` import of it.
TYPE_ONLY = {("orchestrator.plan", "orchestrator.spec")}


def layer_of(module: str) -> int:
    prefixes = [
        (len(p), i) for i, (_, names) in enumerate(LAYERS) for p in names if module == p or module.startswith(p + ".")
    ]
    assert prefixes, f"{module} is in no layer: add it to LAYERS"
    return max(prefixes)[1]


def wrong_way(graph: dict[str, set[str]], typed: set[tuple[str, str]] = frozenset()) -> set[tuple[str, str]]:
    """(importer, imported) of every import from a lower layer up; `typed`: the type-only ones."""
    return {
        (m, d)
        for m, deps in graph.items()
        for d in deps
        if layer_of(d) < layer_of(m)
        and not ((m, d) in typed and any(m.startswith(a) and d.startswith(b) for a, b in TYPE_ONLY))
    }


def _typed_imports() -> set[tuple[str, str]]:
    pairs = set()
    for f in _sources():
        tree = ast.parse(f.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
                pairs |= {(_module(f), n.module) for n in ast.walk(node) if isinstance(n, ast.ImportFrom) and n.module}
    return pairs


def test_every_import_runs_down_the_layers():
    found = wrong_way(_graph(), _typed_imports())
    assert found - set(WRONG_WAY) == set(), "imports up the layers:\n" + "\n".join(
        f"{m} -> {d}" for m, d in sorted(found - set(WRONG_WAY))
    )
    assert set(WRONG_WAY) - found == set(), f"fixed, so take them out of WRONG_WAY: {sorted(set(WRONG_WAY) - found)}"


def test_the_layer_check_sees_an_import_up_the_layers_and_a_type_only_one_allowed():
    graph = {"orchestrator.plan.memory": {"orchestrator.measure.hardware", "orchestrator.spec", "orchestrator.config"}}
    assert wrong_way(graph, {("orchestrator.plan.memory", "orchestrator.spec")}) == {
        ("orchestrator.plan.memory", "orchestrator.measure.hardware")
    }
    assert wrong_way(graph) == {
        ("orchestrator.plan.memory", "orchestrator.measure.hardware"),
        ("orchestrator.plan.memory", "orchestrator.spec"),
    }


def test_a_precisions_torch_dtype_is_decided_in_one_place():
    """bf16 / fp16 / fp32 -> torch dtype was four dicts (the ranks, FSDP2, the engine's timing,
    the CPU's peak): workload/model.torch_dtype is the one."""
    owners = []
    for f in _sources():
        for node in ast.walk(ast.parse(f.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and node.attr in ("bfloat16", "float16")
                and getattr(node.value, "id", "") == "torch"
            ):
                owners.append(f"{f.relative_to(ROOT)}:{node.lineno}")
    assert {o.split(":")[0] for o in owners} == {"orchestrator/workload/model.py"}, owners


def test_bytes_per_gib_are_config_gib_alone():
    """2**30 was written beside the GIB that owns it (config.GIB).

    A unit table of sizes (K, M, G, T) is no second owner."""
    written = [
        f"{f.relative_to(ROOT)}:{node.lineno}"
        for f in _sources()
        for node in ast.walk(ast.parse(f.read_text()))
        if isinstance(node, ast.BinOp)
        and isinstance(node.op, ast.Pow)
        and getattr(node.left, "value", None) == 2
        and getattr(node.right, "value", None) == 30
    ]
    assert [w.split(":")[0] for w in written] == ["orchestrator/config.py", "orchestrator/plan/host_memory.py"], written


def test_a_figure_read_from_a_record_is_checked_by_files_real_number_alone():
    """ "A finite number, not a bool" was written out in seven readers (report, calibrate, tune,
    results, tracking, the caches): files.real_number is the one. hardware_presets' check of a preset keeps
    infinity apart, to say the nearest valid value of it."""
    found = []
    for f in _sources():
        text = f.read_text()
        for line in text.splitlines():
            if "(int, float)) and not isinstance(" in line:
                found.append(f"{f.relative_to(ROOT)}")
    assert sorted(found) == ["orchestrator/core/files.py", "orchestrator/hardware_presets.py"], found


def _reads_of(tree: ast.AST, attr: str) -> list[int]:
    """Lines where a file is read from a TrialPaths path named `attr` (`.result`, `.meta`):
    passed to a reader, directly or through a name that last held one, or read by its own
    `read_text()`."""
    lines = [
        n.lineno
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr in ("read_text", "open")
        and isinstance(n.func.value, ast.Attribute)
        and n.func.value.attr == attr
    ]
    for func in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
        held = sorted(
            (n.lineno, t.id, isinstance(n.value, ast.Attribute) and n.value.attr == attr)
            for n in ast.walk(func)
            if isinstance(n, ast.Assign)
            for t in n.targets
            if isinstance(t, ast.Name)
        )
        for call in (n for n in ast.walk(func) if isinstance(n, ast.Call) and n.args):
            if getattr(call.func, "id", getattr(call.func, "attr", "")) not in ("read_json", "read_text", "open"):
                continue
            arg = call.args[0]
            if isinstance(arg, ast.Attribute) and arg.attr == attr:
                lines.append(call.lineno)
            elif isinstance(arg, ast.Name):
                last = [is_result for line, name, is_result in held if name == arg.id and line <= call.lineno]
                if last and last[-1]:
                    lines.append(call.lineno)
    return lines


def test_result_json_is_read_through_results_read_result_alone():
    """result.json was read in five places (report, calibrate, tune, the sweep's outcome, a
    trial's state), each with its own idea of a readable one: results.read_result is the one."""
    readers = {
        f"{f.relative_to(ROOT)}:{line}" for f in _sources() for line in _reads_of(ast.parse(f.read_text()), "result")
    }
    assert {r.split(":")[0] for r in readers} == {"orchestrator/records/results.py"}, readers
    old = "def r(d):\n    path = TrialPaths(d).result\n    return json.loads(read_text(path))\n"
    assert _reads_of(ast.parse(old), "result") == [3]
    assert _reads_of(ast.parse("def r(d):\n    return TrialPaths(d).result.read_text()\n"), "result") == [2]


def test_trial_json_is_read_through_records_trial_meta_alone():
    """trial.json was written in translate/ and read in four places with their own idea of its
    keys (spec, a rank, the report, a resumed sweep): records/trial_meta.py owns them."""
    readers = {f"{f.relative_to(ROOT)}:{n}" for f in _sources() for n in _reads_of(ast.parse(f.read_text()), "meta")}
    assert {r.split(":")[0] for r in readers} == {"orchestrator/records/trial_meta.py"}, readers
    writers = [
        f"{f.relative_to(ROOT)}"
        for f in _sources()
        if "paths.meta:" in f.read_text() and "TrialMeta(" not in f.read_text()
    ]
    assert writers == [], writers


def test_an_overrides_key_is_read_by_hydra_registry_override_key_alone():
    """`+key=v`, `++key=v`, `~key`: the prefix was stripped by hand in ten places."""
    from orchestrator.hydra_glue.hydra_registry import override_key

    assert [override_key(o) for o in ("+data.x=1", "++zero.stage=2", "~model.vocab", "parallel.dp=2,4")] == [
        "data.x",
        "zero.stage",
        "model.vocab",
        "parallel.dp",
    ]
    by_hand = [
        f"{f.relative_to(ROOT)}:{n}"
        for f in _sources()
        for n, line in enumerate(f.read_text().splitlines(), 1)
        if 'lstrip("+' in line
    ]
    assert [w.split(":")[0] for w in by_hand] == ["orchestrator/hydra_glue/hydra_registry.py"], by_hand


def test_a_calibrated_preset_is_written_by_hardware_presets_alone():
    """NAME-calibrated.yaml had two writers (calibrate's fit, and calibrate --links without the
    lock): hardware_presets.write_calibrated_preset is the one that writes the file."""
    writers = [
        f"{f.relative_to(ROOT)}:{n}"
        for f in _sources()
        for n, line in enumerate(f.read_text().splitlines(), 1)
        if "calibrated_name(" in line and ".yaml" in line
    ]
    assert writers and {w.split(":")[0] for w in writers} == {"orchestrator/hardware_presets.py"}, writers


# What a test under tests/unit/ may not take: the run-wide trial and the SLURM cluster are the
# end-to-end files' (tests/, grouped by the fixtures they share).
COSTLY_FIXTURES = {"default_trial", "slurm_cluster"}


def test_the_unit_tests_mirror_the_package_and_take_no_costly_fixture():
    """tests/unit/PKG/test_*.py tests orchestrator/PKG: a reader finds a module's tests by its path."""
    unit = ROOT / "tests" / "unit"
    folders = {p.parent.relative_to(unit) for p in unit.rglob("test_*.py")}
    assert folders and all((ROOT / "orchestrator" / f).is_dir() for f in folders), folders
    costly = [
        f"{f.relative_to(ROOT)}:{node.lineno}"
        for f in unit.rglob("test_*.py")
        for node in ast.walk(ast.parse(f.read_text()))
        if isinstance(node, ast.FunctionDef) and {a.arg for a in node.args.args} & COSTLY_FIXTURES
    ]
    assert costly == [], costly


def test_gib_is_imported_from_config_its_owner():
    """config.GIB reached most modules through plan.memory and tune.space, which imported it: one
    import path to the owner, so a reader finds where the unit is decided."""
    elsewhere = [
        f"{f.relative_to(ROOT)}:{node.lineno}"
        for f in _sources()
        for node in ast.walk(ast.parse(f.read_text()))
        if isinstance(node, ast.ImportFrom)
        and node.module != "orchestrator.config"
        and any(a.name == "GIB" for a in node.names)
    ]
    assert elsewhere == [], elsewhere
