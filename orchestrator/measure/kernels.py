"""A trial's kernels as torch calls, built from transformers' own modules in the layout
and dtype the model uses (orchestrator/workload/model.py builds the same layers), for
kernel_timing.py to time. Each `Kernel` takes the rows (tokens, or sequences x heads) to
run on, so a large one can be timed on part of them."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from orchestrator.config import ModelConfig
from orchestrator.plan.compute import layer_gemms
from orchestrator.plan.params import element_bytes
from orchestrator.workload.model import torch_dtype

MIN_ROWS = 256  # never timed on fewer rows: below this a kernel's time is not linear in them
GEMM_MIN_ROWS = 32  # a GEMM's: its time per row holds from a few dozen rows
# Memory-bound kernels' time is linear in the elements they stream, once past this many of
# the widest (256 rows of GPT-2 small's 3,072-wide FFN); wider layers need fewer rows.
MIN_ELEMENTS = 256 * 3072
# Wider outputs (a large vocabulary's lm_head) are timed on this many columns and scaled.
# Not fewer: the head's dX sums over them, and on a CPU its speed changes as its operand
# leaves the caches (the lm_head of an 8192 vocabulary timed on 1,024 columns came out 2x fast).
GEMM_MAX_N = 8192
# Deeper ones (a 175B model's 49,152-wide FFN) likewise on this many: past it a call's time
# grows in proportion to k (every output sums over it), and the whole weight would cost
# seconds to build and time for each plan of a model no CPU runs.
GEMM_MAX_K = 8192
# A narrow weight is timed on all its columns up to this many elements (a 128k vocabulary's
# lm_head on a 64-wide model: on 8,192 of its 128,256 columns its backward came out 3.9x
# fast, its 16 MB no longer fitting an 8 MB L3 whole).
GEMM_MAX_WEIGHT = GEMM_MAX_N * GEMM_MAX_K
# A device too slow to time a GEMM at those sizes within PROBE_S (bf16 through a CPU without
# bf16 instructions: 0.2 GFLOPS in GPT-2's [k, n] layout on one of ours) times it on fewer,
# halving the larger side down to this.
GEMM_MIN_SIDE = 1024


@dataclass(frozen=True)
class Kernel:
    """One kernel to time: `build(rows)` makes (forward, forward and backward) calls on
    `rows` of its leading dimension. Building is left to the timing: a kernel whose time
    is cached costs nothing (not even transformers' import)."""

    name: str  # what it is and its shape, without the rows: part of the cache key
    rows: int
    build: Callable[[int], tuple[Callable[[], object], Callable[[], object]]]
    min_rows: int = MIN_ROWS
    scale: float = 1.0  # the real kernel over the one built, in a dimension other than rows
    smaller: Kernel | None = None  # the same on a smaller shape (a larger scale), or None
    flops: float = 0.0  # the real kernel's forward FLOPs on all its rows (a GEMM's 2 m n k; 0: not counted)
    bytes: float = 0.0  # what its forward reads and writes at the least, where it is memory-bound (0: not counted)


GPT2_ACTIVATION = "gelu_pytorch_tanh"  # what workload/model.py gives GPT2Config


def import_libraries(arch: str) -> None:
    """Import what building any kernel of `arch` imports (torch, transformers' modules: 6 s on
    a 2-core CPU), before the first kernel is timed, so no timing runs beside an import: the
    engine's timing process imports while these do (engine_timing.py)."""
    import importlib

    from orchestrator.workload.model import import_libraries as import_model_libraries

    import_model_libraries(arch)
    for module in (
        "transformers.pytorch_utils",
        "transformers.activations",
        "transformers.models.llama.modeling_llama",
    ):
        importlib.import_module(module)


def _grads(outputs, inputs, grads):
    import torch

    return lambda: torch.autograd.grad(outputs(), inputs, grads)


def gemm(
    rows: int,
    n: int,
    k: int,
    conv1d: bool,
    bias: bool,
    precision: str,
    device: str,
    cols: int | None = None,
    depth: int = GEMM_MAX_K,
) -> Kernel:
    """y = x W (+ b) for x of [rows, k]: nn.Linear(k, n) ([n, k] weight) or transformers'
    Conv1D(n, k) (GPT-2's, [k, n]); its backward is autograd's dX and dW. Built on at most
    `cols` x `depth` of the weight and scaled; `smaller` halves the larger of the two (down
    to GEMM_MIN_SIDE), for a device too slow to time this one."""
    depth = min(k, depth)
    cols = min(n, cols if cols is not None else max(GEMM_MAX_N, GEMM_MAX_WEIGHT // depth))

    def build(r: int):
        import torch
        from transformers.pytorch_utils import Conv1D

        dtype = torch_dtype(precision)
        module = (Conv1D(cols, depth) if conv1d else torch.nn.Linear(depth, cols, bias=bias)).to(
            device=device, dtype=dtype
        )
        x = torch.randn(r, depth, device=device, dtype=dtype, requires_grad=True)
        dy = torch.randn(r, cols, device=device, dtype=dtype)
        return (lambda: module(x)), _grads(lambda: module(x), [x, *module.parameters()], dy)

    smaller = None
    if max(cols, depth) > GEMM_MIN_SIDE:
        wider = cols >= depth
        half = max(GEMM_MIN_SIDE, (cols if wider else depth) // 2)
        smaller = gemm(
            rows, n, k, conv1d, bias, precision, device, cols=half if wider else cols, depth=depth if wider else half
        )
    layout = "conv1d [k, n]" if conv1d else "linear [n, k]"
    cut_n = f" (timed on {cols})" if cols < n else ""
    cut_k = f" (timed on {depth})" if depth < k else ""
    return Kernel(
        f"gemm {layout}{' + bias' if conv1d or bias else ''} n={n}{cut_n} k={k}{cut_k}",
        rows,
        build,
        min_rows=GEMM_MIN_ROWS,
        scale=n / cols * k / depth,
        smaller=smaller,
        flops=2.0 * rows * n * k,
    )


def attention(model: ModelConfig, micro: int, precision: str, device: str) -> Kernel:
    """The attention core of one layer, causal: sdpa, or transformers' eager path (QK^T,
    additive mask, softmax in fp32, AV). Rows are sequences x heads."""
    s, d = model.seq_len, model.head_dim

    def build(r: int):
        import torch
        import torch.nn.functional as F

        dtype = torch_dtype(precision)
        mask = torch.full((s, s), torch.finfo(dtype).min, device=device, dtype=dtype).triu(1)

        def core(q, k, v):
            if model.attention == "sdpa":
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
            scores = torch.matmul(q, k.transpose(2, 3)) * d**-0.5 + mask
            return torch.matmul(F.softmax(scores, dim=-1, dtype=torch.float32).to(dtype), v)

        q, k, v = (torch.randn(1, r, s, d, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
        do = torch.randn(1, r, s, d, device=device, dtype=dtype)
        return (lambda: core(q, k, v)), _grads(lambda: core(q, k, v), [q, k, v], do)

    rows = micro * model.heads  # QK^T and AV: 4 s^2 d a row, of which a fused kernel runs the causal half
    return Kernel(
        f"attention {model.attention} causal s={s} d={d}",
        rows,
        build,
        min_rows=1,
        flops=4.0 * rows * s * s * d * (0.5 if model.attention == "sdpa" else 1.0),
    )


def memory_bound(model: ModelConfig, tokens: int, precision: str, device: str) -> Kernel:
    """One layer's memory-bound kernels: two norms and two residual adds, the activation
    (GPT-2's tanh GELU; Llama's SiLU(gate) x up) and Llama's rotary on Q and K."""
    h, f, llama = model.hidden, model.ffn, model.arch == "llama"
    heads, kv, d = model.heads, model.kv_heads or model.heads, model.head_dim

    def build(r: int):
        import torch
        from transformers.activations import ACT2FN
        from transformers.models.llama.modeling_llama import LlamaRMSNorm, apply_rotary_pos_emb

        dtype = torch_dtype(precision)
        norm = LlamaRMSNorm if llama else torch.nn.LayerNorm
        norms = [norm(h).to(device=device, dtype=dtype) for _ in range(2)]
        act = ACT2FN["silu" if llama else GPT2_ACTIVATION]

        def t(*shape, grad=True):
            return torch.randn(*shape, device=device, dtype=dtype, requires_grad=grad)

        x, gate, up = t(r, h), t(r, f), t(r, f)
        q, k, cos, sin = t(1, heads, r, d), t(1, kv, r, d), t(1, r, d, grad=False), t(1, r, d, grad=False)
        inputs = [x, gate, up, q, k] if llama else [x, gate]

        def forward():
            a = x + norms[0](x)
            out = [a + norms[1](a), act(gate) * up if llama else act(gate)]
            return [*out, *apply_rotary_pos_emb(q, k, cos, sin)] if llama else out

        outs = forward()
        grads = [torch.randn_like(o) for o in outs]
        return forward, _grads(forward, inputs, grads)

    return Kernel(
        f"memory-bound {model.arch} layer h={h} f={f}",
        tokens,
        build,
        min_rows=max(1, min(MIN_ROWS, -(-MIN_ELEMENTS // f))),
        bytes=tokens * element_bytes(precision) * (2 * h + f),
    )  # the forward reads x and the MLP's input


def loss(vocab: int, tokens: int, precision: str, device: str) -> Kernel:
    """transformers' causal LM loss: the logits upcast to fp32, cross-entropy."""

    def build(r: int):
        import torch
        import torch.nn.functional as F

        dtype = torch_dtype(precision)
        logits = torch.randn(r, vocab, device=device, dtype=dtype, requires_grad=True)
        labels = torch.randint(0, vocab, (r,), device=device)
        forward = lambda: F.cross_entropy(logits.float(), labels)  # noqa: E731
        return forward, lambda: torch.autograd.grad(forward(), [logits])

    return Kernel(f"loss vocab={vocab}", tokens, build, bytes=4.0 * tokens * vocab)  # the fp32 logits, read once


def block(model: ModelConfig, micro: int, recompute: str, precision: str, device: str) -> Kernel:
    """One real transformer block of the trial's model: transformers' GPT2Block or
    LlamaDecoderLayer, in its dtype, with activation recompute applied as the ranks apply it
    (workload/model.py), forward and backward through autograd on `micro` sequences. What a
    layer costs with everything between its kernels (autograd, the dispatcher, the modules'
    Python). Timed whole, never scaled: that cost is per call, not per row."""
    one_layer = dataclasses.replace(model, n_layers=1, vocab=64, tie_embeddings=False)

    def build(r: int):
        import torch

        from orchestrator.workload.model import apply_recompute, build_model

        dtype = torch_dtype(precision)
        lm = build_model(one_layer, device=device).to(dtype=dtype)
        apply_recompute(lm, recompute)
        lm.train()
        x = torch.randn(r, model.seq_len, model.hidden, device=device, dtype=dtype, requires_grad=True)
        if model.arch == "gpt2":
            layer = lm.transformer.h[0]
            call = lambda: layer(x)  # noqa: E731
        else:
            layer = lm.model.layers[0]
            positions = torch.arange(model.seq_len, device=device).unsqueeze(0)
            rotary = lm.model.rotary_emb(x, positions)
            call = lambda: layer(x, position_embeddings=rotary, position_ids=positions)  # noqa: E731

        def forward():
            out = call()
            return out[0] if isinstance(out, tuple) else out

        dy = torch.randn_like(forward())
        return forward, _grads(forward, [x, *layer.parameters()], dy)

    return Kernel(
        f"block {model.arch} h={model.hidden} f={model.ffn} heads={model.heads}/{model.kv_heads} "
        f"s={model.seq_len} {model.attention} recompute={recompute}",
        micro,
        build,
        min_rows=micro,
    )


def ends(model: ModelConfig, micro: int, precision: str, device: str) -> Kernel:
    """The real model without its blocks: the embeddings, the final norm, the lm_head and
    the loss (transformers' causal-LM loss), tied or not as the trial's, forward and
    backward on `micro` sequences. Timed whole, like `block`."""
    no_layers = dataclasses.replace(model, n_layers=0)

    def build(r: int):
        import torch

        from orchestrator.workload.model import build_model

        lm = build_model(no_layers, device=device).to(dtype=torch_dtype(precision))
        lm.loss_type = "ForCausalLM"  # what transformers picks anyway, said so it does not warn in the plan's output
        lm.train()
        ids = torch.randint(0, model.vocab, (r, model.seq_len), device=device)
        forward = lambda: lm(input_ids=ids, labels=ids).loss  # noqa: E731
        return forward, lambda: torch.autograd.grad(forward(), [p for p in lm.parameters() if p.requires_grad])

    return Kernel(
        f"ends {model.arch} h={model.hidden} vocab={model.vocab} s={model.seq_len} tied={model.tie_embeddings}",
        micro,
        build,
        min_rows=micro,
    )


def trial_gemms(model: ModelConfig, tokens: int) -> list[tuple[tuple[int, int, bool, bool], int]]:
    """((n, k, conv1d, bias), how many per layer) of one layer's GEMMs: GPT-2's are Conv1D
    with a bias, Llama's nn.Linear without."""
    gpt2 = model.arch == "gpt2"
    counts: dict[tuple[int, int, bool, bool], int] = {}
    for _, n, k in layer_gemms(model, tokens):
        key = (n, k, gpt2, gpt2)
        counts[key] = counts.get(key, 0) + 1
    return list(counts.items())


class TrialKernels(NamedTuple):
    """The kernels of one micro batch of a trial, as the plan composes them: each distinct GEMM
    of a layer with how many a layer has, the lm_head, one layer's attention and memory-bound
    kernels, the loss, and one block and the model's ends whole (with autograd)."""

    layer_gemms: list[tuple[Kernel, int]]
    head: Kernel
    attention: Kernel
    memory_bound: Kernel
    loss: Kernel
    block: Kernel
    ends: Kernel


def trial_kernels(model: ModelConfig, micro: int, recompute: str, precision: str, device: str) -> TrialKernels:
    tokens = micro * model.seq_len
    return TrialKernels(
        layer_gemms=[
            (gemm(tokens, n, k, conv1d, bias, precision, device), count)
            for (n, k, conv1d, bias), count in trial_gemms(model, tokens)
        ],
        head=gemm(tokens, model.vocab, model.hidden, False, False, precision, device),
        attention=attention(model, micro, precision, device),
        memory_bound=memory_bound(model, tokens, precision, device),
        loss=loss(model.vocab, tokens, precision, device),
        block=block(model, micro, recompute, precision, device),
        ends=ends(model, micro, precision, device),
    )


def launch(device: str) -> Kernel:
    """An add on one element: what any kernel costs before it does work."""

    def build(r: int):
        import torch

        x = torch.zeros(1, device=device)
        return (lambda: x.add_(1)), (lambda: x.add_(1))

    return Kernel("launch", 1, build, min_rows=1)


# What AdamW's step moves per fp32 element at the least: it reads the parameter, its gradient
# and both moments, and writes the parameter and the moments (Loshchilov & Hutter, 2019).
ADAMW_BYTES_PER_ELEMENT = 7 * 4


def adamw(tensors: list[int], device: str) -> Kernel:
    """torch's AdamW step over fp32 tensors of these sizes (the rank's share of each
    parameter), torch's default implementation for the device (foreach on CUDA). The
    forward call is the step; there is no backward. Rows are elements: timed on the
    leading tensors up to a few million and scaled."""
    total = sum(tensors)

    def build(r: int):
        import torch

        taken, sizes = 0, []
        for n in tensors:  # the leading tensors, the last one cut: r elements in all
            if taken >= r:
                break
            sizes.append(min(n, r - taken))
            taken += sizes[-1]
        params = [torch.zeros(n, device=device, requires_grad=True) for n in sizes]
        for p in params:
            p.grad = torch.randn_like(p)
        optimizer = torch.optim.AdamW(params, lr=1e-4)
        step = lambda: optimizer.step()  # noqa: E731
        return step, step

    return Kernel(
        f"adamw tensors={len(tensors)} elements={total}",
        total,
        build,
        min_rows=2**22,
        bytes=ADAMW_BYTES_PER_ELEMENT * total,
    )
