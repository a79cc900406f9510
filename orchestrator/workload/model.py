"""The transformers model of a trial, built from its config (random init, no download)."""

from __future__ import annotations

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
