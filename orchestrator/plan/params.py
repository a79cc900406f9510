"""Every parameter tensor of the model a trial builds, from its shape alone.

The list mirrors the transformers implementations the workload instantiates
(GPT2LMHeadModel, LlamaForCausalLM), so its sum equals sum(p.numel()) of the real
model (tested on the meta device). Memory, FLOPs and ZeRO-3's per-module fetches and
persistence threshold all read from it.

For GPT-2 with f = 4h and tied embeddings the sum is the theory's
N = h*v + L(12h^2 + 13h) + 2h, plus the position embeddings P*h the theory leaves out.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from orchestrator.config import ModelConfig


@dataclass(frozen=True)
class ParamTensor:
    module: str  # the nn.Module that owns it: ZeRO-3 gathers module by module
    numel: int
    matmul: bool  # a weight of a matmul, so it costs 6 FLOPs per token in training


def persistent(numels: list[int], threshold: int) -> list[int]:
    """The tensors ZeRO-3 keeps whole on every rank (param_persistence_threshold): those of at
    most `threshold` elements."""
    return [n for n in numels if n <= threshold]


def parameter_tensors(m: ModelConfig) -> tuple[ParamTensor, ...]:
    return _tensors(m.arch, m.hidden, m.ffn, m.vocab, m.kv_width, m.max_positions, m.n_layers, m.tie_embeddings)


# Cached per shape: a sweep plans one model at many points, each plan reads the list
# several times, and a deep model has thousands of tensors.
@functools.lru_cache(maxsize=64)
def _tensors(
    arch: str, h: int, f: int, v: int, kv: int, max_positions: int, n_layers: int, tie_embeddings: bool
) -> tuple[ParamTensor, ...]:
    t = ParamTensor
    if arch == "gpt2":
        # Conv1D layers carry a bias; LayerNorm a weight and a bias.
        embed = [t("wte", v * h, matmul=tie_embeddings), t("wpe", max_positions * h, False)]
        layer = [
            t("ln_1", h, False),
            t("ln_1", h, False),
            t("attn.c_attn", h * 3 * h, True),
            t("attn.c_attn", 3 * h, False),
            t("attn.c_proj", h * h, True),
            t("attn.c_proj", h, False),
            t("ln_2", h, False),
            t("ln_2", h, False),
            t("mlp.c_fc", h * f, True),
            t("mlp.c_fc", f, False),
            t("mlp.c_proj", f * h, True),
            t("mlp.c_proj", h, False),
        ]
        final = [t("ln_f", h, False), t("ln_f", h, False)]
    else:
        embed = [t("embed_tokens", v * h, matmul=tie_embeddings)]
        layer = [
            t("input_layernorm", h, False),
            t("self_attn.q_proj", h * h, True),
            t("self_attn.k_proj", h * kv, True),
            t("self_attn.v_proj", h * kv, True),
            t("self_attn.o_proj", h * h, True),
            t("post_attention_layernorm", h, False),
            t("mlp.gate_proj", h * f, True),
            t("mlp.up_proj", h * f, True),
            t("mlp.down_proj", f * h, True),
        ]
        final = [t("norm", h, False)]
    layers = [ParamTensor(f"layers.{i}.{p.module}", p.numel, p.matmul) for i in range(n_layers) for p in layer]
    head = [] if tie_embeddings else [t("lm_head", v * h, True)]
    return tuple(embed + layers + final + head)


def element_bytes(precision: str) -> int:
    """Bytes of one parameter, gradient or activation element at a trial's precision."""
    return 4 if precision == "fp32" else 2


def count_parameters(m: ModelConfig) -> int:
    return sum(p.numel for p in parameter_tensors(m))


def matmul_parameters(m: ModelConfig) -> int:
    """Parameters used as matmul weights: the 6N of 6N FLOPs per token (lm_head included)."""
    return sum(p.numel for p in parameter_tensors(m) if p.matmul)


def module_sizes(m: ModelConfig) -> dict[str, int]:
    """Elements per module, the unit ZeRO-3 gathers."""
    sizes: dict[str, int] = {}
    for p in parameter_tensors(m):
        sizes[p.module] = sizes.get(p.module, 0) + p.numel
    return sizes
