"""Host-bound steps on a GPU: what the host's issuing of kernels costs, measured beside
the kernels themselves, and the plan checked against real steps (issue: compute measured whole).

Two halves:

    python bench/gpu_host.py measure OUT.json   # on a machine with a CUDA GPU
    python bench/gpu_host.py report [FILE.json...]  # anywhere: the plan's figures against them
                                                 # (default: bench/data/gpu/h100-host-*.json)

`measure`, for each shape of SHAPES (transformers' GPT-2 and Llama in bf16, sdpa):
- the real step, timed with the host waiting on the GPU at its end (as the trial's clock
  does): forward + backward + torch's AdamW (foreach), one micro batch, median of 10 after
  3 warm-ups; and forward + backward alone;
- the kernels as the plan times them on the device (orchestrator/measure/kernel_timing.py), with the
  block and the model's ends timed whole;
- the host alone: the same model's forward + backward on one sequence of 8 tokens, where
  every kernel is far shorter than its issuing, so the wall clock is the host's; and the
  kernels one forward + backward launches (torch.profiler), at that shape and the real one.
  host_op_us = that wall time / those kernels.

`report` prints, per shape, measured / predicted for: the kernels' sum as measured on the
GPU; the block and ends timed whole on the GPU (what `hardware.kernels=measured` composes
on a GPU node); the preset's estimate as it stood (a fixed cost added per kernel); and the
estimate with the host's issuing in parallel with the device (plan/compute.py: host_bound).
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

try:  # installed (a GPU node's copy), else this checkout
    import orchestrator  # noqa: F401
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.config import ModelConfig  # noqa: E402

DEVICE = os.environ.get("BENCH_DEVICE", "cuda")  # "cpu": a smoke run of the script itself

# (label, arch, hidden, layers, heads, seq, micro, vocab)
SHAPES = [
    ("gpt2 h256 L4 s256 mb2", "gpt2", 256, 4, 4, 256, 2, 50304),
    ("llama h256 L4 s256 mb2", "llama", 256, 4, 4, 256, 2, 32000),
    ("gpt2 h512 L8 s512 mb4", "gpt2", 512, 8, 8, 512, 4, 50304),
    ("gpt2 h768 L12 s1024 mb8", "gpt2", 768, 12, 12, 1024, 8, 50304),
    ("gpt2 h1024 L24 s1024 mb1", "gpt2", 1024, 24, 16, 1024, 1, 50304),
    ("gpt2 h1024 L24 s1024 mb4", "gpt2", 1024, 24, 16, 1024, 4, 50304),
    ("gpt2 h1024 L24 s1024 mb16", "gpt2", 1024, 24, 16, 1024, 16, 50304),
    ("llama h1024 L16 s2048 mb2", "llama", 1024, 16, 16, 2048, 2, 32000),
    ("gpt2 h2048 L24 s2048 mb4", "gpt2", 2048, 24, 16, 2048, 4, 50304),
    ("llama h2048 L16 s2048 mb2", "llama", 2048, 16, 16, 2048, 2, 32000),
]


def model_of(arch: str, hidden: int, layers: int, heads: int, seq: int, vocab: int) -> ModelConfig:
    return ModelConfig(
        arch=arch, hidden=hidden, n_layers=layers, heads=heads, seq_len=seq, max_positions=seq, vocab=vocab
    )


def _median_time(op, sync, warm: int = 3, reps: int = 10) -> float:
    for _ in range(warm):
        op()
    sync()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        op()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _kernels_launched(op) -> int:
    """CUDA kernels one call of op launches, as torch.profiler records them."""
    import torch.profiler as tp

    if DEVICE != "cuda":
        return 0
    with tp.profile(activities=[tp.ProfilerActivity.CUDA]) as prof:
        op()
    return sum(
        1
        for e in prof.events()
        if e.device_type == tp.DeviceType.CUDA and "Memcpy" not in e.name and "Memset" not in e.name
    )


def measure_shape(label: str, m: ModelConfig, micro: int) -> dict:
    import torch

    from orchestrator.measure import kernel_timing, kernels
    from orchestrator.workload.model import build_model

    sync = torch.cuda.synchronize if DEVICE == "cuda" else (lambda: None)
    model = build_model(m, device=DEVICE).to(torch.bfloat16).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    ids = torch.randint(0, m.vocab, (micro, m.seq_len), device=DEVICE)
    tiny = torch.randint(0, m.vocab, (1, 8), device=DEVICE)

    def fwd_bwd(x=ids):
        model(input_ids=x, labels=x).loss.backward()

    def step():
        fwd_bwd()
        opt.step()
        opt.zero_grad(set_to_none=True)

    row = {
        "label": label,
        "model": dataclasses.asdict(m),
        "micro": micro,
        "step_s": _median_time(step, sync),
        "fwd_bwd_s": _median_time(fwd_bwd, sync),
        "host_fwd_bwd_s": _median_time(lambda: fwd_bwd(tiny), sync, reps=20),
        "kernels_real": _kernels_launched(fwd_bwd),
        "kernels_tiny": _kernels_launched(lambda: fwd_bwd(tiny)),
        "optimizer_kernels": _kernels_launched(opt.step),
    }
    block = kernels.block(m, micro, "none", "bf16", DEVICE)
    forward, both = block.build(micro)
    row["block_kernels"], row["block_fwd_kernels"] = _kernels_launched(both), _kernels_launched(forward)
    _, tiny_block = kernels.block(dataclasses.replace(m, seq_len=8, max_positions=8), 1, "none", "bf16", DEVICE).build(
        1
    )
    row["host_block_s"] = _median_time(tiny_block, sync, reps=20)
    params = [p.numel() for p in model.parameters()]
    model = opt = None  # frees the GPU's memory for the kernels' timing (the closures above are done)
    torch.cuda.empty_cache()
    measured = kernel_timing.measure(m, micro, "bf16", DEVICE, 1, params)
    row["kernel_times"] = dataclasses.asdict(measured.kernels)
    row["optimizer_s"] = measured.optimizer_s
    row["host_op_us"] = 1e6 * row["host_fwd_bwd_s"] / max(row["kernels_tiny"], 1)
    return row


def measure(out: Path) -> None:
    import torch
    import transformers

    rows = []
    for label, arch, hidden, layers, heads, seq, micro, vocab in SHAPES[
        : int(os.environ.get("BENCH_SHAPES", len(SHAPES)))
    ]:
        rows.append(measure_shape(label, model_of(arch, hidden, layers, heads, seq, vocab), micro))
        r = rows[-1]
        print(
            f"{label:35s} step {r['step_s'] * 1e3:8.2f} ms  fwd+bwd {r['fwd_bwd_s'] * 1e3:8.2f} ms  "
            f"host {r['host_fwd_bwd_s'] * 1e3:7.2f} ms / {r['kernels_tiny']} kernels = {r['host_op_us']:.1f} us  "
            f"(real shape: {r['kernels_real']} kernels)",
            flush=True,
        )
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    out.write_text(
        json.dumps(
            {
                "gpu": torch.cuda.get_device_name() if DEVICE == "cuda" else DEVICE,
                "host_cpu": cpu,
                "torch": torch.__version__,
                "transformers": transformers.__version__,
                "python": platform.python_version(),
                "measured_at": time.strftime("%Y-%m-%d"),
                "rows": rows,
            },
            indent=1,
        )
    )


def predictions(row: dict, host_op_us: float) -> dict[str, float]:
    """Seconds of the row's forward + backward as each way of planning it says."""
    from orchestrator.plan.compute import KernelTimes, micro_batch_time
    from orchestrator.run.planning import plan_trial
    from orchestrator.spec import build_spec

    m = ModelConfig(**{k: v for k, v in row["model"].items()})
    kt = row["kernel_times"]
    times = KernelTimes(**{k: tuple(v) if isinstance(v, list) else v for k, v in kt.items()})
    kernels_only = dataclasses.replace(times, block=None, ends=None)
    if times.block is not None and times.ends is None:  # a large head: its kernels' sum stands for the ends
        times = dataclasses.replace(times, ends=(times.head[0] + times.loss[0], times.head[1] + times.loss[1]))
    fields = [
        f"model.{k}={'null' if v is None else str(v).lower() if isinstance(v, bool) else v}"
        for k, v in row["model"].items()
    ]
    overrides = [
        "hardware=h100-sxm",
        "hardware.kernels=preset",
        *fields,
        f"batch.micro_batch_size={row['micro']}",
        "parallel.dp=1",
    ]

    def preset(host_us: float) -> float:
        return plan_trial(build_spec([*overrides, f"hardware.host_op_us={host_us}"])).time.micro_batch.total_s

    return {
        "kernels timed, summed": micro_batch_time(m, row["micro"], "none", kernels_only, timed=True).total_s,
        "block and ends timed whole": micro_batch_time(m, row["micro"], "none", times, timed=True).total_s,
        "preset, no host": preset(0.0),
        f"preset, host {host_op_us:g} us": preset(host_op_us),
    }


H100_RUNS = sorted((Path(__file__).resolve().parent / "data" / "gpu").glob("h100-host-*.json"))


def report(paths: list[Path]) -> str:
    """Each shape's median over the runs (their measured steps and host times; the kernels as
    the last run timed them), measured against each way of planning it, as text
    (bench/doc_figures.py writes it into bench/RESULTS.md)."""
    runs, out = [json.loads(p.read_text()) for p in paths], []
    data, rows = runs[-1], []  # the kernels as the newest run timed them
    for i, row in enumerate(data["rows"]):
        same = [run["rows"][i] for run in runs]
        rows.append(
            {
                **row,
                **{k: statistics.median(r[k] for r in same) for k in ("fwd_bwd_s", "step_s", "host_op_us")},
                "spread": max(r["fwd_bwd_s"] for r in same) / min(r["fwd_bwd_s"] for r in same),
            }
        )
    host_op_us = round(statistics.median(r["host_op_us"] for r in rows))
    out.append(
        f"{data['gpu']} (host: {data['host_cpu']}; torch {data['torch']}, transformers {data['transformers']}, "
        f"{data['measured_at']}), median of {len(runs)} run(s)"
    )
    out.append(
        f"host per kernel, whole model on 8 tokens: median {host_op_us} us "
        f"(range {min(r['host_op_us'] for r in rows):.0f}-{max(r['host_op_us'] for r in rows):.0f})"
    )
    out.append("forward + backward, measured / predicted (spread: slowest / fastest run):")
    table = [(f"{r['label']} ({r['spread']:.2f})", r["fwd_bwd_s"], predictions(r, host_op_us)) for r in rows]
    names = list(table[0][2])
    out.append(f"{'shape':35s} {'measured':>9s}  " + "  ".join(f"{n:>26s}" for n in names))
    for label, measured, p in table:
        out.append(f"{label:35s} {measured * 1e3:7.2f}ms  " + "  ".join(f"{measured / p[n]:26.2f}" for n in names))
    for n in names:
        ratios = [measured / p[n] for _, measured, p in table]
        within = sum(0.8 <= x <= 1.25 for x in ratios)
        out.append(f"  {n}: {within} of {len(ratios)} within 20 %, median ratio {statistics.median(ratios):.2f}")
    return "\n".join(out) + "\n"


def _real_step_times(engine: str, model, ids, settings: dict) -> tuple[float, float, float]:
    """Forward, backward and step of the engine wrapping the real model, on this GPU."""
    import torch

    from orchestrator.workload import step_timing

    if engine == "deepspeed":
        import deepspeed

        config = {
            "train_batch_size": 8,
            "train_micro_batch_size_per_gpu": 8,
            "gradient_accumulation_steps": 1,
            "gradient_clipping": settings["grad_clip"],
            "bf16": {"enabled": True},
            "zero_optimization": settings["zero"],
            "optimizer": settings["optimizer"],
            "steps_per_print": 10**9,
        }
        wrapped, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
        return step_timing.median_times(
            lambda: wrapped(input_ids=ids, labels=ids).loss, wrapped.backward, wrapped.step, "cuda"
        )
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    shard = {"mesh": init_device_mesh("cuda", (1,)), "mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16)}
    for block in model.transformer.h:
        fully_shard(block, **shard)
    fully_shard(model, **shard)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        torch.nn.utils.clip_grad_norm_(model.parameters(), settings["grad_clip"])
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step_timing.median_times(
        lambda: model(input_ids=ids, labels=ids).loss, lambda loss: loss.backward(), step, "cuda"
    )


def _plain_times(spec, ids) -> tuple[float, float]:
    """Forward and backward of the bare bf16 model, no engine."""
    import torch

    from orchestrator.workload import step_timing
    from orchestrator.workload.model import build_model

    plain = build_model(spec.cfg.model, device="cuda", seed=0).to(torch.bfloat16)
    fwd, bwd, _ = step_timing.median_times(
        lambda: plain(input_ids=ids, labels=ids).loss, lambda loss: loss.backward(), plain.zero_grad, "cuda"
    )
    return fwd, bwd


def _one_engine(engine: str) -> dict:
    import torch
    import torch.distributed as dist

    from orchestrator.measure import engine_timing
    from orchestrator.measure.trial_measurements import engine_settings
    from orchestrator.plan.params import parameter_tensors
    from orchestrator.spec import build_spec
    from orchestrator.workload.model import build_model

    stage = 0 if engine == "deepspeed" else 3
    overrides = ["hardware=h100-sxm", "model=gpt2-125m", "batch.micro_batch_size=8", "parallel.dp=1"]
    spec = build_spec([*overrides, f"engine={engine}", f"zero=stage{stage}"])
    settings = {**engine_settings(spec), "threads": 1}
    lines, name = engine_timing.time_engine(settings)
    elements = sum(p.numel for p in parameter_tensors(spec.cfg.model))
    stand_in = {k: a + b * elements for k, (a, b) in lines.items()}
    # The same line through stand-ins of about the model's own size: what extrapolating
    # from the default sizes (engine_timing.DEFAULT_SIZES) costs.
    big, _ = engine_timing.time_engine({**settings, "sizes": [elements // 2, elements]})
    stand_in_at_size = {k: a + b * elements for k, (a, b) in big.items()}
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    ids = torch.randint(0, spec.cfg.model.vocab, (8, spec.cfg.model.seq_len), device="cuda")
    p_fwd, p_bwd = _plain_times(spec, ids)
    times = _real_step_times(engine, build_model(spec.cfg.model, device="cuda", seed=0), ids, settings)
    dist.destroy_process_group()
    print(
        f"{engine}: stand-in adds fwd {stand_in['forward_s'] * 1e3:.1f} bwd {stand_in['backward_s'] * 1e3:.1f}, "
        f"step {stand_in['step_s'] * 1e3:.1f} ms (at the model's size: step "
        f"{stand_in_at_size['step_s'] * 1e3:.1f}); real model: fwd {times[0] * 1e3:.1f} bwd {times[1] * 1e3:.1f} "
        f"step {times[2] * 1e3:.1f} ms, without the engine fwd {p_fwd * 1e3:.1f} bwd {p_bwd * 1e3:.1f} ms",
        flush=True,
    )
    return {
        "stand_in": stand_in,
        "stand_in_at_size": stand_in_at_size,
        "optimizer": name,
        "real": dict(zip(("forward_s", "backward_s", "step_s"), times)),
        "plain": {"forward_s": p_fwd, "backward_s": p_bwd},
    }


def engine_check(out: Path) -> None:
    """The engine's additions and step as the plan times them (a stand-in, step_timing.py)
    against the same engine wrapping the real model (gpt2-125m, 8 x 1024 tokens) on this GPU,
    forward, backward and step each timed with the host waiting on the GPU."""
    os.environ.update(
        RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29511"
    )
    results = {engine: _one_engine(engine) for engine in ("deepspeed", "fsdp")}
    out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    if sys.argv[1:2] == ["engine"]:
        engine_check(Path(sys.argv[2]))
        sys.exit()
    if sys.argv[1:2] == ["measure"]:
        measure(Path(sys.argv[2]))
    elif sys.argv[1:2] == ["report"]:
        print(report([Path(p) for p in sys.argv[2:]] or H100_RUNS), end="")
    else:
        sys.exit(__doc__)
