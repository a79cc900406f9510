"""The transformers model of a trial, built from its config (random init, no download)."""

from __future__ import annotations

import functools

from orchestrator.config import ModelConfig
from orchestrator.workload.transformers_compat import leave_scipy_unimported


def hf_config(m: ModelConfig):
    """A GPT2Config or LlamaConfig with the trial's shape.

    Dropout is model.dropout everywhere (0 by default, as in modern pre-training).
    GPT-2's GeLU is the fused tanh GeLU: the same function as "gelu_new", whose Python
    composite saves five copies of the 4h-wide tensor for backward. The activation
    model of the plan (plan/memory.py) assumes both.
    """
    from transformers import GPT2Config, LlamaConfig

    f = m.ffn
    if m.arch == "gpt2":
        return GPT2Config(
            vocab_size=m.vocab,
            n_positions=m.max_positions,
            n_embd=m.hidden,
            n_layer=m.n_layers,
            n_head=m.heads,
            n_inner=f,
            activation_function="gelu_pytorch_tanh",
            resid_pdrop=m.dropout,
            embd_pdrop=m.dropout,
            attn_pdrop=m.dropout,
            tie_word_embeddings=m.tie_embeddings,
            attn_implementation=m.attention,
            use_cache=False,
            bos_token_id=m.vocab - 1,
            eos_token_id=m.vocab - 1,
        )
    return LlamaConfig(
        vocab_size=m.vocab,
        hidden_size=m.hidden,
        intermediate_size=f,
        num_hidden_layers=m.n_layers,
        num_attention_heads=m.heads,
        num_key_value_heads=m.kv_heads or m.heads,
        max_position_embeddings=m.max_positions,
        attention_dropout=m.dropout,
        rms_norm_eps=m.norm_eps,
        rope_theta=m.rope_theta,
        tie_word_embeddings=m.tie_embeddings,
        attn_implementation=m.attention,
        use_cache=False,
    )


def torch_dtype(precision: str):
    """torch's dtype of a precision's name (bf16, fp16, fp32), decided here for the ranks and
    for everything that times what they run."""
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[precision]


def import_libraries(arch: str) -> None:
    """Import what `build_model` imports for `arch` (transformers' model module, its
    initialisation and DeepSpeed integration), building nothing."""
    import importlib

    leave_scipy_unimported()
    for module in (
        "torch",
        "transformers.initialization",
        "transformers.integrations",
        f"transformers.models.{arch}.modeling_{arch}",
    ):
        importlib.import_module(module)


def build_model(m: ModelConfig, device: str = "cpu", seed: int | None = None, zero3_config: dict | None = None):
    """The causal-LM model on `device` ("meta" builds shapes only, no memory).

    With `zero3_config` (a ZeRO-3 ds_config) the model is partitioned while it is built
    (deepspeed.zero.Init, through transformers' own integration), so no rank ever holds
    it whole: the only way a model larger than one host's memory can be built.

    With `seed`, the weights are transformers' initialisation drawn from that seed in
    module order, nothing drawn before: the same values built whole or partitioned, so
    every ZeRO stage starts from the same model (under ZeRO-3 rank 0 draws and the
    others receive; built whole, every rank draws the same).
    """
    import torch

    leave_scipy_unimported()
    from transformers import AutoModelForCausalLM
    from transformers.initialization import no_init_weights
    from transformers.integrations import HfDeepSpeedConfig, is_deepspeed_zero3_enabled

    config = hf_config(m)
    if zero3_config is not None or is_deepspeed_zero3_enabled():  # the latter: set by accelerate
        # DeepSpeed's zero.Init replaces torch.Tensor.__new__ while it is active; torch's
        # dynamo, imported lazily inside it, would then refuse the replaced signature.
        import torch._dynamo.polyfills.loader  # noqa: F401

        # transformers reads it through a weak reference: alive while the model is built
        keep = HfDeepSpeedConfig(zero3_config) if zero3_config is not None else None  # noqa: F841
        if seed is not None:
            torch.manual_seed(seed)
        return AutoModelForCausalLM.from_config(config)  # built partitioned, then initialised gathered
    with torch.device(device):
        if seed is None:
            return AutoModelForCausalLM.from_config(config)
        with no_init_weights():  # draw nothing while building: the init below draws everything
            model = AutoModelForCausalLM.from_config(config)
        torch.manual_seed(seed)
        model.init_weights()
    return model


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
    names = (
        "mm",
        "addmm",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
    )
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
