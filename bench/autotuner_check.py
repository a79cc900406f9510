"""DeepSpeed's autotuner on the space and model of bench/tune_check.py, on this machine.

    .venv/bin/python bench/autotuner_check.py [OUT_DIR]

The anchor `orchestrator tune` is compared with: `deepspeed --autotuning tune` (Rajbhandari
et al.'s DeepSpeed; its autotuner profiles the model once, then runs real experiments of
micro batch size per ZeRO stage). Same GPT-2 shape (4 layers, hidden 256, vocabulary 8192,
seq 128), same 2 CPU ranks, bf16, torch's AdamW; ZeRO 0-3 x micro batch 1-4. Recompute is
not a DeepSpeed setting (it is the model's), so the autotuner tunes with none, the best
choice on this CPU in bench/tune_check.py's exhaustive sweep.

What it takes to start here, and nothing else is changed (`pip install tabulate`, which
`deepspeed[autotuning]` would bring, is the one package it needs beyond the test extras):
- LOCAL_SIZE=2: DeepSpeed's CPU accelerator counts its "devices" from it.
- a `pdsh` on PATH that runs its command on this host: the autotuner kills each
  experiment's leftovers with `pdsh -w localhost pkill -f NAME`, and there is no ssh here.

Prints the autotuner's wall clock, its experiments with their throughput, and its pick,
then measures the pick with `orchestrator run` (5 steps, as tune_check's points) so its
tokens/s/GPU compares with tune's and the exhaustive sweep's.
This file is also the training script each experiment runs (`--deepspeed_config`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

SHAPE = dict(n_layers=4, hidden=256, heads=4, kv_heads=4, ffn_hidden=1024, vocab=8192, seq_len=128)
PDSH = """#!/bin/sh
# pdsh -f N -w HOSTS CMD...: every host is this one; pdsh itself exits 0 without -S
while [ $# -gt 0 ]; do case "$1" in -f|-w) shift 2;; *) break;; esac; done
"$@" >/dev/null 2>&1
exit 0
"""


def ds_config(results: Path) -> dict:
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_clipping": 1.0,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": [0, 1, 2, 3]},
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1, "torch_adam": True},
        },
        "steps_per_print": 10**9,
        "autotuning": {
            "enabled": True,
            "fast": True,
            "metric": "throughput",
            "min_train_micro_batch_size_per_gpu": 1,
            "max_train_micro_batch_size_per_gpu": 4,
            "num_tuning_micro_batch_sizes": 3,
            "start_profile_step": 2,
            "end_profile_step": 4,
            "results_dir": str(results / "results"),
            "exps_dir": str(results / "exps"),
            "overwrite": True,
        },
    }


def train() -> None:
    """One experiment's rank: the engine measures steps 2-4, writes its metric and exits."""
    import deepspeed
    import torch

    from orchestrator.config import ModelConfig
    from orchestrator.workload.deepspeed_compat import leave_shm_comm_unbuilt
    from orchestrator.workload.model import build_model

    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=0)
    parser = deepspeed.add_config_arguments(parser)
    args = parser.parse_args()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_SIZE", "1"))))
    model_cfg = ModelConfig(arch="gpt2", max_positions=SHAPE["seq_len"], **SHAPE)
    model = build_model(model_cfg, seed=0)
    if not torch.cuda.is_available():
        leave_shm_comm_unbuilt()  # as a CPU rank does (workload/engines.py)
    engine, *_ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters())
    generator = torch.Generator().manual_seed(engine.global_rank)
    for _ in range(50):  # the autotuner's engine exits after end_profile_step
        for _ in range(engine.gradient_accumulation_steps()):
            x = torch.randint(
                0, model_cfg.vocab, (engine.train_micro_batch_size_per_gpu(), model_cfg.seq_len), generator=generator
            )
            engine.backward(engine(input_ids=x, labels=x).loss)
            engine.step()


def experiments(results: Path) -> list[tuple[str, dict, float]]:
    """(name, ds_config, throughput in samples/s) of each experiment that reported one."""
    found = []
    for metric in sorted(results.glob("*/metrics.json")):
        exp = json.loads((metric.parent / "exp.json").read_text()) if (metric.parent / "exp.json").is_file() else {}
        found.append((metric.parent.name, exp.get("ds_config", {}), json.loads(metric.read_text())["throughput"]))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default=Path("bench-runs/autotuner"), type=Path)
    args = parser.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    (out / "bin").mkdir(exist_ok=True)
    (out / "bin" / "pdsh").write_text(PDSH)
    (out / "bin" / "pdsh").chmod(0o755)
    (out / "ds_config.json").write_text(json.dumps(ds_config(out), indent=1))
    env = {
        **os.environ,
        "LOCAL_SIZE": "2",
        "PATH": f"{out / 'bin'}:{Path(sys.executable).parent}:{os.environ['PATH']}",
        "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
    }
    start = time.perf_counter()
    with open(out / "autotuner.log", "w") as log:
        done = subprocess.run(
            [
                "deepspeed",
                "--autotuning",
                "tune",
                "--num_gpus",
                "2",
                str(Path(__file__).resolve()),
                "--deepspeed_config",
                str(out / "ds_config.json"),
            ],
            cwd=out,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    seconds = time.perf_counter() - start
    print(f"deepspeed --autotuning tune: exit {done.returncode} in {seconds:.0f} s (log: {out / 'autotuner.log'})")
    ran = experiments(out / "results")
    for name, cfg, throughput in ran:
        tokens = throughput * SHAPE["seq_len"] / 2
        print(
            f"  {name:<28} stage {cfg.get('zero_optimization', {}).get('stage')} "
            f"micro {cfg.get('train_micro_batch_size_per_gpu')}: {throughput:.2f} samples/s = {tokens:,.0f} "
            ""
            "tokens/s/GPU"
        )
    optimal = out / "results" / "ds_config_optimal.json"
    if not optimal.is_file():
        print("no pick: the autotuner wrote no ds_config_optimal.json")
        return
    pick = json.loads(optimal.read_text())
    stage, micro, batch = (
        pick["zero_optimization"]["stage"],
        pick["train_micro_batch_size_per_gpu"],
        pick["train_batch_size"],
    )
    print(f"its pick: ZeRO {stage}, micro batch {micro}, global batch {batch} ({len(ran)} experiments)")
    shape = [f"model.{k}={v}" for k, v in SHAPE.items() if k != "seq_len"]
    trial = out / f"pick-z{stage}-micro{micro}-batch{batch}"
    if not (trial / "result.json").is_file():
        subprocess.run(
            [
                sys.executable,
                "-m",
                "orchestrator",
                "run",
                "--out",
                str(trial),
                "--overwrite",
                *shape,
                "logger.mode=disabled",
                "run.steps=5",
                "run.warmup_steps=2",
                "parallel.dp=2",
                f"zero=stage{stage}",
                f"batch.micro_batch_size={micro}",
                f"batch.global_batch_size={batch}",
                "recompute=none",
                "zero.reduce_bucket_size=1e6",
                "zero.allgather_bucket_size=1e6",
                "zero.prefetch_bucket_size=1e6",
            ],
            check=False,
            capture_output=True,
        )
    metrics = json.loads((trial / "result.json").read_text()).get("metrics", {})
    print(
        f"its pick measured by `orchestrator run`: {metrics.get('tokens_per_sec_per_gpu', float('nan')):,.0f} "
        "tokens/s/GPU"
    )


if __name__ == "__main__":
    train() if "--deepspeed_config" in sys.argv and "--local_rank" in " ".join(sys.argv) else main()
