"""Activation memory per rank: what a micro batch keeps for its backward, layer by layer, by
recompute mode (Korthikanti et al., 2022, "Reducing Activation Recomputation in Large
Transformer Models": the per-layer terms, with selective recompute dropping attention's
s x s tensors), what one block rebuilt during backward holds, and the loss's fp32 gradients
at backward's start. memory.py composes them with the model states into the peak.
"""

from __future__ import annotations

from orchestrator.config import ModelConfig
from orchestrator.plan.params import element_bytes


def activation_bytes(model: ModelConfig, micro_batch: int, recompute: str, precision: str) -> int:
    """Bytes saved for backward by one micro batch, alive when its forward returns."""
    s, b, h, v = model.seq_len, micro_batch, model.hidden, model.vocab
    act = element_bytes(precision)
    boundary = act * s * b * h  # a block's input, what full recompute keeps per layer
    if recompute == "full":
        layers = model.n_layers * boundary
    else:
        layers = model.n_layers * activations_per_layer(model, micro_batch, recompute, precision)
    # The final norm, the lm_head input, then the loss: transformers upcasts the logits
    # to fp32 and log_softmax saves its fp32 output (the "logits in fp32" of the theory).
    # The logits themselves die with the model output, which the training step drops.
    head = norm_saved_bytes(model, micro_batch, precision) + boundary + 4 * s * b * v
    if model.arch != "gpt2":  # RoPE's cos and sin, computed once per forward
        head += 2 * act * s * model.head_dim
    return int(layers + head)


def norm_saved_bytes(model: ModelConfig, micro_batch: int, precision: str) -> int:
    """What one norm layer saves: LayerNorm its input and fp32 mean / rstd; transformers'
    LlamaRMSNorm its fp32 upcast, the normalised copy and the fp32 rsqrt."""
    sb, h = model.seq_len * micro_batch, model.hidden
    act = element_bytes(precision)
    if model.arch == "gpt2":
        return act * sb * h + 2 * 4 * sb
    return 4 * sb * h + act * sb * h + 4 * sb


def recompute_bytes(model: ModelConfig, micro_batch: int, recompute: str, precision: str) -> int:
    """What backward rebuilds on top of the saved activations: one block at a time.

    Full recompute re-runs a whole block's forward (its activations exist while that
    block's backward runs); selective re-runs the parts its policy dropped.
    """
    if recompute == "none":
        return 0
    whole = activations_per_layer(model, micro_batch, "none", precision)
    if recompute == "full":
        return whole
    return max(0, whole - activations_per_layer(model, micro_batch, "selective", precision))


def activations_per_layer(model: ModelConfig, micro_batch: int, recompute: str, precision: str) -> int:
    """Bytes one transformer block saves for backward, as transformers' code saves them.

    GPT-2 with eager attention and dropout is exactly Korthikanti et al.'s
    34sbh + 5as^2b (bf16): LayerNorm inputs 4, c_attn input 2, Q K V 6, c_proj input 2,
    c_fc input 2, GeLU input and output 16, two residual dropout masks 2 (1 byte each);
    softmax output 2, attention dropout mask 1 and its output 2 per a*s^2*b. Without
    dropout the masks and the dropped copy go. sdpa (flash / memory-efficient kernels)
    saves its output and a row log-sum-exp instead of any s x s tensor, and draws its
    dropout from the RNG instead of a mask.

    Selective recompute (workload/model.py's policy) keeps the block's input, the outputs
    of the linear layers' matmuls and of the fused attention kernel, and recomputes the
    rest: for eager attention the whole s^2 term goes (Korthikanti's point), with sdpa the
    norms, activations and their copies do. Full recompute is handled by the caller.
    """
    s, b, h = model.seq_len, micro_batch, model.hidden
    a, f, kv = model.heads, model.ffn, model.kv_width
    act = element_bytes(precision)
    sbh, sbf, as2b = s * b * h, s * b * f, a * s * s * b
    dropout = model.dropout > 0
    fused = act * sbh + 4 * a * s * b if model.attention == "sdpa" else 0  # flash output + log-sum-exp (fp32)
    if recompute == "selective":
        qkv = 3 * sbh if model.arch == "gpt2" else sbh + 2 * s * b * kv
        mlp_outputs = sbf if model.arch == "gpt2" else 2 * sbf  # c_fc / gate and up
        return int(act * (sbh + qkv + sbh + mlp_outputs + sbh) + fused)  # input, qkv, out proj, mlp, down proj
    if model.attention == "eager":
        core = act * as2b + (as2b + act * as2b if dropout else 0)  # softmax out (+ mask, dropped copy)
        if model.arch != "gpt2" and act != 4:
            core += 4 * as2b  # Llama's eager softmax runs in fp32 and saves that output too
    else:
        core = fused
    norms = 2 * norm_saved_bytes(model, micro_batch, precision)
    if model.arch == "gpt2":
        # The norms' outputs are c_attn's and c_fc's inputs. sdpa returns its output in
        # (b, s, a, d) layout, so c_proj's input is a view of it; eager's matmul output
        # needs a transposed copy.
        attn = act * sbh + act * 3 * sbh + (act * sbh if model.attention == "eager" else 0)
        mlp = act * sbh + 2 * act * sbf  # c_fc input, GeLU input, GeLU output
        masks = 2 * sbh if dropout else 0  # residual dropouts after attention and MLP
    else:
        # SwiGLU saves gate, up, SiLU(gate) and their product. GQA: K and V are kv wide
        # (sdpa's enable_gqa, no repeat); o_proj's input is a view of the attention output.
        attn = 2 * act * sbh + act * (sbh + 2 * s * b * kv)  # q/k/v and gate/up inputs; Q, K, V after RoPE
        if model.attention == "eager":  # K and V repeated to every head (repeat_kv); o_proj's input copied
            attn += act * (2 * sbh - 2 * s * b * kv) + act * sbh
        mlp = 4 * act * sbf
        masks = 0  # Llama's only dropout is inside attention
    return int(norms + attn + mlp + masks + core)


def loss_backward_bytes(model: ModelConfig, micro_batch: int) -> int:
    """The transient at the start of backward, on top of the saved activations: the fp32
    gradients of nll_loss and of log_softmax, each s x b x V (transformers upcasts the
    logits; the fp32 log-softmax they differentiate is already among the activations).
    Measured on CPU: a 128k vocabulary starts its backward about 3 x 4sbV above baseline."""
    return 2 * 4 * model.seq_len * micro_batch * model.vocab
