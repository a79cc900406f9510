"""Compute time of one micro batch, built from parts that can each be checked alone.

A transformer step is a list of kernels, and each kernel is bound by one of three things:

- **GEMMs** (the linear layers and the lm_head) run at a share of the peak that depends on
  their shape and layout. Large matrices reach `compute_efficiency`, except where the right
  operand is stored k x n, row by row of the summed dimension (`kn_efficiency`): GPT-2's
  Conv1D forward (transformers stores its weight [in, out]) and nn.Linear's dX = dY W.
  A GPU's GEMM libraries run every layout alike (kn_efficiency = compute_efficiency); a
  CPU without native bf16 matmul runs the kn layout 5-10x slower. The backward's two
  products (dX = dY W, dW = X^T dY) each have their own shape. A matrix whose saturating
  dimension d is small reaches less, d / (d + gemm_half_dim) of it. On a GPU d is the
  smallest of m, n, k (too few output tiles to fill the device, or too short a k loop per
  tile); on one CPU thread it is k, the length each output sums over (nothing to fill;
  the cost of loading and storing an output tile is spread over k). Where even the
  smaller operand outgrows the caches (`cache_bytes`, a CPU's), one of them is read again
  for every block of the other (the blocking argument of Goto and van de Geijn, 2008):
  the rate falls as 1 / (1 + smaller / cache_bytes). And no GEMM runs
  faster than its operands can be read: time = max(flops / rate, bytes / bandwidth), the
  roofline of Williams et al. (2009).
- **Attention** (QK^T, softmax, AV) runs at its own rate. A fused kernel (sdpa, flash
  attention; Dao 2022) skips the masked half of the causal square, and its backward
  recomputes QK^T: 2.5x the forward's FLOPs at `attention_backward_efficiency`. Eager
  attention multiplies the whole square as GEMMs and moves the s x s scores through
  memory (softmax, mask, its backward).
- **Memory-bound ops** (norms, activations, residual adds, rotary, the loss) move bytes:
  their time is bytes / (memory bandwidth x memory_efficiency). Eager, each torch op is a
  kernel that reads its inputs and writes its outputs: what the workload's own blocks move
  is counted op by op (`EAGER_LAYER_IO`, bench/kernel_census.py). Under torch.compile
  (`run.compile`) inductor fuses each chain of them into one kernel that reads its inputs
  and writes its outputs once (the `*_IO` counts), and launches fewer kernels.

Every kernel also pays a fixed cost on the device (`op_overhead_us`): the gap between two
kernels on a GPU, the dispatcher and engine hooks on a CPU. And on a GPU the host issues
each kernel before the device can run it (`host_op_us`: the modules' Python, the
dispatcher, autograd, the launch): the device runs ahead of the host through its queue
while its kernels are long, and waits for it while they are short, so a phase takes the
longer of the two (`host_bound`). That is what makes a small model slow on a fast GPU: on
an H100, transformers' GPT-2 at hidden 1024 and one sequence of 1024 runs at the pace of
its host (bench/RESULTS.md: "Host-bound steps on a GPU").

Recompute adds the forward again inside the backward: all of a layer's kernels for full
recompute; the kernels between the kept matmul and attention outputs for selective.

The parts (`KernelTimes`) come from one of two sources, composed alike by
`micro_batch_time`: measured on the device the trial will use (orchestrator/measure/kernel_timing.py,
as vTrain profiles each operator on the target GPU: Bang et al., MICRO 2024), or estimated
here from a preset's `Rates` (`estimated_kernels`), for hardware one does not have.
Everything here is a pure function of the model shape, the micro batch and the parts, so
each can be tested and fitted alone (bench/perf_check.py).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from orchestrator.config import ModelConfig

# Bytes one token moves through the memory-bound kernels of one layer, per element of
# width, forward + backward (read + write of each kernel's inputs and outputs):
NORM_IO = 2 + 3  # forward reads x, writes y; backward reads x and dy, writes dx
ADD_IO = 3 + 3  # a residual add reads two, writes one; its backward fans the gradient out
ACT_IO = 2 + 3  # GELU: like a norm
GATED_IO = 5 + 8  # SwiGLU: silu(gate), then x up: two kernels forward, their grads backward
ROPE_IO = 2 + 2
# Eager, what one block's memory-bound ops move per token, forward and backward, in bytes:
# a x hidden + b x ffn + c x kv width, by architecture and element size. The census of
# transformers' own GPT-2 and Llama blocks (bench/kernel_census.py: every aten op's inputs
# and outputs, GEMMs, attention and views left out; torch 2.13, transformers 5.23). Llama's
# RMSNorm upcasts to fp32 and makes seven passes, its rotary four; GPT-2's LayerNorm and
# GELU are one kernel each. The fused counts above are 44 h + 10 ffn (GPT-2) and 52 h +
# 26 ffn + 8 kv (Llama) in bf16.
EAGER_LAYER_IO = {
    ("gpt2", 2): (66.33, 12.02, 0.0),
    ("gpt2", 4): (132.66, 24.03, 0.0),
    ("llama", 2): (359.23, 28.0, 53.33),
    ("llama", 4): (437.99, 56.0, 106.67),
}
# The loss per token and vocabulary entry, in fp32 as transformers computes it: the logits
# upcast, log_softmax written, nll's gradient, log_softmax's backward, the downcast.
LOSS_BYTES_PER_VOCAB = 36
# Kernels one layer launches (forward, backward) and the model's ends (embeddings, final
# norm, head, loss) forward and backward: counted by torch.profiler on CUDA with torch 2.11
# and transformers 5.17 (bench/gpu_host.py; bench/data/gpu/h100-host.json). A GPT-2 block
# run alone launches 10 + 23, inside the model 46 a layer (the slope over 4 to 24 layers);
# Llama's 38 + 75 and 124. What the host issues one by one; software, not the machine, sets it.
LAYER_KERNELS = {"gpt2": (10, 36), "llama": (38, 86)}
ENDS_KERNELS = {"gpt2": 37, "llama": 58}
ENDS_FORWARD_KERNELS = 10  # the embeddings' gather, final norm, head, upcast and cross-entropy
# Of a block's kernels, the share torch.compile (inductor) still launches: the block's
# forward and backward profiled on a CPU, eager and compiled, kernels that move data counted
# alike (bench/kernel_census.py --compiled; torch 2.13): GPT-2 48 -> 45 (its LayerNorm and
# GELU are one kernel each already, and transformers' attention breaks the graph), Llama
# 139 -> 47 (RMSNorm, rotary and SwiGLU each fused into one). Inductor fuses a CPU's kernels
# as it fuses a GPU's (the same scheduler; GEMMs and attention stay library calls on both).
# The model's ends are kept at their eager count.
COMPILED_KERNEL_SHARE = {"gpt2": 45 / 48, "llama": 47 / 139}
FORWARD_SHARE = 0.4  # of a memory-bound kernel's bytes, the forward moves about 2 in 5 (the *_IO counts)


@dataclass(frozen=True)
class Rates:
    """What one rank's device does per second, and the fixed cost of each kernel."""

    peak_flops: float  # dense FLOP/s at the trial's precision
    compute_efficiency: float  # share of the peak a large GEMM reaches
    kn_efficiency: float  # the same where the right operand is stored k x n (row-major over the sum)
    gemm_half_dim: float  # a GEMM whose saturating dimension is this reaches half of that
    cache_bytes: float  # a GEMM whose smaller operand is this large runs at half its rate (inf: no effect)
    saturate_on_reduction: bool  # the saturating dimension is k alone (a CPU), else min(m, n, k)
    attention_efficiency: float  # fused attention forward, share of the peak
    attention_backward_efficiency: float
    memory_bytes_per_s: float  # memory-bound kernels: bandwidth x memory_efficiency
    op_overhead_s: float  # fixed cost per kernel on the device
    host_op_s: float = 0.0  # the host's time to issue one kernel; 0: the host is the device (a CPU)


@dataclass(frozen=True)
class ComputeTime:
    """Seconds of one micro batch on one rank, by kind of kernel (recompute included)."""

    gemm_s: float
    attention_s: float
    memory_bound_s: float
    overhead_s: float  # estimated plans: the fixed cost per kernel (a timed kernel holds its own)
    forward_s: float  # the forward pass alone (all kinds)
    backward_s: float  # the backward, with what recompute does again
    kernels: int
    timed: bool = False  # the kernels were timed on the device, not estimated from a preset
    # What lies between the kernels: the real blocks' and the model's ends' time (timed whole,
    # with autograd) less the sum of their kernels. None where they were not timed whole.
    between_s: float | None = None
    engine_s: float = 0.0  # what the engine adds around the forward and backward (hooks, buckets), timed
    # Estimated GPU plans: the host's time to issue the micro batch's kernels, and what the
    # device waits for it beyond its own kernels (the phases it is slower than the device).
    host_s: float = 0.0
    host_wait_s: float = 0.0

    @property
    def total_s(self) -> float:
        return self.forward_s + self.backward_s

    def as_dict(self) -> dict:
        return {**asdict(self), "total_s": self.total_s}


def gemm_time(m: int, n: int, k: int, r: Rates, element_bytes: int, kn: bool = False) -> float:
    """An (m x k) @ (k x n) product: the roofline of its FLOPs and the bytes it reads and writes.
    kn: the right operand is stored k x n (row-major), not n x k as nn.Linear's weight."""
    d = k if r.saturate_on_reduction else min(m, n, k)
    efficiency = r.kn_efficiency if kn else r.compute_efficiency
    smaller = element_bytes * min(m * k, k * n)  # of the two operands
    rate = r.peak_flops * efficiency * d / (d + r.gemm_half_dim) / (1 + smaller / r.cache_bytes)
    bytes_moved = element_bytes * (m * k + k * n + m * n)
    return max(2.0 * m * n * k / rate, bytes_moved / r.memory_bytes_per_s)


def layer_gemms(model: ModelConfig, tokens: int) -> list[tuple[int, int, int]]:
    """(m, n, k) of each forward GEMM of one layer, for `tokens` tokens."""
    h, f, kv = model.hidden, model.ffn, model.kv_width
    if model.arch == "gpt2":
        return [(tokens, 3 * h, h), (tokens, h, h), (tokens, f, h), (tokens, h, f)]
    return [
        (tokens, h, h),
        (tokens, kv, h),
        (tokens, kv, h),
        (tokens, h, h),
        (tokens, f, h),
        (tokens, f, h),
        (tokens, h, f),
    ]


def backward_gemm_time(m: int, n: int, k: int, r: Rates, element_bytes: int, conv1d: bool = False) -> float:
    """The backward of a forward (m x k) @ (k x n): dX = dY (m x n) @ W^T sums over n, and
    reads nn.Linear's [n, k] weight row by row of n (kn), Conv1D's [k, n] one transposed;
    dW = X^T @ dY sums over m, its operands read column-wise (as fast as the forward)."""
    return gemm_time(m, k, n, r, element_bytes, kn=not conv1d) + gemm_time(n, k, m, r, element_bytes)


def attention_time(model: ModelConfig, micro: int, r: Rates, element_bytes: int) -> tuple[float, float]:
    """(forward, backward) seconds of one layer's attention core for `micro` sequences."""
    s, h, heads = model.seq_len, model.hidden, model.heads
    square = 4.0 * micro * s * s * h  # QK^T and AV over the whole s x s square
    if model.attention == "sdpa":  # fused: the masked half skipped; the backward recomputes QK^T
        fwd = 0.5 * square / (r.peak_flops * r.attention_efficiency)
        bwd = 2.5 * 0.5 * square / (r.peak_flops * r.attention_backward_efficiency)
        return fwd, bwd
    # eager: batched GEMMs over the whole square, and the scores through memory
    # (scale + mask + softmax forward; softmax backward), in the activations' precision.
    per_head = [(s, s, model.head_dim), (s, model.head_dim, s)]
    # Their layouts are not modelled: every batched product at compute_efficiency.
    gemms = micro * heads * sum(gemm_time(a, b, c, r, element_bytes) for a, b, c in per_head)
    scores = micro * heads * s * s * element_bytes
    return gemms + 4 * scores / r.memory_bytes_per_s, 2 * gemms + 3 * scores / r.memory_bytes_per_s


def memory_bound_bytes_per_token(model: ModelConfig, element_bytes: int, fused: bool = False) -> tuple[float, float]:
    """(one layer, the loss) bytes moved per token, forward + backward, by memory-bound kernels:
    eager as the census counted the workload's blocks, or `fused` as torch.compile's kernels
    (each fused chain reads its inputs and writes its outputs once)."""
    h, f, kv = model.hidden, model.ffn, model.kv_width
    eager = EAGER_LAYER_IO.get((model.arch, element_bytes))
    if not fused and eager is not None:
        a, b, c = eager
        return a * h + b * f + c * kv, LOSS_BYTES_PER_VOCAB * model.vocab
    if model.arch == "gpt2":
        layer = 2 * NORM_IO * h + 2 * ADD_IO * h + ACT_IO * f
    else:
        layer = 2 * NORM_IO * h + 2 * ADD_IO * h + GATED_IO * f + ROPE_IO * (h + kv)
    return layer * element_bytes, LOSS_BYTES_PER_VOCAB * model.vocab


@dataclass(frozen=True)
class KernelTimes:
    """Seconds of one micro batch's kernels as timed on the device itself
    (orchestrator/measure/kernel_timing.py): the same parts the roofline estimates, measured."""

    layer_gemms: tuple[float, float]  # (forward, backward) of one layer's GEMMs
    head: tuple[float, float]  # the lm_head's GEMM
    attention: tuple[float, float]  # one layer's attention core
    memory_bound: tuple[float, float]  # one layer's norms, activation, residual adds, rotary
    loss: tuple[float, float]  # the loss over the vocabulary
    launch_s: float  # an empty kernel: the floor under every kernel a step launches
    host_op_s: float = 0.0  # estimates: the host's time to issue one kernel (timed blocks hold it)
    # One real block (recompute included) and the model without its blocks, each timed whole:
    # None where they are too large to time here (the step is then its kernels' sum).
    block: tuple[float, float] | None = None
    ends: tuple[float, float] | None = None
    # A GPU's host: one block's and the ends' (forward, backward) timed whole on 8 tokens,
    # where every kernel is shorter than its issuing, so the time is the host's. None on a CPU.
    host_block: tuple[float, float] | None = None
    host_ends: tuple[float, float] | None = None


def estimated_kernels(
    model: ModelConfig, micro: int, r: Rates, element_bytes: int, compiled: bool = False
) -> KernelTimes:
    """The roofline's estimate of the same parts, from a preset's (or calibrated) Rates;
    `compiled`: torch.compile's fused memory-bound kernels."""
    tokens = micro * model.seq_len
    conv1d = model.arch == "gpt2"  # transformers' GPT-2 stores its layers' weights [in, out]
    shapes = layer_gemms(model, tokens)
    layer_bytes, loss_bytes = memory_bound_bytes_per_token(model, element_bytes, fused=compiled)
    mem, loss = tokens * layer_bytes / r.memory_bytes_per_s, tokens * loss_bytes / r.memory_bytes_per_s
    return KernelTimes(
        layer_gemms=(
            sum(gemm_time(m, n, k, r, element_bytes, kn=conv1d) for m, n, k in shapes),
            sum(backward_gemm_time(m, n, k, r, element_bytes, conv1d) for m, n, k in shapes),
        ),
        head=(
            gemm_time(tokens, model.vocab, model.hidden, r, element_bytes),
            backward_gemm_time(tokens, model.vocab, model.hidden, r, element_bytes),
        ),
        attention=attention_time(model, micro, r, element_bytes),
        memory_bound=(FORWARD_SHARE * mem, (1 - FORWARD_SHARE) * mem),
        loss=(FORWARD_SHARE * loss, (1 - FORWARD_SHARE) * loss),
        launch_s=r.op_overhead_s,
        host_op_s=r.host_op_s,
    )


def kernel_counts(model: ModelConfig, recompute: str, compiled: bool = False) -> tuple[int, int]:
    """(forward, backward) kernels one micro batch launches; recompute runs a layer's
    forward again in the backward (full), or about half its kernels (selective); compiled,
    a block launches the share of them inductor leaves."""
    fwd, bwd = LAYER_KERNELS.get(model.arch, LAYER_KERNELS["gpt2"])
    if compiled:
        share = COMPILED_KERNEL_SHARE.get(model.arch, 1.0)
        fwd, bwd = round(fwd * share), round(bwd * share)
    ends = ENDS_KERNELS.get(model.arch, ENDS_KERNELS["gpt2"])
    redo = fwd if recompute == "full" else fwd // 2 if recompute == "selective" else 0
    return model.n_layers * fwd + ENDS_FORWARD_KERNELS, model.n_layers * (bwd + redo) + ends - ENDS_FORWARD_KERNELS


def host_bound(device_s: float, kernels: int, host_op_s: float) -> float:
    """Seconds of a phase whose `kernels` the host issues at host_op_s each while the device
    runs them (device_s in all) from its queue: the slower of the two sets the pace. The
    queue is deep (CUDA's holds about a thousand launches), so the host runs ahead through
    long kernels and the device waits through short ones; the phase ends when both are done."""
    return max(device_s, kernels * host_op_s)


def micro_batch_time(
    model: ModelConfig,
    micro: int,
    recompute: str,
    k: KernelTimes,
    *,
    timed: bool = False,
    engine: tuple[float, float] = (0.0, 0.0),
    compiled: bool = False,
) -> ComputeTime:
    """Forward and backward of one micro batch of `micro` sequences on one rank. Where a real
    block and the model's ends were timed whole, the micro batch is layers x block + ends,
    and its kernels' sum says where that time goes (the rest lies between them); else it is
    composed from its kernels' times. timed: the times were measured on the device, so they
    hold each kernel's launch already; estimated ones pay k.launch_s per kernel on top.
    engine: (forward, backward) seconds the engine adds around them (timed as it runs).
    compiled: torch.compile's kernel counts (their times, fused, are in `k`)."""
    layers = model.n_layers
    kernels_fwd, kernels_bwd = kernel_counts(model, recompute, compiled)
    # What recompute runs again in the backward: the whole layer forward (full), or the
    # memory-bound kernels between the kept matmul and attention outputs (selective).
    full = recompute == "full"
    redo_mem = layers * k.memory_bound[0] if recompute != "none" else 0.0
    gemm_fwd = layers * k.layer_gemms[0] + k.head[0]
    gemm = gemm_fwd + layers * k.layer_gemms[1] + k.head[1] + (layers * k.layer_gemms[0] if full else 0.0)
    attention = layers * (sum(k.attention) + (k.attention[0] if full else 0.0))
    memory_bound = layers * sum(k.memory_bound) + sum(k.loss) + redo_mem
    launch = 0.0 if timed else k.launch_s
    overhead = (kernels_fwd + kernels_bwd) * launch
    forward = gemm_fwd + layers * (k.attention[0] + k.memory_bound[0]) + k.loss[0] + kernels_fwd * launch
    total = gemm + attention + memory_bound + overhead
    host = (kernels_fwd + kernels_bwd) * k.host_op_s
    if k.host_op_s and not timed:
        paced_fwd = host_bound(forward, kernels_fwd, k.host_op_s)
        paced_total = paced_fwd + host_bound(total - forward, kernels_bwd, k.host_op_s)
        host_wait, forward, total = max(0.0, paced_total - total), paced_fwd, paced_total
    else:
        host_wait = 0.0
    between = None
    if k.block is not None and k.ends is not None:
        forward = layers * k.block[0] + k.ends[0]
        between, total = forward + layers * k.block[1] + k.ends[1] - total, forward + layers * k.block[1] + k.ends[1]
    if k.host_block is not None and k.host_ends is not None:
        # A GPU's host issues the kernels and runs the engine's hooks while the device works
        # through its queue: each phase takes the longer of the two (bench/RESULTS.md).
        host_fwd = layers * k.host_block[0] + k.host_ends[0] + engine[0]
        host_bwd = layers * k.host_block[1] + k.host_ends[1] + engine[1]
        paced_fwd, paced_bwd = max(forward, host_fwd), max(total - forward, host_bwd)
        host, host_wait = host_fwd + host_bwd, max(0.0, paced_fwd + paced_bwd - total)
        forward, total = paced_fwd, paced_fwd + paced_bwd
        on_device = (0.0, 0.0)  # the hooks are in the host's time
    else:
        on_device = engine  # a CPU: the hooks run between the kernels, on the same cores
    return ComputeTime(
        gemm_s=gemm,
        attention_s=attention,
        memory_bound_s=memory_bound,
        overhead_s=overhead,
        forward_s=forward + on_device[0],
        backward_s=total - forward + on_device[1],
        kernels=kernels_fwd + kernels_bwd,
        timed=timed,
        between_s=between,
        engine_s=sum(engine),
        host_s=host,
        host_wait_s=host_wait,
    )
