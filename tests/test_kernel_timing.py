"""Measured kernels (kernel_timing.py, kernels.py): which of a trial's kernels are timed, the
cache, the composition into a step (plan/compute.py), the fallback to the preset, and the
clock each device gets. Timed for real on this CPU; a GPU's CUDA events cannot run here,
so only the choice of clock is checked for it."""

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.analysis.calibrate import with_params
from orchestrator.core.errors import KernelTimingError
from orchestrator.measure import cpu_allocator, engine_timing, kernel_clock, kernel_timing, kernels, trial_measurements
from orchestrator.measure.cpu_allocator import allocator_key
from orchestrator.measure.kernel_cache import Cache, plausible_times
from orchestrator.measure.kernel_clock import clock, time_kernel
from orchestrator.measure.kernel_timing import measure
from orchestrator.measure.kernels import Kernel, trial_gemms
from orchestrator.plan.compute import KernelTimes, micro_batch_time
from orchestrator.plan.inputs import MeasuredKernels
from orchestrator.plan.params import parameter_tensors
from orchestrator.run.planning import plan_trial
from orchestrator.spec import build_spec
from tests.conftest import FP32

SMALL = [
    "model.n_layers=2",
    "model.hidden=64",
    "model.heads=2",
    "model.ffn_hidden=128",
    "model.vocab=256",
    "model.seq_len=32",
    "model.max_positions=32",
    "batch.micro_batch_size=2",
]


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    # DeepSpeed builds its ops (CPU Adam, for offload) under XDG_CACHE_HOME unless told where:
    # keep them where torch puts them with the variable unset (a folder named by its Python
    # and accelerator, torch.utils.cpp_extension; a CPU build of torch here), never a second build.
    monkeypatch.setenv(
        "TORCH_EXTENSIONS_DIR",
        os.environ.get("TORCH_EXTENSIONS_DIR")
        or str(
            Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
            / "torch_extensions"
            / f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}_cpu"
        ),
    )
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(Cache, "_known", None)
    # These tests are about what is timed and cached; other tests beside them (xdist) would
    # make the busy check drop the times. The check has its own test, with a stand-in probe.
    monkeypatch.setattr(kernel_timing.QuietCheck, "probe", lambda self: 0.01)
    # Nor about this host's links, which a fresh cache would measure again for every plan of
    # two ranks (seconds each): tests/test_local_links.py measures them.
    monkeypatch.setattr(trial_measurements, "measured_links", lambda *a, **k: (None, ""))
    yield tmp_path / "orchestrator" / "kernels.json"
    Cache._known = None


def small_spec(*extra: str, arch: str = "llama"):
    kv = 1 if arch == "llama" else 2  # Llama's grouped-query attention; GPT-2 has none
    return build_spec(["hardware=cpu", *SMALL, f"model.arch={arch}", f"model.kv_heads={kv}", *extra])


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_every_kernel_of_a_micro_batch_is_timed_once_and_cached(fresh_cache, monkeypatch, arch):
    spec = small_spec(arch=arch)
    model, tensors = spec.cfg.model, [p.numel for p in parameter_tensors(spec.cfg.model)]
    fixed = []  # the threshold itself is test_cpu_allocator's; here, that the timing fixes it first
    monkeypatch.setattr(cpu_allocator, "allocate_as_the_ranks", lambda: fixed.append(len(Cache.known())))
    m = measure(model, 2, "bf16", "cpu", 1, tensors)
    assert fixed == [0]  # once, before the first kernel was timed
    keys = json.loads(fresh_cache.read_text())
    gemms = [k for k in keys if "|gemm " in k]
    assert len(gemms) == len(trial_gemms(model, 64)) + 1  # each distinct layer GEMM, and the head
    assert any("n=256 k=64" in k and "linear" in k for k in gemms)  # the lm_head, nn.Linear's layout
    layout = "conv1d" if arch == "gpt2" else "linear"
    assert all(layout in k for k in gemms if "n=256" not in k)
    for part in ("attention sdpa causal s=32", f"memory-bound {arch}", "loss vocab=256", "launch", "adamw"):
        assert sum(part in k for k in keys) == 1, part
    assert all(k.startswith(f"{m.device}|torch ") and "|1 threads|bf16|" in k for k in keys)
    assert all(f"|{allocator_key()}|" in k for k in keys if "|engine " not in k)  # timed as the ranks allocate
    assert all(x > 0 for x in (*m.kernels.layer_gemms, *m.kernels.head, m.kernels.attention[0], m.optimizer_s))

    # Again, in this process and in a new one (the file): nothing is timed a second time.
    monkeypatch.setattr(kernel_timing, "time_kernel", lambda *a: pytest.fail("timed again"))
    assert measure(model, 2, "bf16", "cpu", 1, tensors) == m
    Cache._known = None
    assert measure(model, 2, "bf16", "cpu", 1, tensors).kernels == m.kernels
    # A new process whose kernels are all cached reads them without importing torch (1.5 s
    # of every `plan` on a machine without a GPU driver).
    reads = (
        "import sys; from orchestrator.measure.kernel_timing import measure; from orchestrator.plan.params import "
        "parameter_tensors; from tests.test_kernel_timing import small_spec; "
        f"model = small_spec(arch={arch!r}).cfg.model; "
        "m = measure(model, 2, 'bf16', 'cpu', 1, [p.numel for p in parameter_tensors(model)]); "
        "print(m.kernels.head, 'torch' in sys.modules)"
    )
    said = subprocess.run(
        [sys.executable, "-c", reads],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).parent.parent,
        env=os.environ,
        check=True,
    ).stdout.split()
    assert said[-1] == "False" and m.kernels.head[0] == pytest.approx(float(said[0].strip("(,")))
    with pytest.raises(pytest.fail.Exception):  # another shape is a new kernel
        measure(dataclasses.replace(model, seq_len=16, max_positions=16), 2, "bf16", "cpu", 1, tensors)


def test_a_kernel_too_long_for_the_budget_is_timed_on_fewer_rows_and_scaled():
    built = []

    def build(rows):
        built.append(rows)
        return ("fwd", rows), ("both", rows)

    def tick(op, reps, rounds, warm=True):  # a clock where a call costs 1 ms a row forward, 3 ms both
        kind, rows = op
        return rows * (1e-3 if kind == "fwd" else 3e-3)

    fwd, bwd = time_kernel(Kernel("k", 100_000, build, min_rows=4, scale=2.0), tick)
    assert built[0] == 4 and max(built) < 100_000  # probed small, timed below the full size
    assert fwd == pytest.approx(200.0) and bwd == pytest.approx(400.0)  # scaled to the full 100k rows, x2 wide
    small = []
    time_kernel(Kernel("k", 8, lambda r: small.append(r) or (("fwd", r), ("both", r)), min_rows=4), tick)
    assert small[-1] == 8  # within the budget: timed whole


def test_a_call_too_slow_for_the_budget_is_taken_to_its_full_rows_along_a_line_not_in_proportion():
    """A slow device's call on its fewest rows pays a part that does not grow with them
    (here 0.2 s of a backward, as a weight's gradient does): in proportion from 32 rows it
    would be counted 8 times at 256; the line through 32 and 64 rows counts it once."""
    built = []

    def build(rows):
        built.append(rows)
        return ("fwd", rows), ("both", rows)

    def tick(op, reps, rounds, warm=True):  # 1 ms a row forward; both: 0.2 s + 5 ms a row
        kind, rows = op
        return rows * 1e-3 if kind == "fwd" else 0.2 + rows * 5e-3

    fwd, bwd = time_kernel(Kernel("k", 256, build, min_rows=32), tick)
    assert sorted(set(built)) == [32, 64]  # never built on the full rows
    assert fwd == pytest.approx(0.256) and fwd + bwd == pytest.approx(0.2 + 256 * 5e-3)
    # Two calls that make no line (the machine slowed between them): the second, in proportion.
    calls = iter([1.0])  # after 0.36 s on 32 rows: more than twice as long on twice the rows
    assert kernel_clock.along_rows(
        Kernel("k", 256, build, min_rows=32), 32, 0.36, lambda *a, **k: next(calls)
    ) == pytest.approx(1.0 * 256 / 64)
    # Too few rows for a second point: in proportion from the first.
    assert kernel_clock.along_rows(Kernel("k", 48, build, min_rows=32), 32, 0.36, tick) == pytest.approx(0.36 * 1.5)


def test_forward_and_backward_are_timed_round_by_round_so_a_passing_load_cannot_make_the_backward_negative():
    """A load that slows the first calls three-fold: timed one after the other, the forward's
    rounds would all fall in it and the forward would come out longer than forward and
    backward; interleaved, each keeps its quiet rounds. A forward not shorter than both
    (the load stayed on the forward's rounds) is timed again."""
    calls = []

    def tick(op, reps, rounds, warm=True):  # 1 ms forward, 3 ms both; 3x slower while the load lasts
        calls.append(op)
        return (1e-3 if op == "fwd" else 3e-3) * (3.0 if len(calls) <= LOAD else 1.0)

    LOAD = 3
    forward, total = kernel_clock.forward_and_total("fwd", "both", 1e-3, tick)
    assert (forward, total) == (pytest.approx(1e-3), pytest.approx(3e-3))
    assert calls == ["fwd", "both"] * 3  # interleaved, three rounds each, once
    calls.clear()
    LOAD = 1000  # every call slowed alike: still one try, the ratio kept
    assert kernel_clock.forward_and_total("fwd", "both", 1e-3, tick)[1] > 0 and len(calls) == 6

    slow_forward = []

    def tick_slow_forward(op, reps, rounds, warm=True):  # the forward's rounds alone are loaded, for 9 calls
        slow_forward.append(op)
        return 10e-3 if op == "fwd" and len(slow_forward) <= 9 else (1e-3 if op == "fwd" else 3e-3)

    forward, total = kernel_clock.forward_and_total("fwd", "both", 1e-3, tick_slow_forward)
    assert total > forward and len(slow_forward) == 12  # the first try made no sense: a second one


def test_a_gemm_too_slow_to_time_whole_is_timed_on_the_largest_shape_the_probe_allows():
    # GPT-3 175B's FFN GEMM: capped at 8192 x 8192, then halved side by side down to 1024.
    shapes = [kernels.gemm(8192, 49152, 12288, True, True, "bf16", "cpu")]
    while shapes[-1].smaller is not None:
        shapes.append(shapes[-1].smaller)
    assert shapes[0].scale == pytest.approx(49152 * 12288 / 8192**2)
    assert shapes[-1].scale == pytest.approx(49152 * 12288 / 1024**2) and len(shapes) == 7
    assert all(b.scale == pytest.approx(2 * a.scale) for a, b in zip(shapes, shapes[1:]))

    # A device where a call on 32 rows costs 1 s per `per_second` weight elements, forward
    # and backward (the scale says how large each shape was built): no real call needed.
    def stand_in(kernel):
        size = 49152 * 12288 / kernel.scale
        return dataclasses.replace(
            kernel,
            build=lambda r: (("fwd", size), ("both", size)),
            smaller=stand_in(kernel.smaller) if kernel.smaller else None,
        )

    def chosen_and_probed(per_second: float):
        probed = []

        def tick(op, reps, rounds, warm=True):
            probed.append(op[1])
            return op[1] / per_second * (1 / 3 if op[0] == "fwd" else 1)

        chosen, (_, _, _, seconds) = kernel_clock.affordable(stand_in(shapes[0]), tick)
        return 49152 * 12288 / chosen.scale, probed, seconds

    # The 1024^2 probe takes a quarter of PROBE_S: 2048^2 (4x its work) is the largest affordable.
    size, probed, seconds = chosen_and_probed(4 * 2**20 / kernel_clock.PROBE_S)
    assert probed == [1024**2, 2048**2] and size == 2048**2 and seconds == pytest.approx(kernel_clock.PROBE_S)
    # Even the smallest takes twice PROBE_S: it is kept, and not probed twice.
    size, probed, _ = chosen_and_probed(2**20 / (2 * kernel_clock.PROBE_S))
    assert probed == [1024**2] and size == 1024**2
    # 2^30 a second: the capped shape itself.
    assert chosen_and_probed(2**30)[0] == 8192**2


def test_the_composition_adds_what_recompute_runs_again_and_no_launch_to_timed_kernels():
    k = KernelTimes(
        layer_gemms=(1.0, 2.0),
        head=(0.5, 1.0),
        attention=(0.25, 0.5),
        memory_bound=(0.125, 0.25),
        loss=(0.0625, 0.125),
        launch_s=0.01,
    )
    model = small_spec().cfg.model  # 2 layers
    none, sel, full = (micro_batch_time(model, 2, mode, k, timed=True) for mode in ("none", "selective", "full"))
    assert none.total_s == pytest.approx(2 * (3 + 0.75 + 0.375) + 1.5 + 0.1875) and none.overhead_s == 0
    assert none.forward_s == pytest.approx(2 * (1 + 0.25 + 0.125) + 0.5 + 0.0625)
    assert sel.total_s - none.total_s == pytest.approx(2 * 0.125)  # the memory-bound forward again
    assert full.total_s - none.total_s == pytest.approx(2 * (1 + 0.25 + 0.125))  # the layers' forward again
    estimated = micro_batch_time(model, 2, "none", k, timed=False)
    assert estimated.overhead_s == pytest.approx(estimated.kernels * 0.01)  # the roofline pays each launch


def test_where_timing_fails_the_plan_uses_the_preset_and_says_so(monkeypatch):
    def broken(*args, **kwargs):
        raise KernelTimingError("RuntimeError: no kernel")

    monkeypatch.setattr(kernel_timing, "measure", broken)
    plan, preset = plan_trial(small_spec()), plan_trial(small_spec("hardware.kernels=preset"))
    assert plan.sources["compute"].startswith("measured kernels failed (RuntimeError: no kernel), so compute (the cpu")
    # the compute as the preset plans it (the links, measured on this host, are not the kernels')
    assert (plan.time.compute_s, plan.time.optimizer_s) == (preset.time.compute_s, preset.time.optimizer_s)
    assert not plan.time.micro_batch.timed


def test_which_plans_time_kernels(fresh_cache):
    assert build_spec([]).cfg.hardware.kernels == "measured"  # hardware=auto, here a CPU
    assert build_spec(["hardware.kernels=preset"]).cfg.hardware.kernels == "preset"  # the user's word wins
    assert small_spec().cfg.hardware.kernels == "measured"  # this machine's CPU
    assert build_spec(["hardware=h100-sxm", "cluster=slurm"]).cfg.hardware.kernels == "preset"  # not here
    assert with_params(small_spec(), {"compute_efficiency": 0.5}).cfg.hardware.kernels == "preset"  # a fit's
    plan = plan_trial(small_spec())
    assert plan.time.micro_batch.timed and "timed on" in plan.sources["compute"]
    gpu = plan_trial(build_spec(["hardware=h100-sxm", "cluster=slurm", "model=gpt2-1.3b"]))
    assert gpu.sources["compute"].startswith("compute (the h100-sxm preset's parameters)")
    # On SLURM the submitting host is not the node: it plans from the preset, and the
    # allocated node times the kernels before the ranks start (tests/test_multinode.py runs it).
    slurm = small_spec("cluster=slurm")
    submitted, on_the_node = plan_trial(slurm), plan_trial(slurm, on_the_node=True)
    assert not submitted.time.micro_batch.timed and submitted.sources["compute"].endswith(
        "until the kernels are timed on the allocated node before the ranks start"
    )
    assert on_the_node.time.micro_batch.timed and "in SLURM job" in on_the_node.sources["compute"]


def test_a_cpu_is_timed_by_the_wall_clock_and_a_gpu_by_its_own_time_or_cuda_events():
    assert clock("cpu").__name__ == clock("cpu", whole=True).__name__ == "wall"
    # a kernel alone: the GPU's own time (its host would set the pace of a short one)
    assert clock("cuda").__name__ == clock("cuda:1").__name__ == "device_busy"
    # a block or the model's ends: events around the calls, the host's pace included
    assert clock("cuda", whole=True).__name__ == "events"


def test_a_gpu_without_a_preset_is_planned_from_its_kernels_with_mfu_unknown(monkeypatch, fresh_cache):
    # No GPU here: the device's name and memory, and its timed kernels, are stood in for.
    # What is tested is everything around them: the resolution, the plan, MFU unknown.
    from orchestrator import machine
    from orchestrator.core.errors import ConfigError
    from orchestrator.run.display import console
    from orchestrator.run.plan_display import show_plan

    monkeypatch.setattr(machine, "local_gpu_name", lambda: "NVIDIA L40S")
    monkeypatch.setattr(machine, "local_gpu_memory_gib", lambda: 44.52)
    monkeypatch.setattr(engine_timing, "device_name", lambda device: "NVIDIA L40S")
    timed = KernelTimes(
        layer_gemms=(1e-3, 2e-3),
        head=(1e-3, 2e-3),
        attention=(1e-4, 2e-4),
        memory_bound=(1e-4, 1e-4),
        loss=(1e-4, 1e-4),
        launch_s=5e-6,
    )
    # a GPU's kernels are timed in a process of their own (measure_apart: its CUDA context ends
    # with it, before the ranks start), never in the planning process; stood in for here
    monkeypatch.setattr(kernel_timing, "measure", lambda *a, **k: pytest.fail("a GPU timed in the planning process"))
    monkeypatch.setattr(
        kernel_timing,
        "measure_apart",
        lambda *a, **k: (MeasuredKernels(timed, 1e-3, "NVIDIA L40S", "torch 2.13.0", "2026-11-24T00:00:00Z"), ""),
    )
    spec = build_spec(["model=gpt2-125m"])
    hw = spec.cfg.hardware
    assert (hw.name, hw.device, hw.kernels, hw.memory_gib) == ("gpu", "cuda", "measured", 44.52)
    plan = plan_trial(spec)
    assert plan.time.mfu is None and plan.time.hfu is None and plan.time.step_s > 0
    assert plan.time.tokens_per_sec_per_gpu == pytest.approx(spec.tokens_per_step / plan.time.step_s / spec.world_size)
    assert "timed on NVIDIA L40S" in plan.sources["compute"] and "MFU is unknown" in plan.sources["peak"]
    out = console()
    with out.capture() as shown:
        show_plan(spec, plan, out)
    assert "unknown" in shown.get()
    with pytest.raises(ConfigError, match="run.objective"):  # nothing to rank by
        build_spec(["model=gpt2-125m", "run.objective=mfu"])
    monkeypatch.setattr(kernel_timing, "measure_apart", lambda *a, **k: (_ for _ in ()).throw(KernelTimingError("OOM")))
    with pytest.raises(ConfigError, match="hardware.peak_tflops.bf16"):  # no kernels and no peak: no plan
        plan_trial(spec)


def test_kernels_that_sum_past_their_block_timed_whole_are_said_so(monkeypatch):
    """Where the kernels timed alone sum to more than the real block and ends timed whole, the
    plan keeps the whole and says what the line below 0 means (timed figures stood in for)."""
    from rich.console import Console

    from orchestrator.run.plan_display import show_plan

    alone = KernelTimes(
        layer_gemms=(2e-3, 4e-3),
        head=(1e-3, 2e-3),
        attention=(1e-4, 2e-4),
        memory_bound=(1e-4, 1e-4),
        loss=(1e-4, 1e-4),
        launch_s=0.0,
    )
    whole = dataclasses.replace(alone, block=(1e-3, 2e-3), ends=(1e-3, 2e-3))
    monkeypatch.setattr(
        kernel_timing,
        "measure",
        lambda *a, **k: MeasuredKernels(whole, 1e-3, "a CPU", "torch 2.13.0", "2026-11-27T00:00:00Z"),
    )
    monkeypatch.setattr(trial_measurements, "engine_settings", lambda spec: None)  # no engine to time
    spec = small_spec()
    plan = plan_trial(spec)
    mb = plan.time.micro_batch
    assert mb.between_s < 0 and mb.total_s == pytest.approx(spec.cfg.model.n_layers * 3e-3 + 3e-3)
    out = Console(width=400)  # every note on one line
    with out.capture() as shown:
        show_plan(spec, plan, out)
    assert "below 0: the kernels timed alone sum to more" in shown.get()


def test_a_real_block_and_the_models_ends_timed_whole_make_the_micro_batch(fresh_cache):
    """The block (transformers' own, with autograd and recompute) and the ends are timed whole
    and cached; the micro batch is layers x block + ends, and what lies between the kernels
    is that less their kernels' sum."""
    spec = small_spec("recompute=full")
    model, tensors = spec.cfg.model, [p.numel for p in parameter_tensors(spec.cfg.model)]
    m = measure(model, 2, "bf16", "cpu", 1, tensors, "full")
    keys = json.loads(fresh_cache.read_text())
    assert sum("|block llama" in k and "recompute=full rows=2" in k for k in keys) == 1
    assert sum("|ends llama" in k for k in keys) == 1
    k = m.kernels
    # what a busy machine cannot move: both timed, plausibly (a backward is a difference of
    # two timings, so a load can shrink it, never below zero)
    assert k.block and k.ends and all(plausible_times(*t) for t in (k.block, k.ends))
    t = micro_batch_time(model, 2, "full", k, timed=True)
    assert t.total_s == pytest.approx(2 * sum(k.block) + sum(k.ends))
    assert t.between_s == pytest.approx(t.total_s - t.gemm_s - t.attention_s - t.memory_bound_s)
    assert micro_batch_time(model, 2, "full", dataclasses.replace(k, block=None), timed=True).between_s is None


def test_a_block_too_large_to_time_whole_keeps_its_kernels_sum(fresh_cache, monkeypatch):
    monkeypatch.setattr(kernel_timing, "WHOLE_MAX_ELEMENTS", 1000)  # this model's blocks hold more
    monkeypatch.setattr(kernel_timing, "time_whole", lambda *a: pytest.fail("timed whole"))
    spec = small_spec()
    m = measure(spec.cfg.model, 2, "bf16", "cpu", 1, [p.numel for p in parameter_tensors(spec.cfg.model)])
    assert m.kernels.block is None and m.kernels.ends is None


@pytest.mark.slow
@pytest.mark.parametrize(
    "engine,stage,optimizer",
    [
        ("deepspeed", 0, "FP16_UnfusedOptimizer"),
        ("deepspeed", 3, "DeepSpeedZeroOptimizer_Stage3"),
        ("fsdp", 3, "AdamW"),
    ],
)
def test_the_engines_own_step_is_timed_as_it_runs_it(engine, stage, optimizer):
    """The real engine (DeepSpeed, FSDP2) wraps a stand-in with the trial's modules and shares."""
    from orchestrator.measure.trial_measurements import engine_settings

    spec = small_spec(f"engine={engine if engine == 'fsdp' else 'deepspeed'}", f"zero=stage{stage}", "parallel.dp=2")
    settings = engine_settings(spec)
    assert settings["engine"] == engine  # the model's modules and tensors, in order: its proportions
    assert settings["modules"] == [(p.module, p.numel) for p in parameter_tensors(spec.cfg.model)]
    lines, name = engine_timing.time_engine({**settings, "threads": 1})
    step, per_element = lines["step_s"]
    assert optimizer in name and step + per_element * 2**20 > 0 and per_element >= 0  # never faster when larger


@pytest.mark.slow
def test_the_engines_process_imports_beside_the_kernels_and_times_only_when_told(fresh_cache, monkeypatch):
    """A new shape's plan starts the engine's timing process first: it imports while the
    kernels are timed, says it is ready and times nothing until told (so no timing runs beside
    another); a process never told ends without timing."""
    from orchestrator.measure.trial_measurements import engine_settings

    # fp32: what is timed when is the point, not the precision (bf16 kernels are 2-20x slower
    # on a CPU without bf16 instructions: docs/measurements.md)
    spec = small_spec("engine=fsdp", "zero=stage3", "parallel.dp=1", FP32)
    settings = {**engine_settings(spec), "threads": 1}
    proc = engine_timing.start_timing(settings)
    assert proc.stdout.readline().strip() == engine_timing.READY
    proc.stdin.close()  # the planner went away: nothing is timed
    assert proc.wait(timeout=60) == 0 and proc.stdout.read() == ""

    import psutil  # DeepSpeed's own dependency

    def timing_processes() -> list:
        return [c for c in psutil.Process().children() if "step_timing" in " ".join(c.cmdline())]

    # Whether the plan's own timing process is running when its kernels are timed: asked of
    # the process itself (psutil's scan of /proc once missed it on a loaded machine).
    entered, alive_while_kernels_timed = [], []
    real_enter, real_measure = engine_timing.EngineTiming.__enter__, kernel_timing.measure
    monkeypatch.setattr(engine_timing.EngineTiming, "__enter__", lambda self: entered.append(self) or real_enter(self))
    monkeypatch.setattr(
        kernel_timing,
        "measure",
        lambda *a, **k: (
            alive_while_kernels_timed.append([e.proc is not None and e.proc.poll() is None for e in entered])
            or real_measure(*a, **k)
        ),
    )
    events = []
    real_imported, real_probe = engine_timing.EngineTiming.imported, kernel_timing.QuietCheck.probe
    monkeypatch.setattr(
        engine_timing.EngineTiming, "imported", lambda self: events.append("imported") or real_imported(self)
    )
    monkeypatch.setattr(kernel_timing.QuietCheck, "probe", lambda self: events.append("probe") or real_probe(self))
    plan = plan_trial(spec)
    assert alive_while_kernels_timed == [[True]], (alive_while_kernels_timed, plan.time.optimizer_source)
    assert events[:2] == ["imported", "probe"]  # no kernel timed before the engine's process has imported
    assert "fsdp's own step, timed as it runs it" in plan.time.optimizer_source and not timing_processes()


def test_the_plan_waits_for_the_engines_process_to_import_before_it_times_a_kernel(fresh_cache):
    """`EngineTiming.imported` returns once that process has imported and waits, idle, to be
    told: on a CPU whose planner imports first, the kernels were otherwise timed beside its
    import (and the quiet check then dropped them)."""
    from orchestrator.measure.trial_measurements import engine_settings

    spec = small_spec("engine=fsdp", "zero=stage3", "parallel.dp=1")
    with engine_timing.EngineTiming(engine_settings(spec), 1, 10_000, "cpu") as engine:
        engine.imported()
        pid = engine.proc.pid
        before = _cpu_ticks(pid)
        time.sleep(0.5)
        assert engine.proc.poll() is None and _cpu_ticks(pid) == before  # alive, blocked on its stdin


def _cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime


def test_a_busy_machine_is_said_and_its_timings_are_not_cached(fresh_cache, monkeypatch):
    """The same probe timed before and after the new kernels: disagreeing, they are dropped.
    The clock is a stand-in (the decision is logic; a real load cannot be ordered up here)."""
    probes = iter([0.010, 0.020])
    monkeypatch.setattr(kernel_timing.QuietCheck, "probe", lambda self: next(probes))
    spec = small_spec()
    m = measure(spec.cfg.model, 2, "bf16", "cpu", 1, [p.numel for p in parameter_tensors(spec.cfg.model)])
    assert "busy" in m.busy and "10 ms, then 20 ms" in m.busy
    assert not fresh_cache.exists() or json.loads(fresh_cache.read_text()) == {}
    probes = iter([0.010, 0.011])  # quiet: kept
    m = measure(spec.cfg.model, 2, "bf16", "cpu", 1, [p.numel for p in parameter_tensors(spec.cfg.model)])
    assert m.busy == "" and json.loads(fresh_cache.read_text())


def test_the_engine_is_timed_on_the_trials_device_with_its_backend():
    """Which group and device the engine's timing uses (the GPU path ran on an H100:
    bench/RESULTS.md; here only the choice can be checked)."""
    from orchestrator.measure.engine_timing import DEFAULT_SIZES
    from orchestrator.measure.trial_measurements import engine_settings
    from orchestrator.workload.step_timing import group_of

    assert group_of("cpu") == ("gloo", "cpu") and group_of("cuda:1") == ("nccl", "cuda")
    assert engine_settings(small_spec())["device"] == "cpu"
    assert (
        engine_settings(build_spec(["hardware=h100-sxm", "model.hidden=256", "model.heads=4", "model.kv_heads=null"]))[
            "device"
        ]
        == "cuda"
    )
    assert DEFAULT_SIZES["cuda"][0] > DEFAULT_SIZES["cpu"][1]  # a GPU's per-element cost shows only on larger stand-ins


def test_the_engines_line_through_two_sizes_never_falls_and_a_dip_is_taken_in_proportion():
    from orchestrator.workload.step_timing import lines_through

    # Two sizes make a line; a dip (the smaller timed while the machine was slow) is no line:
    # the larger size's time in proportion, not a flat line at the smaller's.
    lines = lines_through([(1000, (0.1, 0.3, 1.0)), (2000, (0.1, 0.5, 0.4))])
    assert lines["forward_s"] == (pytest.approx(0.1), 0.0)
    assert lines["backward_s"] == (pytest.approx(0.1), pytest.approx(2e-4))
    assert lines["step_s"] == (0.0, pytest.approx(2e-4))


def test_the_engine_is_timed_at_the_powers_of_two_around_the_ranks_share():
    # Pure arithmetic: no GPU needed. A line extrapolated 8x from small stand-ins moved 3x
    # between two timings on an H200, and 16x from a CPU's L3-sized ones 8x; bracketing the
    # share reads the line between its points.
    from orchestrator.measure.engine_timing import DEFAULT_SIZES, MAX_SIZE, stand_in_sizes

    assert stand_in_sizes("cpu", 6_293_760) == [2**22, 2**23]  # Llama h256, 4 layers, dp 1
    assert stand_in_sizes("cpu", 2**20) == [2**19, 2**20]  # a power of two is its own top
    assert stand_in_sizes("cpu", 141_056) == [2**17, 2**18]  # the default trial
    assert stand_in_sizes("cpu", 10) == [2**12, 2**13]  # never below a few thousand elements
    assert stand_in_sizes("cpu", 124_439_808) == [MAX_SIZE["cpu"] // 2, MAX_SIZE["cpu"]]  # gpt2-125m: capped
    assert stand_in_sizes("cuda", 124_439_808) == [2**26, 2**27]  # gpt2-125m whole on one rank
    assert stand_in_sizes("cuda:1", 2**27) == [2**26, 2**27]
    small = DEFAULT_SIZES["cuda"][0]
    assert stand_in_sizes("cuda", 1_000) == [small, 2 * small]  # never below the defaults
    assert stand_in_sizes("cuda", 70 * 10**9) == [MAX_SIZE["cuda"] // 2, MAX_SIZE["cuda"]]  # a 70B share: capped


def test_kernels_timed_in_a_process_of_their_own_come_back_whole(fresh_cache):
    """measure_apart (a GPU's path: its CUDA context ends with the process) returns what
    measure returns here, and this process reads the cache that process wrote."""
    from orchestrator.config import ModelConfig
    from orchestrator.measure.kernel_cache import Cache

    model = ModelConfig(n_layers=1, hidden=64, heads=2, vocab=256, seq_len=32, max_positions=32)
    apart, discarded = kernel_timing.measure_apart(model, 1, "fp32", "cpu", 1, [64 * 64])
    assert discarded == "" and apart.kernels.layer_gemms[0] > 0
    if apart.busy:  # that process's quiet check (not stood in for there) found the machine busy: nothing cached
        return
    assert any("rows=" in key for key in Cache.known())  # written there, read here
    here = kernel_timing.measure(model, 1, "fp32", "cpu", 1, [64 * 64])  # every kernel now cached
    assert here.kernels == apart.kernels


def test_a_gemm_time_no_device_of_its_peak_can_take_is_timed_again(fresh_cache):
    """A tampered or busy-machine cache (3,000 s for a kernel of the tiny model, or a GEMM
    faster than the device's peak) is not a kernel's time: against the peak and the memory
    bandwidth it is dropped, timed again, and the plan says so; a real one is kept."""
    from orchestrator.measure.kernel_timing import possible_times

    gemm = possible_times(2e9, 1e12)  # 2 GFLOP forward on a 1 TFLOPS device: 2 ms at the peak
    assert gemm(0.004, 0.008) and gemm(0.15, 0.3)  # at half the peak; 75x below it
    assert not gemm(3000.0, 6000.0) and not gemm(0.0005, 0.001)  # 100x+ below; 4x above the peak
    assert possible_times(2e9, None)(3000.0, 3000.0)  # no peak known: any time a kernel can take
    spec = small_spec()
    model, tensors = spec.cfg.model, [p.numel for p in parameter_tensors(spec.cfg.model)]
    measure(model, 2, "bf16", "cpu", 1, tensors)
    cache = json.loads(fresh_cache.read_text())
    # 3,000 s each way: within an hour, so only the peak (or the bandwidth) tells it from a kernel's time
    timed = ("|gemm ", "attention", "memory-bound", "loss vocab", "adamw", "|block ", "|ends ")
    tampered = {k: ([3000.0, 3000.0, v[2]] if any(s in k for s in timed) else v) for k, v in cache.items()}
    fresh_cache.write_text(json.dumps(tampered))
    Cache._known = None
    peak = 10 * max(2.0 * 64 * 256 * 64 / 1e-3, 1e9)  # above anything this tiny GEMM reaches; 3,000 s: far below
    m = measure(model, 2, "bf16", "cpu", 1, tensors, peak_flops=peak, bandwidth=1e9)  # 1 GB/s: far below a host's
    assert sum(m.kernels.layer_gemms) < 10 and sum(m.kernels.head) < 10
    assert sum(m.kernels.attention) < 10 and sum(m.kernels.memory_bound) < 10 and sum(m.kernels.loss) < 10
    # the optimizer step against its bytes, a block and the ends timed whole against their kernels
    assert m.optimizer_s < 10 and m.kernels.block and sum(m.kernels.block) < 10 and sum(m.kernels.ends) < 10
    again = json.loads(fresh_cache.read_text())
    assert all(v[0] < 3000 for k, v in again.items() if any(s in k for s in timed))
