"""How long planning takes: a large sweep per point, and a new shape whole.

    .venv/bin/python bench/plan_speed.py [POINTS]
    .venv/bin/python bench/plan_speed.py --new-shapes   # only the new shapes

Two sweeps: one planned from a GPU preset (h100-sxm), and one on this CPU, whose plans
time the trial's kernels (kernel_timing.py): with an empty kernel cache (what a fresh
sweep costs) and then with the cache warm. Target: 1,000 points in under 10 s on the
2-core CI machine, warm. Then new shapes: `orchestrator plan` of a shape this machine has
not timed, each in a fresh process as a user types it, with the CPU's peak and this host's
links already measured and DeepSpeed's CPU op already built (each once per machine, by the
first trial or plan): what a user waits for a shape they try. Target: 10 s each.
"""

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from orchestrator.hydra_glue.compose import expand_sweep
from orchestrator.measure.kernel_cache import Cache
from orchestrator.run.planning import plan_trial
from orchestrator.spec import build_spec

CPU_SWEEP = [
    "model=tiny,gpt2-125m",
    "hardware=cpu",
    "cluster=slurm",
    "zero=stage0,stage1,stage2,stage3",
    "parallel.dp=1,2,4,8,16,32,64,128,256",
    "zero.reduce_bucket_size=1e7,5e7,1e8,2e8,5e8",
    "batch.micro_batch_size=1,2,4",
]


def cpu_sweep(points: int) -> None:
    """The CPU sweep with an empty kernel cache, then again with the one it left."""
    overrides = expand_sweep(CPU_SWEEP)[:points]
    with tempfile.TemporaryDirectory() as cache:
        os.environ["XDG_CACHE_HOME"] = cache
        for state in ("fresh", "warm"):
            Cache._known = None  # read from the file again, as a new process would
            start = time.perf_counter()
            # as each allocated node plans its trial (on the submitting host a SLURM trial's
            # plan takes the preset's values: the node is not this machine)
            plans = [plan_trial(build_spec(o), on_the_node=True) for o in overrides]
            kernels = sum(1 for _ in Cache.known())
            print(
                f"this CPU, measured kernels, {state} cache: {len(plans)} points in "
                f"{time.perf_counter() - start:6.2f} s ({kernels} kernels timed and cached)"
            )


# Shapes no test or benchmark plans (so no cache holds them), the default trial's engine.
NEW_SHAPES = [
    ["model.hidden=72", "model.ffn_hidden=288"],
    ["model.hidden=88", "model.ffn_hidden=352"],
    ["model.hidden=120", "model.ffn_hidden=480"],
    ["model.arch=llama", "model.hidden=96", "model.kv_heads=2", "model.ffn_hidden=256"],
]


def new_shapes() -> None:
    """Each of NEW_SHAPES planned in a fresh process, its kernels and engine uncached."""
    home = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    if not (home / "orchestrator" / "cpu_peak.json").exists():
        sys.exit("plan once first (`orchestrator plan`): this measures a new shape, not the CPU's peak")
    times = []
    for shape in NEW_SHAPES:
        with tempfile.TemporaryDirectory() as cache:
            (Path(cache) / "orchestrator").mkdir()
            for once_per_machine in ("cpu_peak.json", "local_links.json"):  # the CPU's peak, this host's links
                if (home / "orchestrator" / once_per_machine).exists():
                    shutil.copy(home / "orchestrator" / once_per_machine, Path(cache) / "orchestrator")
            extensions = home / "torch_extensions"  # DeepSpeed's CPU op, where torch builds it by default
            if extensions.exists():
                (Path(cache) / "torch_extensions").symlink_to(extensions)
            start = time.perf_counter()
            proc = subprocess.run(
                [sys.executable, "-m", "orchestrator", "plan", *shape],
                capture_output=True,
                text=True,
                env={**os.environ, "XDG_CACHE_HOME": cache},
                cwd=cache,
            )
            times.append(time.perf_counter() - start)
            busy = "  (said busy: not cached)" if "was busy" in proc.stdout + proc.stderr else ""
            print(f"new shape {' '.join(shape)}: {times[-1]:5.1f} s, exit {proc.returncode}{busy}")
    print(
        f"a new shape's plan: median {statistics.median(times):.1f} s, {min(times):.1f}-{max(times):.1f} s "
        f"(target 10 s)"
    )


def main(points: int = 1000) -> None:
    dps = ",".join(str(2**i) for i in range(2, 11))  # 4 .. 1024
    sweep = [
        "model=gpt2-1.3b,llama3-8b",
        "hardware=h100-sxm",
        "cluster=slurm",
        "zero=stage0,stage1,stage2,stage3",
        f"parallel.dp={dps}",
        "zero.reduce_bucket_size=1e7,5e7,1e8,2e8,5e8",
        "batch.micro_batch_size=1,2,4",
    ]
    start = time.perf_counter()
    overrides = expand_sweep(sweep)[:points]
    expanded = time.perf_counter()
    specs = [build_spec(o) for o in overrides]
    validated = time.perf_counter()
    plans = [plan_trial(s) for s in specs]
    planned = time.perf_counter()
    n = len(plans)
    print(f"points: {n}")
    print(f"expand sweep:      {expanded - start:6.2f} s")
    print(f"compose+validate:  {validated - expanded:6.2f} s  ({(validated - expanded) / n * 1e3:.2f} ms/point)")
    print(f"plan:              {planned - validated:6.2f} s  ({(planned - validated) / n * 1e3:.2f} ms/point)")
    print(f"total:             {planned - start:6.2f} s  (target < 10 s for 1,000 points)")
    # The same sweep as a user types it: the Hydra app's parser, pre-flight and print.
    # (It is 1,080 points: 2 models x 4 stages x 9 dp x 5 buckets x 3 micro batches.)
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator", "plan", "-m", "--json", *sweep], capture_output=True, text=True
    )
    wall = time.perf_counter() - start
    print(
        f"`orchestrator plan -m --json` of all {expanded_all(sweep)} points, the whole command: {wall:6.2f} s "
        f"(exit {proc.returncode}: 0 all fit, 3 some do not)"
    )
    cpu_sweep(points)
    new_shapes()


def expanded_all(sweep: list[str]) -> int:
    return len(expand_sweep(sweep))


if __name__ == "__main__":
    if sys.argv[1:] == ["--new-shapes"]:
        new_shapes()
    else:
        main(int(sys.argv[1]) if len(sys.argv) > 1 else 1000)
