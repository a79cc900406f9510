"""FSDP2 (torch's `fully_shard`, per transformer block and on the root) as the plan models it:
the memory of a rank and the communication of a step. Not ZeRO-3: FSDP2 keeps its own
layout and schedule (Zhao et al., "PyTorch FSDP", VLDB 2023; torch's FSDP2 design, per-
parameter sharding on dim 0 as DTensors).

Memory per rank (what phases() in memory.py adds up):
- sharded state: each parameter's 1/dp shard in fp32 (the master weights: mixed precision
  casts a copy for compute), its fp32 gradient shard, and Adam's two moments: 16 bytes
  per sharded element, no separate master copy;
- the unsharded working set: the root's parameters (embeddings, final norm, head) in the
  compute dtype for the whole forward and backward (the root is never resharded after
  forward, as torchtitan and accelerate apply it), plus two blocks' (the one computing and
  the one prefetched), or every block's when parameters are kept from the forward to the
  backward (reshard_after_forward=False, the ZeRO-2 pattern);
- in a block's backward, its unsharded gradients in the compute dtype and, where the
  reduction is in another dtype, the reduce-scatter's input in that dtype; the root's
  unsharded gradients for the whole backward (reduce-scattered at its end); the blocks'
  fp32 gradient shards arrive as their activations go, and meet whole at the step;
- with gradient accumulation, the micro batches that skip the reduce-scatter
  (set_requires_gradient_sync(False)) keep unsharded gradients of the whole model;
- CPUOffloadPolicy keeps the sharded state on the host: the device holds the working set.

A step's communication, per micro batch: each block's parameters all-gathered before its
forward (the root's once, at the start) and, when resharded, again before its backward;
on the micro batch that synchronises, each block's gradients reduce-scattered as its
backward ends. FSDP2 prefetches the next block's all-gather while a block computes and
reduce-scatters a block while the next one's backward runs, so per block the longer of its
compute and its communication counts; the first gather and the last reduce-scatter hide
behind nothing. That overlap is the work of CUDA streams: FSDP2 issues its all-gathers and
reduce-scatters on streams of their own and waits on events. A CPU device has no streams,
so there each collective is a blocking call and the step is compute plus all of its
communication (measured on the namespace cluster: bench/RESULTS.md). Each call is timed by
collectives.py (NCCL's ring, or gloo's).

HSDP (parallel.replicate > 1; dp_layout.py): the shards are 1/shard_ranks of each parameter,
the gathers and reduce-scatters run among a shard group's ranks (within a node where the
layout puts them there), and each block's gradient shard is then all-reduced among the
replicas that hold it, between nodes: the per-block reduction is the two back to back.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.plan.collectives import Network
from orchestrator.plan.comm import Collective, StepTime, calls, collective
from orchestrator.plan.dp_layout import DpLayout
from orchestrator.plan.params import ParamTensor


@dataclass(frozen=True)
class FsdpLayout:
    """The facts of a trial that FSDP2's memory and communication depend on."""

    blocks: list[int]  # elements of each transformer block: what one fully_shard gathers
    root: int  # elements outside the blocks: the root module's (embeddings, final norm, head)
    shard: int  # elements of this rank's shards, all parameters (each split on dim 0 into shard_ranks parts)
    largest_tensor: int  # elements of the largest parameter: a CPU AdamW's per-tensor temporaries follow it
    shard_ranks: int  # the ranks one parameter is sharded over: dp, or dp / parallel.replicate (HSDP)
    param_bytes: int  # the compute dtype (MixedPrecisionPolicy.param_dtype)
    wire_bytes: int  # the reduce-scatter's dtype (reduce_dtype)
    reshard_after_forward: bool
    grad_accum: int
    offload: bool  # CPUOffloadPolicy
    adam_foreach: bool  # torch's AdamW on CUDA updates every tensor at once; on a CPU one at a time
    overlap: bool = True  # CUDA streams: FSDP2 overlaps its collectives with compute; a CPU has none
    replicate: int = 1  # HSDP's replicas, each gradient shard all-reduced across them

    @property
    def elements(self) -> int:
        return sum(self.blocks) + self.root


def layout_of(
    tensors: Sequence[ParamTensor],
    shard_ranks: int,
    param_bytes: int,
    wire_bytes: int,
    reshard: bool,
    grad_accum: int,
    offload: bool,
    adam_foreach: bool,
    overlap: bool = True,
    replicate: int = 1,
) -> FsdpLayout:
    blocks: dict[str, int] = {}
    root = 0
    for p in tensors:
        if p.module.startswith("layers."):
            block = ".".join(p.module.split(".")[:2])
            blocks[block] = blocks.get(block, 0) + p.numel
        else:
            root += p.numel
    shard = sum(-(-p.numel // shard_ranks) for p in tensors)
    return FsdpLayout(
        blocks=list(blocks.values()),
        root=root,
        shard=shard,
        largest_tensor=max(p.numel for p in tensors),
        shard_ranks=shard_ranks,
        param_bytes=param_bytes,
        wire_bytes=wire_bytes,
        reshard_after_forward=reshard,
        grad_accum=grad_accum,
        offload=offload,
        adam_foreach=adam_foreach,
        overlap=overlap,
        replicate=replicate,
    )


def fsdp_states(f: FsdpLayout) -> dict[str, int]:
    """Bytes per rank of each component, in memory.model_states' keys."""
    largest = max(f.blocks, default=0)
    params, shard_grads, optimizer = 4 * f.shard, 4 * f.shard, 8 * f.shard
    # Inside backward the root's gradients (the head's come first) stay unsharded until the
    # root's reduce-scatter at its end; the blocks' fp32 gradient shards arrive one by one
    # as their activations are freed, so all of them meet only at the step.
    grads = f.param_bytes * f.root
    in_flight = f.blocks if not f.reshard_after_forward else [largest] * min(2, len(f.blocks))
    gathered = f.param_bytes * (f.root + sum(in_flight))
    block_grads = largest * (f.param_bytes + (f.wire_bytes if f.wire_bytes != f.param_bytes else 0))
    if f.grad_accum > 1:  # unsynchronised micro batches accumulate unsharded gradients
        grads = f.param_bytes * f.elements
    temporaries = 4 * f.shard if f.adam_foreach else 2 * 4 * -(-f.largest_tensor // f.shard_ranks)
    static = params + optimizer  # zero_grad(set_to_none=True) frees the gradient shards
    offloaded = 0
    if f.offload:
        offloaded = params + shard_grads + optimizer
        static -= params + optimizer
        params = shard_grads = optimizer = temporaries = 0
    return dict(
        params=params,
        grads=grads,
        optimizer=optimizer,
        buffers=gathered + block_grads,
        gathered=gathered,
        optimizer_step=0,
        optimizer_temporaries=temporaries,
        grads_at_step=shard_grads,
        static=static,
        offloaded=offloaded,
    )


def fsdp_step_time(
    f: FsdpLayout, *, fwd_s: float, bwd_s: float, net: Network, replicas: Network | None = None
) -> StepTime:
    """Step time of grad_accum micro batches under FSDP2's prefetching schedule. net: the
    shard group's ranks (all of them without HSDP); replicas: HSDP's replica group, where each
    block's gradient shard is all-reduced after its reduce-scatter, on the same stream."""
    n = max(1, len(f.blocks))
    gather = calls("all_gather", f.blocks, f.param_bytes, net)
    root = calls("all_gather", [f.root], f.param_bytes, net)
    scatter = calls("reduce_scatter", [*reversed(f.blocks), f.root], f.wire_bytes, net)
    shards = [-(-e // f.shard_ranks) for e in scatter.sizes]
    across = calls("all_reduce", shards, f.wire_bytes, replicas) if replicas and f.replicate > 1 else None
    ag = gather.seconds
    rs = [a + b for a, b in zip(scatter.seconds, across.seconds)] if across else scatter.seconds
    fwd_block, bwd_block = fwd_s / n, bwd_s / n
    # forward: the root's and the first block's gathers wait; each later gather hides under a block
    fwd = sum(root.seconds) + ag[0] + sum(max(fwd_block, nxt) for nxt in [*ag[1:], 0.0])
    back_ag = list(reversed(ag)) if f.reshard_after_forward else [0.0] * n

    def backward(sync: bool) -> float:
        # the last block's gather waits (when resharded); then each block's backward hides the
        # next one's gather and the previous one's reduction; the last reductions wait
        rs_prev = [0.0] + (rs[: n - 1] if sync else [0.0] * (n - 1))
        hidden = sum(max(bwd_block, nxt + prev) for nxt, prev in zip([*back_ag[1:], 0.0], rs_prev))
        return back_ag[0] + hidden + (sum(rs[n - 1 :]) if sync else 0.0)

    micro = fwd_s + bwd_s
    compute = f.grad_accum * micro
    if f.overlap:
        step = (f.grad_accum - 1) * (fwd + backward(False)) + fwd + backward(True)
    else:  # every collective blocks the rank: nothing hides
        step = compute + f.grad_accum * (sum(ag) + sum(root.seconds) + sum(back_ag)) + sum(rs)
    exposed = max(0.0, step - compute)
    totals = {
        "forward": f.grad_accum * (sum(ag) + sum(root.seconds)),
        "backward": f.grad_accum * sum(back_ag),
        "reduce": sum(scatter.seconds),
        "across": sum(across.seconds) if across else 0.0,
    }
    share = {k: v / math.fsum(totals.values()) if math.fsum(totals.values()) else 0.0 for k, v in totals.items()}
    c: list[Collective] = [
        collective(
            "forward, each block (prefetched), every micro batch",
            gather,
            net,
            per_step=f.grad_accum,
            exposed_s=exposed * share["forward"],
        ),
        collective(
            "forward, the root's parameters, every micro batch", root, net, per_step=f.grad_accum, exposed_s=0.0
        ),
    ]
    if f.reshard_after_forward:
        c.append(
            collective(
                "backward, each block again (resharded after forward), every micro batch",
                gather,
                net,
                per_step=f.grad_accum,
                exposed_s=exposed * share["backward"],
            )
        )
    c.append(
        collective(
            "backward, each block's gradients, last micro batch", scatter, net, exposed_s=exposed * share["reduce"]
        )
    )
    if across and replicas:
        c.append(
            collective(
                f"backward, each block's gradient shard across the {f.replicate} replicas (HSDP), last micro batch",
                across,
                replicas,
                exposed_s=exposed * share["across"],
            )
        )
    return StepTime(
        compute_s=compute, comm_s=math.fsum(x.time_s for x in c), exposed_s=exposed, step_s=step, collectives=c
    )


def group_networks(net: Network, layout: DpLayout) -> tuple[Network, Network | None]:
    """The networks of one shard group and one replica group of the trial's ranks (None
    without HSDP): each group's ranks and the nodes they span, on the trial's two levels."""
    shard = dataclasses.replace(net, ranks=layout.shard, nodes=layout.shard_nodes)
    if not layout.hybrid:
        return shard, None
    return shard, dataclasses.replace(net, ranks=layout.replicate, nodes=layout.replica_nodes)
