"""The same DeepSpeed training loop as a trial, with none of the orchestrator around it.

    torchrun ... bench/bare_loop.py TRIAL_DIR      (bench/overhead.py starts it)

The model the trial builds, its ds_config.json, the same synthetic batches, the same
number of micro batches per step; no timing per step, no census, no progress lines, no
tracking, no checkpoints, no loss read back. Rank 0 writes TRIAL_DIR/bare.json: when
the process started, and the wall clock at the start of every step.
"""

import time

PROCESS_STARTED = time.time()  # noqa: E402 - before the imports, which are part of the start-up

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import deepspeed  # noqa: E402
import torch  # noqa: E402

from orchestrator.plan.batch import grad_accum_steps  # noqa: E402
from orchestrator.records.trial_dir import TrialPaths  # noqa: E402
from orchestrator.spec import load_spec  # noqa: E402
from orchestrator.workload.data import batches  # noqa: E402
from orchestrator.workload.deepspeed_compat import leave_shm_comm_unbuilt  # noqa: E402
from orchestrator.workload.device import Device  # noqa: E402
from orchestrator.workload.model import apply_recompute, build_model  # noqa: E402


def main(trial_dir: Path) -> None:
    spec = load_spec(trial_dir)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = Device.for_rank(spec.cfg.hardware.device, os.environ)  # the rank's GPU as the workload picks it
    if not device.is_gpu:
        leave_shm_comm_unbuilt()  # as a CPU rank does (workload/engines.py)
    deepspeed.init_distributed(dist_backend=device.backend, auto_mpi_discovery=False)
    torch.manual_seed(spec.cfg.run.seed)
    config = json.loads(TrialPaths(trial_dir).ds_config.read_text())
    zero3 = config if config["zero_optimization"]["stage"] == 3 else None
    model = build_model(spec.cfg.model, device="cpu", seed=spec.cfg.run.seed, zero3_config=zero3)
    apply_recompute(model, spec.cfg.recompute.mode)
    args = argparse.Namespace(device_rank=device.index) if device.is_gpu else None  # as engines.py: not LOCAL_RANK
    engine, *_ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters(), config=config)
    data = iter(batches(spec, rank, world))
    grad_accum = grad_accum_steps(config["train_batch_size"], config["train_micro_batch_size_per_gpu"], world)
    starts = []
    for _ in range(spec.cfg.run.steps):
        starts.append(time.time())
        for _ in range(grad_accum):
            tokens = next(data).to(device.torch)
            engine.backward(engine(input_ids=tokens, labels=tokens).loss)
            engine.step()
    device.synchronize()
    starts.append(time.time())  # the end of the last step
    if rank == 0:
        (trial_dir / "bare.json").write_text(json.dumps({"process_started": PROCESS_STARTED, "step_starts": starts}))
    torch.distributed.barrier()
    os._exit(0)  # as the workload does: gloo's threads can abort a normal interpreter exit


if __name__ == "__main__":
    main(Path(sys.argv[1]).resolve())
