"""Memory per rank at the peak, by component, as DeepSpeed and transformers allocate it.

Model states follow the ZeRO paper's 2 + 2 + 12 bytes per parameter (16N), divided by
dp where ZeRO partitions them, with what DeepSpeed 0.19 really does on top:
- bf16/fp16 at stage 0 runs DeepSpeed's FP16_Optimizer wrapper: fp32 master weights
  (4N) and, during step(), a flat fp32 copy of the gradients (4N more): 20N at that
  moment, not 16N (the theory's "20N with fp32 gradient accumulation").
- ZeRO 1-3 keep an fp32 master partition even for fp32 training (a clone), and create
  the fp32 gradient partition (4N/dp) only inside step().
- The reduce buckets are allocated at the configured size whatever the model size:
  stage 1/2 allocate two of reduce_bucket_size elements with overlap_comm (one without),
  stage 3 one (stage_1_and_2.py / stage3.py). A 5e8 default costs 2 GB in bf16.
- ZeRO-3 keeps parameters of at most param_persistence_threshold elements whole on
  every rank and holds the gathered working set (the module in use, the prefetch
  bucket ahead, capped by max_live_parameters).
- What stays allocated between steps differs from the peak: step() frees the
  gradients at stages 0-2 and the ipg buckets at stages 1-2; ZeRO-3 keeps its flat
  gradient partition and its reduce bucket. `static` is that figure, the one a census
  after step() measures (bench/memory_matrix.py checks it per stage).
On a CPU a page holds memory only once written (Linux commits anonymous memory lazily): a
reduce bucket larger than the gradients that pass through it (the 5e8-element default
on a small model) is allocated whole, as the allocator counts it (`allocated`), but
holds only its written part (`total`, what the OOM killer and max RSS see). On a GPU
the caching allocator holds the whole bucket: the two are one figure.
The peak is the largest of three moments (`phases`): the start of backward (the loss's
fp32 gradients on top of the saved activations, before any parameter gradient or reduce
bucket exists), inside a block's backward (the block being recomputed, every gradient
and bucket alive) and the optimizer step (the fp32 gradient copy alive, activations
freed). On a CPU bench/memory_matrix.py checks it against the allocator's own count.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, NamedTuple

from orchestrator.config import GIB, DeviceType, ModelConfig
from orchestrator.plan.activations import activation_bytes, loss_backward_bytes, recompute_bytes
from orchestrator.plan.params import element_bytes, module_sizes, parameter_tensors, persistent

if TYPE_CHECKING:
    from orchestrator.spec import TrialSpec

# What a CUDA rank holds besides tensors: the CUDA context and preloaded kernels
# (~0.55 GB on H100: Bekman, Machine Learning Engineering Open Book) and NCCL's buffers once a collective
# ran (~1.5 GB there). On CPU: the Python process with torch and DeepSpeed imported.
CUDA_CONTEXT = int(0.6 * GIB)
NCCL_BUFFERS = int(1.5 * GIB)
CPU_PROCESS = int(0.5 * GIB)


@dataclass(frozen=True)
class ZeroLayout:
    """The few facts of a trial that model-state memory depends on."""

    stage: int
    dp: int
    precision: str  # bf16 | fp16 | fp32
    reduce_bucket_size: int
    overlap_comm: bool
    contiguous_gradients: bool
    prefetch_bucket_size: int
    max_live_parameters: int
    param_persistence_threshold: int
    sub_group_size: int  # stage 3: the elements the optimizer updates at a time
    offload_optimizer: bool
    offload_param: bool
    adam_foreach: bool = True  # torch's AdamW on CUDA runs all tensors at once; on a CPU tensor by tensor
    lazy_pages: bool = False  # a CPU: a buffer's never-written part holds no memory
    fp32_grad_accum: bool = False  # stage 1, bf16, grad_accum_dtype=fp32: DeepSpeed's BF16_Optimizer


@dataclass(frozen=True)
class Memory:
    params: int
    grads: int
    optimizer: int  # fp32 master weights + Adam moments, on the device
    activations: int  # saved for backward by one micro batch
    recompute: int  # the activations recomputation rebuilds during backward, one block at a time
    loss_backward: int  # the loss's fp32 gradients at the start of backward (the blocks' come later)
    buffers: int  # reduce buckets, ZeRO-3 gathered parameters
    gathered: int  # of buffers, ZeRO-3's gathered working set (alive from the first forward on)
    optimizer_step: int  # transient fp32 gradient copy inside step()
    optimizer_temporaries: int  # torch AdamW's temporaries inside step()
    grads_at_step: int  # of grads, what is still alive inside step()
    static: int  # alive between optimizer steps: what a census after step() finds
    runtime: int  # CUDA context, NCCL / the Python process on CPU
    offloaded: int  # host memory per rank that offload moved off the device
    total: int  # what the device holds at the peak (on a CPU: written pages only)
    capacity: int
    peak_phase: str  # "loss backward", "backward" or "optimizer step"
    allocated: int = 0  # the peak as the allocator counts it: total plus buffers never written
    untouched: int = 0  # of buffers, the part allocated but never written (a CPU's lazy pages)
    untouched_static: int = 0  # of static, the same (ZeRO-3 keeps its bucket between steps)

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity

    def at_peak(self) -> list[tuple[str, int]]:
        """What the total is made of at its peak phase, as the device holds it: the component
        rows each show their own figure, which are not all alive at once."""
        parts = phase_parts(written(asdict(self)), self.activations, self.recompute, self.loss_backward)
        return [(name, value) for name, value in parts[self.peak_phase] + [("runtime", self.runtime)] if value]

    def as_dict(self) -> dict:
        return {**asdict(self), "fits": self.fits}


def model_states(model: ModelConfig, z: ZeroLayout) -> dict[str, int]:
    """Bytes per rank of each model-state component, as DeepSpeed 0.19 lays them out.

    params / grads / optimizer / buffers are what is alive inside backward;
    optimizer_step is the transient inside step(); static is what stays allocated between
    optimizer steps (what a census after step() finds); offloaded is host memory.
    """
    tensors = parameter_tensors(model)
    n = sum(p.numel for p in tensors)
    largest_tensor = max(p.numel for p in tensors)
    low = element_bytes(z.precision)  # of a parameter and of its gradient
    mixed = z.precision != "fp32"
    gathered = untouched = untouched_static = 0
    if z.stage == 0:
        params, grads = low * n, low * n
        optimizer = (4 * n if mixed else 0) + 8 * n  # fp32 master (mixed precision) + Adam m, v
        step = 4 * n if mixed else 0  # FP16_Optimizer's flat fp32 gradient copy
        buffers = 0  # stage 0 all-reduces the gradients in place, bucket by bucket
        static = params + optimizer  # step() frees the gradients
    elif z.stage in (1, 2):
        shard, params, grads, optimizer, step, buffers, static, untouched = _stage12_states(z, n, low)
    else:
        shard, params, grads, optimizer, step, gathered, buffers, static = _stage3_states(model, z, tensors, low)
        untouched = untouched_static = low * max(0, z.reduce_bucket_size - n)  # its one ipg bucket, kept
    # AdamW's denominator, sqrt(v) / bias correction, is built outside the state: one fp32
    # temporary per tensor with foreach (all at once on CUDA), two of the tensor being
    # updated tensor by tensor (on a CPU). ZeRO 1-2 hand it one flat fp32 partition, ZeRO-3
    # one sub-group of it at a time.
    updated = n if z.stage == 0 else step // 4 if z.stage == 3 else shard
    largest = largest_tensor if z.stage == 0 else updated
    temporaries = 4 * updated if z.adam_foreach else 2 * 4 * largest
    offloaded = 0
    if z.offload_optimizer and z.stage > 0:
        offloaded += optimizer + step
        static -= optimizer
        optimizer, step, temporaries = 0, 0, 0
    if z.offload_param and z.stage == 3:
        offloaded += params
        static -= params
        params = 0
    return dict(
        params=int(params),
        grads=int(grads),
        optimizer=int(optimizer),
        buffers=int(buffers),
        gathered=int(gathered),
        optimizer_step=int(step),
        optimizer_temporaries=int(temporaries),
        # ZeRO 1-2 have reduced the low-precision gradients into the fp32 partition and
        # freed them when the optimizer runs; stage 0 steps on them, stage 3 keeps its own.
        grads_at_step=int(grads if z.stage in (0, 3) else 0),
        static=int(static),
        offloaded=int(offloaded),
        untouched=int(untouched if z.lazy_pages else 0),
        untouched_static=int(untouched_static if z.lazy_pages else 0),
    )


# Bytes the optimizer step moves through memory per parameter it updates. torch's AdamW
# (DeepSpeed's torch_adam) runs separate passes: m lerp 12, v scale 8 and addcmul 12,
# sqrt 8, bias correction 8, + eps 8, weight decay 8, addcdiv 16 (80 in all); clipping
# reads the gradient once for its norm (4); mixed precision converts the gradient to
# fp32 and the weights back (6 + 6). On the 2-core CI machine DeepSpeed's step() took
# 103 bytes per parameter at the measured copy bandwidth (bench/RESULTS.md).
ADAM_TRAFFIC = 80 + 4
# DeepSpeed's CPU Adam (one fused AVX pass: fp32 parameter, gradient, m and v read, three
# written back) and what crosses the host link per parameter (the gradient down and the
# updated parameter up, each in the training precision).
CPU_ADAM_TRAFFIC = 4 * 4 + 3 * 4


def offloaded_step_s(
    updated_params: int, precision: str, host_gbps: float, ranks_per_node: int, link_gbps: float
) -> float:
    """The optimizer step that zero.offload_optimizer=cpu moves to the host: CPU Adam on the
    node's memory bandwidth (shared by its ranks) after the gradients come down the link."""
    host = updated_params * CPU_ADAM_TRAFFIC * ranks_per_node / (host_gbps * 1e9)
    link = updated_params * 2 * element_bytes(precision) / (link_gbps * 1e9)
    return host + link


def optimizer_traffic_bytes(updated_params: int, precision: str) -> int:
    return updated_params * (ADAM_TRAFFIC + (0 if precision == "fp32" else 12))


def runtime_bytes(device: str, world_size: int) -> int:
    if not DeviceType(device).is_gpu:
        return CPU_PROCESS
    return CUDA_CONTEXT + (NCCL_BUFFERS if world_size > 1 else 0)


def phases(states: dict[str, int], activations: int, recompute: int, loss_backward: int) -> dict[str, int]:
    """Bytes per rank (less the runtime) at each moment that can be the step's peak.

    At backward's start the loss's gradients join the saved activations on top of what
    stayed between steps; no parameter gradient exists yet, and the reduce buckets of
    ZeRO 1-2 come with the first one. Inside a block every gradient and bucket is counted
    alive with every activation: an upper bound, as a block's activations are freed while
    its gradients arrive.
    """
    return {
        phase: sum(v for _, v in parts)
        for phase, parts in phase_parts(states, activations, recompute, loss_backward).items()
    }


def phase_parts(
    states: dict[str, int], activations: int, recompute: int, loss_backward: int
) -> dict[str, list[tuple[str, int]]]:
    """What is alive at each of phases()' moments, by component (the plan table's names)."""
    s = states
    return {
        "loss backward": [
            ("between steps", s["static"]),
            ("gathered", s["gathered"]),
            ("activations", activations),
            ("loss backward", loss_backward),
        ],
        "backward": [
            ("parameters", s["params"]),
            ("gradients", s["grads"]),
            ("optimizer states", s["optimizer"]),
            ("buffers", s["buffers"]),
            ("activations", activations),
            ("recomputed block", recompute),
        ],
        "optimizer step": [
            ("parameters", s["params"]),
            ("gradients", s["grads_at_step"]),
            ("optimizer states", s["optimizer"]),
            ("optimizer step", s["optimizer_step"] + s["optimizer_temporaries"]),
        ],
    }


def peak_memory(
    states: dict[str, int], activations: int, recompute: int, loss_backward: int, runtime: int, capacity: int
) -> Memory:
    at = phases(written(states), activations, recompute, loss_backward)
    phase = max(at, key=lambda name: at[name])
    allocated = phases(states, activations, recompute, loss_backward)
    return Memory(
        activations=activations,
        recompute=recompute,
        loss_backward=loss_backward,
        runtime=runtime,
        capacity=capacity,
        total=runtime + at[phase],
        peak_phase=phase,
        allocated=runtime + max(allocated.values()),
        **{"untouched": 0, "untouched_static": 0, **states},
    )


def written(states: dict[str, int]) -> dict[str, int]:
    """`states` as the device holds them: buffers less their never-written part (a CPU's)."""
    return {
        **states,
        "buffers": states["buffers"] - states.get("untouched", 0),
        "static": states["static"] - states.get("untouched_static", 0),
    }


class SampleBytes(NamedTuple):
    """What one more sequence of the micro batch adds at backward's start and inside a block."""

    at_start: int
    inside: int


def sample_bytes(model: ModelConfig, recompute: str, precision: str) -> SampleBytes:
    activations = activation_bytes(model, 1, recompute, precision)
    return SampleBytes(
        activations + loss_backward_bytes(model, 1), activations + recompute_bytes(model, 1, recompute, precision)
    )


def max_micro_batch(states: dict[str, int], runtime: int, capacity: int, per_sample: SampleBytes) -> int:
    """The largest micro batch that fits at every phase: activations, the loss's gradients
    and the recomputed block grow with it, model states and buffers do not; the optimizer
    step's transient must fit as well. 0 when not even the model states fit."""
    empty = phases(written(states), 0, 0, 0)
    if runtime + max(empty.values()) > capacity or not per_sample.inside:
        return 0
    room_start = (capacity - runtime - empty["loss backward"]) // per_sample.at_start
    room_inside = (capacity - runtime - empty["backward"]) // per_sample.inside
    return max(0, min(room_start, room_inside))


def _stage12_states(z: ZeroLayout, n: int, low: int) -> tuple[int, ...]:
    """ZeRO 1-2: (shard, params, grads, optimizer, step, buffers, static, untouched) in bytes."""
    # One flat low-precision buffer per parameter group, padded to a multiple of
    # 2 x dp elements (nccl_start_alignment_factor) so it splits into equal partitions.
    padded = -(-n // (2 * z.dp)) * (2 * z.dp)
    shard = padded // z.dp
    params = low * padded
    optimizer, step = 12 * shard, 4 * shard  # fp32 master + Adam m, v; fp32 grads in step()
    grads = low * (n if z.stage == 1 else shard)  # stage 1 reduces the full gradients at the boundary
    n_buckets = 2 if z.overlap_comm else 1
    buffers = low * z.reduce_bucket_size * n_buckets if z.contiguous_gradients else 0
    # every gradient passes through the buckets once a step: each is written up to n elements
    untouched = low * max(0, z.reduce_bucket_size - n) * n_buckets if z.contiguous_gradients else 0
    static = params + optimizer  # gradients and the ipg buckets are released after step()
    if z.fp32_grad_accum:  # BF16_Optimizer: a whole fp32 gradient buffer, kept; no ipg buckets
        grads, buffers, step, untouched = 4 * n, 0, 0, 0
        static += grads
    return shard, params, grads, optimizer, step, buffers, static, untouched


def _stage3_states(model: ModelConfig, z: ZeroLayout, tensors: Sequence, low: int) -> tuple[int, ...]:
    """ZeRO-3's (shard, params, grads, optimizer, step, gathered, buffers, static) per rank.

    Each parameter is split into ceil(numel / dp) elements per rank. Parameters of at most
    param_persistence_threshold elements also stay whole on every rank (dp > 1)."""
    n, dp = sum(p.numel for p in tensors), z.dp
    partitions = [-(-p.numel // dp) for p in tensors]
    shard = sum(partitions)
    kept = sum(persistent([p.numel for p in tensors], z.param_persistence_threshold)) if dp > 1 else 0
    params = low * (shard + kept)
    grads = low * shard  # the flat gradient partition buffer, kept between steps
    optimizer = 12 * shard
    # the step's fp32 gradients: one sub-group at a time on the device, the whole shard offloaded
    step = 4 * (shard if z.offload_optimizer else max(sub_groups(partitions, z.sub_group_size)))
    largest = max(module_sizes(model).values())
    live = min(n, max(largest, min(largest + z.prefetch_bucket_size, z.max_live_parameters)))
    gathered = low * live if dp > 1 else 0  # one rank's partition is the whole parameter
    ipg_bucket = low * z.reduce_bucket_size  # allocated once and kept
    return (
        shard,
        params,
        grads,
        optimizer,
        step,
        gathered,
        gathered + ipg_bucket,
        params + grads + optimizer + ipg_bucket,
    )


def sub_groups(partitions: list[int], sub_group_size: int) -> list[int]:
    """Elements of each sub-group ZeRO-3's optimizer steps at once. DeepSpeed cuts a rank's
    partitions, in the parameters' order, into sub-groups that each close at the first
    parameter taking them to sub_group_size elements or more; it makes the fp32 gradients
    of one sub-group, steps it and frees them before the next (DeepSpeed's configuration
    documentation: sub_group_size, the tile size of parameter processing)."""
    groups, current = [], 0
    for numel in partitions:
        current += numel
        if current >= sub_group_size:
            groups.append(current)
            current = 0
    if current or not groups:  # the last parameter closes the last sub-group
        groups.append(current)
    return groups


def zero_layout(spec: TrialSpec) -> ZeroLayout:
    z = spec.cfg.zero
    return ZeroLayout(
        stage=z.stage,
        dp=spec.dp,
        precision=spec.precision,
        reduce_bucket_size=z.reduce_bucket_size,
        overlap_comm=z.overlap_comm,
        contiguous_gradients=z.contiguous_gradients,
        prefetch_bucket_size=z.prefetch_bucket_size,
        max_live_parameters=z.max_live_parameters,
        param_persistence_threshold=z.param_persistence_threshold,
        sub_group_size=z.sub_group_size,
        offload_optimizer=z.offload_optimizer != "none",
        offload_param=z.offload_param != "none",
        adam_foreach=spec.cfg.hardware.device.is_gpu,
        lazy_pages=not spec.cfg.hardware.device.is_gpu,
        fp32_grad_accum=z.stage == 1 and spec.precision == "bf16" and z.grad_accum_dtype == "fp32",
    )
