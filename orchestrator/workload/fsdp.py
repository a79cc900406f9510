"""FSDP2Engine: torch's own fully sharded data parallel (`fully_shard`), run under torchrun.

Applied as torchtitan applies it: `fully_shard` on every transformer block, then on the
root (embeddings, final norm, head), on a device mesh of all ranks ("cpu" with gloo here,
"cuda" with NCCL on GPUs): one-dimensional, or with parallel.replicate > 1 two-dimensional
(replicate, shard), FSDP2's HSDP (plan/dp_layout.py). The trial's settings map to FSDP2's:

- zero.stage=3: `reshard_after_forward=True`, each block's parameters are gathered again
  for the backward (the ZeRO-3 pattern); zero.stage=2: False, the gathered parameters are
  kept from the forward to the backward (ZeRO-2's memory for parameters, one gather less).
  The root's are kept either way.
- run.bf16 / fp32: `MixedPrecisionPolicy(param_dtype)`, the dtype blocks compute in; the
  sharded master parameters and the optimizer states stay fp32.
- zero.communication_dtype: the dtype gradients are reduce-scattered in (`reduce_dtype`;
  null: the compute dtype, as DeepSpeed's default).
- zero.offload_param=cpu: `CPUOffloadPolicy`, parameters, gradients and the optimizer step
  on the host (FSDP2 offloads the three together).
- recompute: the same per-block activation checkpointing as every engine (model.py).

Gradient accumulation skips the reduce-scatter on all but the last micro batch
(`set_requires_gradient_sync`). Checkpoints are torch.distributed.checkpoint's sharded
format of the model's and optimizer's state dicts, each rank writing its own shards.
"""

from __future__ import annotations

from pathlib import Path

import torch

from orchestrator.config import ADAMW_BETAS, ADAMW_EPS
from orchestrator.plan.dp_layout import MESH_DIMS
from orchestrator.spec import TrialSpec
from orchestrator.translate.accelerate import LAYER_CLASS
from orchestrator.translate.fsdp import fsdp_settings
from orchestrator.workload.accumulation import MicroBatches
from orchestrator.workload.device import Device
from orchestrator.workload.model import apply_recompute, build_model, torch_dtype


class FSDP2Engine:
    def __init__(self, spec: TrialSpec, trial_dir: Path, device: Device):
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

        if not dist.is_initialized():
            dist.init_process_group(backend=device.backend, **spec.collective_timeout)
        # HSDP (parallel.replicate > 1): a 2D mesh, fully_shard shards on its inner dimension
        # and replicates on its outer one, all-reducing each gradient shard across replicas
        layout = spec.layout
        names = MESH_DIMS if layout.hybrid else None
        mesh = init_device_mesh(device.torch.type, layout.mesh_shape, mesh_dim_names=names)
        self.settings = fsdp_settings(spec)
        model = build_model(spec.cfg.model, device="cpu", seed=spec.cfg.run.seed)
        apply_recompute(model, spec.cfg.recompute.mode)
        shard = dict(
            mesh=mesh,
            reshard_after_forward=self.settings["reshard_after_forward"],
            mp_policy=MixedPrecisionPolicy(
                param_dtype=torch_dtype(self.settings["param_dtype"]),
                reduce_dtype=torch_dtype(self.settings["reduce_dtype"]),
            ),
            offload_policy=CPUOffloadPolicy() if self.settings["cpu_offload"] else OffloadPolicy(),
        )
        blocks = [m for m in model.modules() if type(m).__name__ == LAYER_CLASS[spec.cfg.model.arch]]
        for block in blocks:
            fully_shard(block, **shard)
        # The root is never resharded after forward, as torchtitan (and FSDP2's own default for
        # the root) has it: its backward needs its parameters first thing, so resharding them
        # only gathers them again (one more all-gather of the embeddings a micro batch).
        fully_shard(model, **{**shard, "reshard_after_forward": False})
        if not self.settings["cpu_offload"]:
            model.to(device.torch)  # the shards move; each rank holds 1/dp of every parameter
        run = spec.cfg.run
        self.model = torch.compile(model) if run.compile else model
        self.optimizer = torch.optim.AdamW(
            model.parameters(), lr=run.lr, betas=ADAMW_BETAS, eps=ADAMW_EPS, weight_decay=run.weight_decay
        )
        self.sharded = all(type(p).__name__ == "DTensor" for p in model.parameters())
        # how the parameters lie on the mesh, read off torch's DTensors: Shard(0) on a 1D mesh,
        # (Replicate(), Shard(0)) on HSDP's 2D one
        first = next(model.parameters())
        self.placements = [str(p) for p in getattr(first, "placements", ())]
        self.mesh_shape = list(mesh.shape)
        self.blocks = len(blocks)
        self._block_names = tuple(f"{n}." for n, m in model.named_modules() if m in blocks)
        self._gathered_after_forward: dict | None = None
        self._fsdp_root = model
        self.grad_clip = run.grad_clip
        self.micro_batches = MicroBatches(spec.schedule[0][1], spec.micro_batch_size, spec.world_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        loss = self.model(input_ids=tokens, labels=tokens).loss
        if self._gathered_after_forward is None:
            self._gathered_after_forward = self.gathered_after_forward()
        return loss

    def gathered_after_forward(self) -> dict[str, bool]:
        """Whether the root's and the blocks' parameters are still gathered between forward and
        backward, read off the module: FSDP2 registers a gathered parameter as a plain tensor
        and a sharded one as a DTensor."""
        kept: dict[str, list[bool]] = {"root": [], "blocks": []}
        for name, p in self._fsdp_root.named_parameters():
            kept["blocks" if name.startswith(self._block_names) else "root"].append(type(p).__name__ != "DTensor")
        return {part: all(flags) for part, flags in kept.items() if flags}

    def backward_and_step(self, loss: torch.Tensor) -> None:
        def backward(scaled: torch.Tensor, sync: bool) -> None:
            self._fsdp_root.set_requires_gradient_sync(sync)  # reduce-scatter only after the last micro batch
            scaled.backward()

        clip = (
            (lambda: torch.nn.utils.clip_grad_norm_(self._fsdp_root.parameters(), self.grad_clip))
            if self.grad_clip
            else None
        )
        self.micro_batches.backward_and_step(loss, backward, self.optimizer, clip)

    def set_global_batch(self, size: int) -> None:
        self.micro_batches.global_batch = size

    def learning_rate(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def engine_global_batch(self) -> int:
        return self.micro_batches.global_batch

    def _state(self) -> dict:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_state, optimizer_state = get_state_dict(self._fsdp_root, self.optimizer)
        return {"model": model_state, "optimizer": optimizer_state}

    def save_state(self, root: Path, tag: str) -> None:
        import torch.distributed.checkpoint as dcp

        dcp.save(self._state(), checkpoint_id=str(root / tag))

    def load_state(self, root: Path, tag: str) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        state = self._state()
        dcp.load(state, checkpoint_id=str(root / tag))
        set_state_dict(
            self._fsdp_root, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"]
        )

    def describe(self) -> dict:
        return {
            "engine": "fsdp2",
            **self.settings,
            "sharded_blocks": self.blocks,
            "parameters_sharded": self.sharded,
            "mesh_shape": self.mesh_shape,
            "placements": self.placements,
            "optimizer": type(self.optimizer).__name__,
            "built_partitioned": False,
            "gathered_after_forward": self._gathered_after_forward,
        }
