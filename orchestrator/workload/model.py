"""The transformers model of a trial, built from its config (random init, no download)."""

from __future__ import annotations

import functools

from orchestrator.config import ModelConfig


def hf_config(m: ModelConfig):
    """A GPT2Config or LlamaConfig with the trial's shape.

    Dropout is model.dropout everywhere (0 by default, as in modern pre-training).
    GPT-2's GeLU is the fused tanh GeLU: the same function as "gelu_new", whose Python
    composite saves five copies of the 4h-wide tensor for backward. The activation
    model of the plan (plan/memory.py) assumes both.
    """
    from transformers import GPT2Config, LlamaConfig

    f = m.ffn_hidden or 4 * m.hidden
    if m.arch == "gpt2":
        return GPT2Config(vocab_size=m.vocab, n_positions=m.max_positions, n_embd=m.hidden, n_layer=m.n_layers,
                          n_head=m.heads, n_inner=f, activation_function="gelu_pytorch_tanh", resid_pdrop=m.dropout, embd_pdrop=m.dropout, attn_pdrop=m.dropout,
                          tie_word_embeddings=m.tie_embeddings, attn_implementation=m.attention, use_cache=False,
                          bos_token_id=m.vocab - 1, eos_token_id=m.vocab - 1)
    return LlamaConfig(vocab_size=m.vocab, hidden_size=m.hidden, intermediate_size=f, num_hidden_layers=m.n_layers,
                       num_attention_heads=m.heads, num_key_value_heads=m.kv_heads or m.heads,
                       max_position_embeddings=m.max_positions, attention_dropout=m.dropout, rms_norm_eps=m.norm_eps, rope_theta=m.rope_theta,
                       tie_word_embeddings=m.tie_embeddings, attn_implementation=m.attention, use_cache=False)


def build_model(m: ModelConfig, device: str = "cpu"):
    """The causal-LM model on `device` ("meta" builds shapes only, no memory)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device(device):
        return AutoModelForCausalLM.from_config(hf_config(m))


def apply_recompute(model, mode: str) -> None:
    """Activation recompute on every transformer block, as the plan models it.

    full: each block is checkpointed; backward re-runs it from its input.
    selective: each block is checkpointed with torch's selective activation checkpointing,
    keeping what is expensive to recompute (the outputs of the linear layers' matmuls and
    of the fused attention kernels) and recomputing the cheap, memory-heavy rest (norms,
    activations, dropout, and eager attention's s x s scores and softmax): Korthikanti's
    idea, as torchtitan applies it.
    """
    if mode == "none":
        return
    kwargs: dict = {"use_reentrant": False}
    if mode == "selective":
        from torch.utils.checkpoint import create_selective_checkpoint_contexts

        kwargs["context_fn"] = functools.partial(create_selective_checkpoint_contexts, _keep_matmul_outputs)
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs=kwargs)
    else:  # transformers < 5
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def _saved_ops() -> set:
    import torch

    aten = torch.ops.aten
    names = ("mm", "addmm", "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
             "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu")
    return {getattr(aten, n).default for n in names if hasattr(aten, n)}


def _keep_matmul_outputs(ctx, op, *args, **kwargs):
    from torch.utils.checkpoint import CheckpointPolicy

    if op in _SAVED:
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


class _LazySet:
    """The aten ops are looked up on first use, so importing this module needs no torch."""

    _ops: set | None = None

    def __contains__(self, op) -> bool:
        if self._ops is None:
            self._ops = _saved_ops()
        return op in self._ops


_SAVED = _LazySet()
