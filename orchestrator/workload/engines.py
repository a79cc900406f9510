"""The training engines behind one interface: forward, backward, step, set_global_batch.

DeepSpeedEngine wraps deepspeed.initialize with the trial's ds_config.json.
AccelerateEngine wraps an Accelerator that `accelerate launch --config_file` configured
(DeepSpeed or FSDP2 or DDP, from accelerate_config.yaml).
FSDP2Engine (fsdp.py) applies torch's fully_shard itself, wherever torch runs.
Each builds the transformers model of the trial and applies its recompute mode.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path

import torch

from orchestrator.config import ADAMW_BETAS, ADAMW_EPS
from orchestrator.records.trial_dir import TrialPaths
from orchestrator.spec import TrialSpec
from orchestrator.translate.accelerate import ddp_bucket_mb
from orchestrator.translate.fsdp import fsdp_settings
from orchestrator.workload.accumulation import MicroBatches
from orchestrator.workload.deepspeed_compat import import_muon_uncompiled, leave_shm_comm_unbuilt
from orchestrator.workload.device import Device
from orchestrator.workload.model import apply_recompute, build_model, torch_dtype
from orchestrator.workload.model import import_libraries as import_model_libraries


class DeepSpeedEngine:
    def __init__(self, spec: TrialSpec, trial_dir: Path, device: Device):
        import deepspeed

        if not device.is_gpu:
            leave_shm_comm_unbuilt()
        deepspeed.init_distributed(dist_backend=device.backend, auto_mpi_discovery=False, **spec.collective_timeout)
        self.config = json.loads(TrialPaths(trial_dir).ds_config.read_text())
        import_muon_uncompiled(self.config)
        # ZeRO-3 builds the model partitioned (no rank holds it whole); the other stages
        # build it whole on the host and deepspeed.initialize moves it to the device.
        zero3 = self.config if self.config["zero_optimization"]["stage"] == 3 else None
        model = build_model(spec.cfg.model, device="cpu", seed=spec.cfg.run.seed, zero3_config=zero3)
        self.built_partitioned = built_partitioned(model)
        apply_recompute(model, spec.cfg.recompute.mode)
        # DeepSpeed would take cuda:LOCAL_RANK; the rank's own pick (placement.py) wins.
        args = argparse.Namespace(device_rank=device.index) if device.is_gpu else None
        self.engine, *_ = deepspeed.initialize(
            args=args, model=model, model_parameters=model.parameters(), config=self.config
        )
        if spec.cfg.run.compile:
            self.engine.compile()
        self.global_batch = self.config["train_batch_size"]

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.engine(input_ids=tokens, labels=tokens).loss

    def backward_and_step(self, loss: torch.Tensor) -> None:
        # DeepSpeed counts micro batches itself: step() only updates at the boundary.
        self.engine.backward(loss)
        self.engine.step()

    def set_global_batch(self, size: int) -> None:
        if size != self.global_batch:
            self.engine.set_train_batch_size(size)  # changes gradient_accumulation_steps
            self.global_batch = size

    def learning_rate(self) -> float:
        return float(self.engine.get_lr()[0])

    def engine_global_batch(self) -> int:
        """The global batch DeepSpeed itself will step on (its train_batch_size)."""
        return int(self.engine.train_batch_size())

    def save_state(self, root: Path, tag: str) -> None:
        self.engine.save_checkpoint(str(root), tag=tag)

    def load_state(self, root: Path, tag: str) -> None:
        self.engine.load_checkpoint(str(root), tag=tag)

    def describe(self) -> dict:
        return {
            "engine": "deepspeed",
            "zero_stage": self.engine.zero_optimization_stage(),
            "optimizer": type(self.engine.optimizer).__name__,
            "built_partitioned": self.built_partitioned,
        }


class AccelerateEngine:
    def __init__(self, spec: TrialSpec, trial_dir: Path, device: Device):
        from accelerate import Accelerator
        from accelerate.utils import DistributedDataParallelKwargs, DummyOptim, InitProcessGroupKwargs

        # Configured by accelerate launch from accelerate_config.yaml. Without a GPU, DDP
        # needs cpu=True (else accelerate runs each rank alone); DeepSpeed finds the CPU itself.
        self.deepspeed = spec.cfg.engine.backend == "deepspeed"
        ddp = not self.deepspeed and spec.cfg.zero.stage == 0  # DDP's buckets are the plan's (translate/accelerate.py)
        handlers = [DistributedDataParallelKwargs(bucket_cap_mb=ddp_bucket_mb(spec))] if ddp else []
        handlers += [InitProcessGroupKwargs(**spec.collective_timeout)] if spec.collective_timeout else []
        if self.deepspeed and not device.is_gpu:  # the Accelerator starts DeepSpeed's backend
            leave_shm_comm_unbuilt()
        self.accelerator = Accelerator(
            cpu=not device.is_gpu and not self.deepspeed, kwargs_handlers=handlers, fsdp_plugin=fsdp_plugin(spec)
        )
        if device.is_gpu and self.accelerator.device != device.torch:  # accelerate takes cuda:LOCAL_RANK
            raise RuntimeError(
                f"accelerate chose {self.accelerator.device}, but this rank's GPU is {device.torch} "
                "(LOCAL_RANK and CUDA_VISIBLE_DEVICES disagree: workload/placement.py)"
            )
        expected = "DEEPSPEED" if self.deepspeed else "FSDP" if spec.cfg.zero.stage else "MULTI_"
        if spec.world_size > 1 and expected not in str(self.accelerator.distributed_type):
            raise RuntimeError(
                f"accelerate set up {self.accelerator.distributed_type}, not the {expected} this trial "
                "asks for; nothing measured would mean what it says"
            )
        # With DeepSpeed ZeRO-3 the Accelerator (zero3_init_flag) has already told
        # transformers to build the model partitioned.
        model = build_model(spec.cfg.model, device="cpu", seed=spec.cfg.run.seed)
        self.built_partitioned = built_partitioned(model)
        apply_recompute(model, spec.cfg.recompute.mode)
        run = spec.cfg.run
        if self.deepspeed:  # the optimizer is in ds_config.json
            optimizer = DummyOptim(model.parameters(), lr=run.lr, weight_decay=run.weight_decay)
        else:
            optimizer = torch.optim.AdamW(
                model.parameters(), lr=run.lr, betas=ADAMW_BETAS, eps=ADAMW_EPS, weight_decay=run.weight_decay
            )
        if run.compile:
            model = torch.compile(model)
        if self.deepspeed:  # accelerate's DeepSpeed plugin builds the engine in prepare
            import_muon_uncompiled(json.loads(TrialPaths(trial_dir).ds_config.read_text()))
        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)
        self.grad_clip = run.grad_clip
        self.micro_batches = MicroBatches(spec.schedule[0][1], spec.micro_batch_size, spec.world_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=tokens, labels=tokens).loss

    def backward_and_step(self, loss: torch.Tensor) -> None:
        if self.deepspeed:  # accelerate's DeepSpeed wrapper runs engine.backward + engine.step
            self.accelerator.backward(loss)
            return

        def backward(scaled: torch.Tensor, sync: bool) -> None:
            with contextlib.nullcontext() if sync else self.accelerator.no_sync(self.model):
                self.accelerator.backward(scaled)

        clip = (
            (lambda: self.accelerator.clip_grad_norm_(self.model.parameters(), self.grad_clip))
            if self.grad_clip
            else None
        )
        self.micro_batches.backward_and_step(loss, backward, self.optimizer, clip)

    def set_global_batch(self, size: int) -> None:
        if size == self.micro_batches.global_batch:
            return
        if self.deepspeed:
            self.accelerator.deepspeed_engine_wrapped.engine.set_train_batch_size(size)
        self.micro_batches.global_batch = size

    def learning_rate(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def save_state(self, root: Path, tag: str) -> None:
        self.accelerator.save_state(str(root / tag))

    def load_state(self, root: Path, tag: str) -> None:
        self.accelerator.load_state(str(root / tag))

    def describe(self) -> dict:
        bucket = getattr(self.model, "bucket_bytes_cap", None)  # DDP's: the plan's reduce bucket
        return {
            "engine": "accelerate",
            "distributed_type": str(self.accelerator.distributed_type),
            "model_wrapper": type(self.model).__name__,
            "optimizer": type(self.optimizer).__name__,
            "built_partitioned": self.built_partitioned,
            "ddp_bucket_bytes": bucket,
        }

    def engine_global_batch(self) -> int:
        if self.deepspeed:
            return int(self.accelerator.deepspeed_engine_wrapped.engine.train_batch_size())
        return self.micro_batches.global_batch


def fsdp_plugin(spec: TrialSpec):
    """accelerate's FSDP2 plugin where zero.communication_dtype sets the dtype gradients are
    reduced in (accelerate_config.yaml has no key for it; the rest comes from accelerate
    launch's environment, as without a plugin); None otherwise. The dtypes are engine=fsdp's
    (translate/fsdp.py), so both routes put on the wire what the plan does."""
    if spec.cfg.engine.backend != "fsdp" or not spec.cfg.zero.stage or not spec.cfg.zero.communication_dtype:
        return None
    from accelerate import FullyShardedDataParallelPlugin
    from torch.distributed.fsdp import MixedPrecisionPolicy

    s = fsdp_settings(spec)
    return FullyShardedDataParallelPlugin(
        mixed_precision_policy=MixedPrecisionPolicy(
            param_dtype=torch_dtype(s["param_dtype"]), reduce_dtype=torch_dtype(s["reduce_dtype"])
        )
    )


def built_partitioned(model) -> bool:
    """Whether ZeRO-3 partitioned the model while it was built (its parameters carry a ds_id)."""
    return all(hasattr(p, "ds_id") for p in model.parameters())


# What each engine's constructor imports besides torch and the model's modules.
ENGINE_LIBRARIES = {
    "deepspeed": ("deepspeed",),
    "accelerate": ("accelerate",),
    "fsdp": ("torch.distributed.fsdp", "torch.distributed.device_mesh"),
}


def import_libraries(spec: TrialSpec) -> None:
    """Import what building the trial's model and engine imports, allocating nothing: the
    rank freezes the heap after it (train.py), before the trial's first tensor exists."""
    import importlib

    import_model_libraries(spec.cfg.model.arch)
    for module in ENGINE_LIBRARIES[spec.cfg.engine.name]:
        importlib.import_module(module)


def make_engine(spec: TrialSpec, trial_dir: Path, device: Device):
    from orchestrator.workload.fsdp import FSDP2Engine  # imports torch.distributed.fsdp only when asked for

    cls = {"deepspeed": DeepSpeedEngine, "accelerate": AccelerateEngine, "fsdp": FSDP2Engine}[spec.cfg.engine.name]
    return cls(spec, trial_dir, device)
