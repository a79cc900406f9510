"""The typed schema of a trial: one dataclass per Hydra config group.

This module owns the *shape* of the declarative surface. `conf/` holds the presets
(YAML files merged into these dataclasses), Hydra composes them with the user's
overrides, and OmegaConf rejects unknown keys and wrong types on the way. What a
value may be (ranges, cross-field rules) is checked in `spec.py`, which also derives the
numbers a trial needs. A field with a fixed set of values is a `StrEnum` declared just
above its dataclass: OmegaConf refuses any other value on composition, and the value still
compares equal to its string (`cfg.recompute.mode == "full"`).

Units: bucket sizes and parameter thresholds in elements (as DeepSpeed counts them),
batch sizes in sequences, memory in GiB, bandwidth in GB/s, latency in microseconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, cast


def _choices(name: str, values: list[str]) -> type[StrEnum]:
    """A StrEnum whose names are its values: OmegaConf matches a typed string by name, and
    some values ('core-complex', 'plan.mfu') are no Python identifier."""
    return cast(type[StrEnum], StrEnum(name, [(v, v) for v in values]))


class Arch(StrEnum):
    """The transformer family the workload builds (transformers' GPT2LMHeadModel / LlamaForCausalLM)."""

    gpt2 = "gpt2"
    llama = "llama"


class Attention(StrEnum):
    """sdpa: torch's fused scaled_dot_product_attention; eager: the s x s matrix materialised."""

    sdpa = "sdpa"
    eager = "eager"


@dataclass
class ModelConfig:
    arch: Arch = Arch.gpt2
    n_layers: int = 2
    hidden: int = 64
    heads: int = 4
    kv_heads: int | None = None  # null: = heads (no grouped-query attention)
    ffn_hidden: int | None = None  # null: 4 x hidden
    vocab: int = 512
    seq_len: int = 128
    max_positions: int = 128  # position embeddings (gpt2) / max_position_embeddings (llama)
    attention: Attention = Attention.sdpa
    dropout: float = 0.0  # every dropout of the model (GPT-2: residual, embedding, attention)
    tie_embeddings: bool = True
    rope_theta: float = 10000.0  # llama only
    norm_eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_width(self) -> int:
        """Width of K and V: kv_heads x head size (= hidden without grouped-query attention)."""
        return (self.kv_heads or self.heads) * self.head_dim

    @property
    def ffn(self) -> int:
        """The MLP's inner width (ffn_hidden, or 4 x hidden where it is null)."""
        return self.ffn_hidden or 4 * self.hidden


@dataclass
class WarmupConfig:
    start: int | None = None  # null: micro_batch_size x dp, the smallest global batch
    end: int = 32
    # The ramp's length: ramp_tokens tokens where set, else ramp_samples sequences (Megatron's
    # --rampup-batch-size unit: the same share of a run for a model of any sequence length).
    ramp_tokens: int | None = None
    ramp_samples: int | None = 256
    increment: int | None = None  # null: micro_batch_size x dp, the smallest step


@dataclass
class BatchConfig:
    micro_batch_size: int = 4
    global_batch_size: int | None = None  # null: micro_batch_size x dp (no accumulation)
    warmup: WarmupConfig | None = None


class RecomputeMode(StrEnum):
    """none: keep every activation; selective: keep the matmul and attention-kernel outputs,
    recompute the rest (torchtitan's op-level SAC); full: keep each layer's input only."""

    none = "none"
    selective = "selective"
    full = "full"


@dataclass
class RecomputeConfig:
    mode: RecomputeMode = RecomputeMode.none


class Offload(StrEnum):
    """Where ZeRO keeps optimizer states or parameters: on the device, or in host memory."""

    none = "none"
    cpu = "cpu"


class WireDtype(StrEnum):
    """A gradient dtype DeepSpeed can accumulate and reduce in."""

    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"


@dataclass
class ZeroConfig:
    stage: int = 0
    # Sizes typed Any so that 5e8 is accepted as written and a wrong value reaches
    # spec.py, which checks for a positive whole number and names the field.
    reduce_bucket_size: Any = 5e8
    allgather_bucket_size: Any = 5e8
    overlap_comm: bool = True
    contiguous_gradients: bool = True
    reduce_scatter: bool = True
    prefetch_bucket_size: Any = 5e7
    max_live_parameters: Any = 1e9
    param_persistence_threshold: Any = 1e5
    # Stage 3: the optimizer updates its partition this many elements at a time (DeepSpeed's
    # sub_group_size), so the step's fp32 gradients and AdamW's temporaries exist for one
    # sub-group at a time, not for the whole partition.
    sub_group_size: Any = 1e9
    offload_optimizer: Offload = Offload.none
    offload_param: Offload = Offload.none  # stage 3 only
    pin_memory: bool = True
    # The dtype gradients are reduced in (DeepSpeed's communication_data_type); null: the
    # dtype they are accumulated in, below.
    communication_dtype: WireDtype | None = None
    # The dtype gradients are accumulated in across micro batches (DeepSpeed's
    # data_types.grad_accum_dtype); null: the training precision.
    grad_accum_dtype: WireDtype | None = None


@dataclass
class ParallelConfig:
    dp: int = 2  # data-parallel degree = world size (no tensor/pipeline parallelism yet)
    # HSDP (Zhao et al., "PyTorch FSDP", 2023, hybrid sharding; torchtitan's dp_replicate):
    # the dp ranks form `replicate` groups of dp / replicate ranks; each group shards the
    # model among its ranks, and the groups hold replicas, all-reducing their gradient
    # shards. 1: one group of all dp ranks (plain FSDP). FSDP2 only (engine=fsdp, or
    # accelerate's FSDP), on a 2D device mesh (replicate, shard).
    replicate: int = 1
    # true: each shard group must lie within one node (the gathers and reduce-scatters on
    # NVLink, only the replicas' all-reduce between nodes); a layout that breaks it exits 2
    shard_within_node: bool = False


# torchrun's --numa-binding names; none: no binding.
NumaMode = _choices("NumaMode", ["none", "node", "socket", "exclusive", "core-complex"])


@dataclass
class NumaConfig:
    mode: NumaMode = NumaMode["none"]  # type: ignore[valid-type]  # made by _choices at run time


class EngineName(StrEnum):
    """What drives training: DeepSpeed directly, Hugging Face Accelerate, or torch's FSDP2
    (`fully_shard` per block, under torchrun; zero.stage 3 or 2 says whether parameters are
    resharded after the forward)."""

    deepspeed = "deepspeed"
    accelerate = "accelerate"
    fsdp = "fsdp"


class Backend(StrEnum):
    """What shards the model: DeepSpeed's ZeRO, or torch's FSDP2 (engine=accelerate chooses;
    engine=fsdp is always fsdp, engine=deepspeed always deepspeed)."""

    deepspeed = "deepspeed"
    fsdp = "fsdp"


class Sharding(StrEnum):
    """What shards and steps the model as it runs, whichever engine drives it (runs_as)."""

    zero = "zero"  # DeepSpeed's ZeRO: engine=deepspeed, or accelerate's DeepSpeed
    fsdp2 = "fsdp2"  # FSDP2's fully_shard: engine=fsdp, or accelerate's FSDP at zero.stage 2-3
    ddp = "ddp"  # accelerate's FSDP backend at zero.stage 0: DDP, nothing sharded


def runs_as(backend: str, stage: int) -> Sharding:
    """What a trial's model runs under, from engine.backend and zero.stage (engine=fsdp is
    always the fsdp backend, engine=deepspeed the deepspeed one): decided here, for the plan,
    its tables and plots, the engine's timing and the ranks."""
    if backend == Backend.deepspeed:
        return Sharding.zero
    return Sharding.fsdp2 if stage in (2, 3) else Sharding.ddp


@dataclass
class EngineConfig:
    name: EngineName = EngineName.deepspeed
    backend: Backend = Backend.deepspeed


class ClusterName(StrEnum):
    """local: torchrun (or accelerate launch) on this host; slurm: submitit on a SLURM cluster."""

    local = "local"
    slurm = "slurm"


@dataclass
class ClusterConfig:
    name: ClusterName = ClusterName.local
    gpus_per_node: int = 8
    cpus_per_task: int = 8
    sockets_per_node: int = 2  # for numa.mode=socket: --ntasks-per-socket = gpus_per_node / sockets
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time: str = "01:00:00"
    constraint: str | None = None
    setup: list[str] = field(default_factory=list)  # shell lines run before srun
    srun_args: list[str] = field(default_factory=list)
    # The interpreter every SLURM task runs, as a command: null is this one (sys.executable,
    # which must exist at the same path on the nodes, as a virtualenv on a shared file system
    # does); a name on the nodes' PATH (python3), or a container's ("apptainer exec img.sif python").
    python: str | None = None
    wait: bool = False  # block until the job ends (default: submit and return)
    signal_delay_s: int = 90  # SLURM signals this long before the time limit: checkpoint, requeue
    max_requeues: int = 3  # after this many time limits a trial ends as timeout
    # Memory per node in GB (sbatch --mem), or per GPU (--mem-per-gpu, e.g. "40G"): CPU
    # offload keeps optimizer states in host memory, which the default may not grant.
    mem_gb: float | None = None
    mem_per_gpu: str | None = None
    exclude: str | None = None  # nodes not to run on (--exclude=node[1-3])
    # A trial has its nodes to itself (sbatch --exclusive): a benchmark beside another job
    # on its node times that job too. false lets SLURM pack trials onto shared nodes.
    exclusive: bool = True
    gres: str | None = None  # generic resources (--gres=gpu:8), where the site wants them spelled out
    comment: str | None = None  # --comment, shown by squeue / sacct
    additional_parameters: dict[str, Any] = field(default_factory=dict)  # any sbatch option: {reservation: x}
    # hydra-submitit-launcher's names for time and max_requeues, accepted as aliases.
    timeout_min: int | None = None  # minutes; sets time
    max_num_timeout: int | None = None  # sets max_requeues


@dataclass
class PeakTflops:
    bf16: float | None = None
    fp16: float | None = None
    fp32: float | None = None


@dataclass
class LinkConfig:
    """One level of the network, as collectives reach it (plan/collectives.py). A cluster
    whose network is not its preset's says so here (hardware.inter_node.busbw_gbps=...),
    or measures it: `orchestrator calibrate --links`."""

    name: str = ""  # what it is, e.g. "8x InfiniBand NDR 400 Gb/s per node"
    busbw_gbps: float = 5.0  # GB/s per rank: nccl-tests' busbw at large sizes (all channels, all NICs)
    latency_us: float = 50.0  # per ring hop (NCCL's Simple protocol: 3.4 NVLink, 9.6 network)


class GemmSaturation(StrEnum):
    """Which dimension of a GEMM sets how close it comes to the device's rate (plan/compute.py)."""

    smallest = "smallest"  # min(m, n, k): a GPU needs many output tiles to fill its SMs and a long k loop per tile
    reduction = "reduction"  # k alone: one CPU thread has no SMs to fill; only short sums per output tile cost


class KernelSource(StrEnum):
    """Where the plan's compute times come from."""

    measured = "measured"  # the trial's own kernels, timed on this machine's device (hardware=auto sets it)
    preset = "preset"  # the preset's step-time parameters: to plan for hardware one does not have


class DeviceType(StrEnum):
    """The kind of device a rank trains on. What differs between the kinds and is known
    without touching a device is said here, once; the rank's own `Device`
    (workload/device.py) adds what needs the device itself."""

    cpu = "cpu"
    cuda = "cuda"

    @property
    def is_gpu(self) -> bool:
        return self is DeviceType.cuda

    @property
    def collective_backend(self) -> str:
        """torch.distributed's backend: NCCL reduces only GPU tensors, gloo host tensors."""
        return "nccl" if self.is_gpu else "gloo"


@dataclass
class HardwareConfig:
    name: str = "auto"  # auto | a preset name | your own name (then give peak_tflops)
    device: DeviceType = DeviceType.cpu
    peak_tflops: PeakTflops = field(default_factory=PeakTflops)  # dense; null on cpu: measured
    memory_gib: float | None = None  # null on cpu: the host's RAM
    # measured: the plan times the trial's kernels on this machine's device (kernel_timing.py)
    # and uses the parameters below only if that fails; preset: it estimates them from these.
    kernels: KernelSource = KernelSource.preset
    # The step-time model's parameters (plan/compute.py); each preset says where its come from.
    compute_efficiency: float = 0.5  # share of the peak a large GEMM reaches
    gemm_half_dim: float = 64.0  # a GEMM whose saturating dimension is this reaches half of compute_efficiency
    gemm_saturates_on: GemmSaturation | None = None  # null: reduction on a CPU, smallest on a GPU
    # A GEMM whose right operand is stored k x n (GPT-2's Conv1D forward, nn.Linear's dX);
    # null: as fast as any other. A CPU without native bf16 matmul runs it 5-10x slower,
    # and on one thread: on a CPU it is a share of one thread's peak.
    gemm_kn_efficiency: float | None = None
    # A GEMM whose smaller operand is this many MB runs at half its rate: neither operand
    # stays in the caches, so one is read again for every block of the other. Per rank (two
    # ranks on the 2-core CI machine run them as fast as one). Null: no such effect (a GPU's
    # GEMM libraries tile for its memory hierarchy).
    gemm_cache_mb: float | None = None
    attention_efficiency: float = 0.4  # fused attention's forward, share of the peak
    attention_backward_efficiency: float = 0.3  # its backward (which recomputes QK^T)
    memory_bandwidth_gbps: float | None = None  # device memory GB/s; null on cpu: measured
    memory_efficiency: float = 0.7  # share of the bandwidth memory-bound kernels reach
    op_overhead_us: float = (
        5.0  # fixed cost per kernel on the device: the gap between two on a GPU, dispatch and hooks on a CPU
    )
    # A GPU's host: its time to issue one kernel (the modules' Python, the dispatcher,
    # autograd, the launch), in parallel with the device's queue (plan/compute.py:
    # host_bound). 0: not modelled. Unused on a CPU, where the host is the device.
    host_op_us: float = 0.0
    calibrated_on: str | None = None  # set by `orchestrator calibrate`: what the parameters were fitted to
    # Where zero.offload_optimizer=cpu puts the optimizer step (ZeRO-Offload, Ren et al. 2021):
    # DeepSpeed's CPU Adam at the host's memory bandwidth, shared by the node's ranks, and
    # gradients down / parameters up over the host link. Assumed figures, not fitted.
    host_memory_bandwidth_gbps: float = 100.0
    host_link_gbps: float = 25.0  # PCIe 4.0 x16, one direction, per GPU
    intra_node: LinkConfig = field(default_factory=LinkConfig)
    inter_node: LinkConfig = field(default_factory=LinkConfig)
    # The network as it measured itself (plan/bus_table.py): a CSV of nccl-tests' bus bandwidth
    # by collective, node count, ranks per node and message size, which replaces the two
    # levels above wherever it has a curve. A path, or a file name beside the preset in
    # conf/hardware/; null: the levels alone.
    network: str | None = None
    # Fixed cost of each collective the engine issues, whatever its size (bucket copies,
    # launch): what makes many small buckets slower than a few large ones.
    collective_overhead_us: float = 0.0


class LoggerMode(StrEnum):
    """W&B's mode: offline writes run files to sync later; online needs an API key."""

    offline = "offline"
    online = "online"
    disabled = "disabled"


@dataclass
class LoggerConfig:
    mode: LoggerMode = LoggerMode.offline
    project: str = "orchestrator"
    entity: str | None = None
    group: str | None = None  # null: the sweep's directory name
    tags: list[str] = field(default_factory=list)


# run.objective: (where in result.json, the direction a sweeper takes it)
OBJECTIVES = {
    "tokens_per_sec_per_gpu": (("metrics", "tokens_per_sec_per_gpu"), "maximize"),
    "mfu": (("metrics", "mfu"), "maximize"),
    "tflops_per_gpu": (("metrics", "tflops_per_gpu"), "maximize"),
    "step_time_s": (("metrics", "step_time_s"), "minimize"),
    "plan.tokens_per_sec_per_gpu": (("plan", "time", "tokens_per_sec_per_gpu"), "maximize"),
    "plan.mfu": (("plan", "time", "mfu"), "maximize"),
    "plan.step_s": (("plan", "time", "step_s"), "minimize"),
}

Objective = _choices("Objective", list(OBJECTIVES))


class DataDtype(StrEnum):
    """The token ids' integer type in run.data."""

    uint16 = "uint16"
    uint32 = "uint32"


# How run.fail_at_step makes a rank fail: raise an error, exit(1), or run out of memory
# ('raise' is a Python keyword, hence the functional form).
FailMode = _choices("FailMode", ["raise", "exit", "oom", "grow"])


# AdamW's betas and eps, the same in every engine (DeepSpeed's config and torch's AdamW):
# GPT-3's (Brown et al., 2020, Appendix B).
ADAMW_BETAS = (0.9, 0.95)
ADAMW_EPS = 1e-8
GIB = 2**30  # bytes per GiB, for every module that counts memory


@dataclass
class RunConfig:
    steps: int = 10  # with timing_ci: the most steps
    warmup_steps: int = 2  # timing warm-up: excluded from the measured figures
    min_timed_steps: int = 1  # the fewest timed steps a trial reports (run.steps - warmup_steps at least this)
    # Step on until the timed steps' median is known to within this share (its 95 % interval's
    # half width over the median; timing_stats.py), at least min_timed_steps, at most run.steps.
    timing_ci: float | None = None
    seed: int = 1234
    # Which measurement of the same point this is: sweep it (run.repeat=range(3)) to run each
    # point that many times; `report` and W&B take the repeats as one point (their timed
    # steps pooled). It changes nothing in the trial itself.
    repeat: int = 0
    # Mixed precision, as DeepSpeed spells it (bf16.enabled / fp16.enabled); both off: fp32.
    bf16: bool = True
    fp16: bool = False
    lr: float = 3e-4
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    stop_on_nonfinite_loss: bool = True  # a NaN or infinite loss ends the trial as failed (false: flag it, train on)
    force: bool = False  # launch even when the plan predicts it will not fit
    # What a sampling sweeper (hydra/sweeper=optuna) optimises, read from result.json: a
    # measured metric, or plan.NAME for the plan's prediction (OBJECTIVES: the choices).
    objective: Objective = Objective["tokens_per_sec_per_gpu"]  # type: ignore[valid-type]  # made by _choices
    checkpoint_every: int = 0  # save the training state every N steps (0: only when SLURM warns of the end)
    timeout_min: float | None = None  # end the trial (status timeout) after this long
    # A collective that waits this long ends its rank (torch.distributed's process-group timeout;
    # null: torch's own, 10 minutes for NCCL). On SLURM a rank that dies ends the job's other
    # ranks at once (srun --kill-on-bad-exit); this bounds a rank that hangs instead.
    collective_timeout_s: float | None = None
    data: str | None = None  # binary file of token ids; null: synthetic tokens
    data_dtype: DataDtype = DataDtype.uint16
    # Tuning knobs (Bekman, Machine Learning Engineering Open Book, "Software tune-up"), each
    # applied for real and recorded.
    compile: bool = False  # torch.compile the model
    gc_collect_every: int = 0  # 0: Python's automatic gc; N: gc disabled, collected every N steps
    dataloader_workers: int = 0
    pin_memory: bool = False  # pinned host batches, copied with non_blocking=True
    expandable_segments: bool = True  # GPU only: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
    profile: bool = False  # torch.profiler trace (wait 1, warm-up 1, active 3 steps) in the trial dir
    # Debug: make rank `fail_rank` fail at step `fail_at_step` (raise | exit | oom: an allocation that cannot
    # succeed | grow: take host memory until the kernel's OOM killer ends it), to test failure handling.
    fail_at_step: int | None = None
    fail_rank: int = 0
    # Debug: sleep this long in every step, a slower step at no compute cost (tests of time limits).
    step_sleep_s: float = 0.0
    # Debug: only this rank sleeps run.step_sleep_s, a straggler the others wait for (null: every rank).
    slow_rank: int | None = None
    fail_mode: FailMode = FailMode["raise"]  # type: ignore[valid-type]  # made by _choices at run time


@dataclass
class TrialConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    batch: BatchConfig = field(default_factory=BatchConfig)
    recompute: RecomputeConfig = field(default_factory=RecomputeConfig)
    zero: ZeroConfig = field(default_factory=ZeroConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    numa: NumaConfig = field(default_factory=NumaConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    run: RunConfig = field(default_factory=RunConfig)


GROUPS = ("model", "batch", "recompute", "zero", "numa", "engine", "cluster", "hardware", "logger")
FIELD_GROUPS = ("parallel", "run")  # plain fields, no presets
