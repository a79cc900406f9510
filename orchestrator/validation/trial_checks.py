"""The rules of a trial's fields, one check per concern: each raises ConfigError naming the
field, the value and what is allowed (with the nearest valid value where there is one), before
anything starts. The checks run on the trial's own typed copy of its config
(checks.typed_config), and fill in what a null means (`kv_heads` is `heads`, a warm-up's start
is the smallest global batch) where a later stage reads the number.

spec.spec_from runs them in order; the cluster group's rules are cluster_checks.py's, a
value's own (a whole number, a choice, finite) checks.py's.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re

from orchestrator import hardware_presets, network_table
from orchestrator.config import KernelSource, TrialConfig
from orchestrator.core.errors import ConfigError
from orchestrator.hydra_glue.conf_tree import presets
from orchestrator.hydra_glue.hydra_registry import override_key
from orchestrator.token_file import check_token_file
from orchestrator.validation.checks import at_most, check_choice, positive, whole_number

# Bounds far past any real run that keep the plan and the ranks from building lists of
# that length (a per-layer tensor list, a per-step batch list).
MAX_LAYERS = 10_000
MAX_STEPS = 10_000_000
MAX_DP = 1_048_576
MAX_REPEAT = 1000  # repeats of one point: past this a sweep is measuring the machine, not the trial
MAX_SEED = 2**32 - 1  # numpy's generators take no larger seed
MAX_TAG = 64  # W&B refuses longer tags
MAX_COLLECTIVE_TIMEOUT_S = 86_400


def check_model(cfg: TrialConfig) -> None:
    m = cfg.model
    for name in ("n_layers", "hidden", "heads", "vocab", "max_positions"):
        positive(getattr(m, name), f"model.{name}")
    at_most(m.n_layers, "model.n_layers", MAX_LAYERS)
    if m.hidden % m.heads:
        raise ConfigError("model.heads", m.heads, f"must divide model.hidden={m.hidden} (head size = hidden / heads)")
    if m.kv_heads is None:
        m.kv_heads = m.heads
    positive(m.kv_heads, "model.kv_heads")
    if m.heads % m.kv_heads:
        raise ConfigError("model.kv_heads", m.kv_heads, f"must divide model.heads={m.heads} (grouped-query attention)")
    if m.arch == "gpt2" and m.kv_heads != m.heads:
        raise ConfigError(
            "model.kv_heads", m.kv_heads, f"GPT-2 has no grouped-query attention: must equal model.heads={m.heads}"
        )
    if m.arch == "llama" and (m.hidden // m.heads) % 2:
        raise ConfigError("model.heads", m.heads, "rotary embeddings need an even head size (hidden / heads)")
    if m.ffn_hidden is None:
        m.ffn_hidden = 4 * m.hidden
    positive(m.ffn_hidden, "model.ffn_hidden")
    if not 0 <= m.dropout < 1:
        raise ConfigError("model.dropout", m.dropout, "a probability from 0 (off) up to, not including, 1")
    # RoPE's base sets each pair's wavelength (a base of 0 or below has none; Su et al. 2021);
    # the norm's epsilon keeps its division from zero: both finite and above 0.
    for name in ("rope_theta", "norm_eps"):
        value = getattr(m, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
            raise ConfigError(f"model.{name}", value, "a finite number above 0")
    if not 0 < m.seq_len <= m.max_positions:
        raise ConfigError("model.seq_len", m.seq_len, f"a length from 1 to model.max_positions={m.max_positions}")


def check_zero(cfg: TrialConfig) -> None:
    z = cfg.zero
    check_choice(z.stage, "zero.stage", (0, 1, 2, 3))
    for name in (
        "reduce_bucket_size",
        "allgather_bucket_size",
        "prefetch_bucket_size",
        "max_live_parameters",
        "sub_group_size",
    ):
        setattr(z, name, whole_number(getattr(z, name), f"zero.{name}", minimum=1))
    z.param_persistence_threshold = whole_number(
        z.param_persistence_threshold, "zero.param_persistence_threshold", minimum=0
    )
    if z.offload_optimizer != "none" and z.stage == 0:
        raise ConfigError(
            "zero.offload_optimizer",
            z.offload_optimizer,
            "needs zero.stage 1, 2 or 3 (stage 0 keeps the optimizer on the device)",
        )
    if z.offload_param != "none" and z.stage < 3:
        raise ConfigError(
            "zero.offload_param",
            z.offload_param,
            f"needs zero.stage=3 (parameters are partitioned only there; stage is {z.stage})",
        )


# ZeRO's own knobs: DeepSpeed reads them, FSDP2 has no counterpart (it gathers and
# reduce-scatters one block at a time, prefetching the next).
ZERO_ONLY = (
    "reduce_bucket_size",
    "allgather_bucket_size",
    "prefetch_bucket_size",
    "overlap_comm",
    "contiguous_gradients",
    "reduce_scatter",
    "max_live_parameters",
    "param_persistence_threshold",
    "sub_group_size",
    "grad_accum_dtype",
)


def check_fsdp(cfg: TrialConfig) -> None:
    """What FSDP2 cannot do, refused by name; engine=fsdp shards at stage 2 or 3 only (3 where
    no zero preset is chosen: conf/engine/fsdp.yaml)."""
    z = cfg.zero
    if cfg.engine.name == "fsdp" and z.stage not in (2, 3):
        raise ConfigError(
            "zero.stage",
            z.stage,
            "2 or 3 with engine=fsdp (3, its default: reshard_after_forward, "
            "ZeRO-3's pattern; 2: parameters kept from forward to backward); the nearest valid value is 2",
        )
    if z.offload_optimizer != "none" and z.offload_param == "none":
        raise ConfigError(
            "zero.offload_optimizer",
            z.offload_optimizer,
            "none with FSDP: FSDP2 offloads parameters, "
            "gradients and the optimizer step together (zero.offload_param=cpu), never the optimizer alone",
        )
    if cfg.engine.name == "fsdp" and z.offload_param != "none" and not cfg.hardware.device.is_gpu:
        raise ConfigError(
            "zero.offload_param",
            z.offload_param,
            "none on a CPU device: FSDP2's CPU offload moves shards between the host and a GPU, and there is none here",
        )
    if cfg.run.fp16 and cfg.engine.name == "fsdp":
        raise ConfigError(
            "run.fp16",
            True,
            "false with engine=fsdp: fp16 needs a sharded gradient scaler, which "
            "this engine has not; use run.bf16=true (or engine=accelerate, whose FSDP2 scales)",
        )


def check_zero_only_knobs(cfg: TrialConfig, overrides: tuple[str, ...]) -> None:
    if cfg.engine.backend != "fsdp" or cfg.zero.stage == 0:  # stage 0 is DDP, whose bucket reduce_bucket_size sets
        return
    for o in overrides:
        key = override_key(o)
        if key.startswith("zero.") and key.split(".", 1)[1] in ZERO_ONLY:
            raise ConfigError(
                key,
                o.partition("=")[2],
                f"unset with FSDP (engine.backend=fsdp): {key} is DeepSpeed "
                "ZeRO's; FSDP2 moves one block's parameters and gradients at a time",
            )


def check_grad_accum(cfg: TrialConfig, precision: str) -> None:
    z = cfg.zero
    bf16_optimizer = z.stage == 1 and precision == "bf16" and z.grad_accum_dtype == "fp32"
    if z.grad_accum_dtype not in (None, precision) and not bf16_optimizer:
        # DeepSpeed runs other mixes as "unsupported mix of model_dtype and grad_accum_dtype"
        # (stage 0), or ignores the setting (stages 2 and 3 accumulate in their partitions).
        if z.stage == 1 and precision == "bf16":
            allowed = "null, bf16 (the training precision) or fp32 (DeepSpeed's BF16_Optimizer) at zero.stage=1"
        else:
            allowed = (
                f"null or {precision} (the training precision) at zero.stage={z.stage}; fp32 accumulation "
                "of bf16 gradients runs at zero.stage=1 (DeepSpeed's BF16_Optimizer)"
            )
        raise ConfigError("zero.grad_accum_dtype", z.grad_accum_dtype, allowed)


def check_engine(cfg: TrialConfig) -> None:
    if cfg.engine.backend == "fsdp" and cfg.engine.name == "deepspeed":
        raise ConfigError(
            "engine.backend",
            "fsdp",
            "deepspeed with engine=deepspeed; FSDP runs as engine=fsdp (FSDP2 under torchrun) or engine=accelerate",
        )
    if cfg.engine.name == "fsdp" and cfg.engine.backend != "fsdp":
        raise ConfigError("engine.backend", cfg.engine.backend, "fsdp with engine=fsdp")
    if cfg.engine.name == "accelerate" and cfg.engine.backend == "fsdp":
        if cfg.zero.stage == 1:
            raise ConfigError(
                "zero.stage",
                1,
                "0 (DDP), 2 or 3 with engine.backend=fsdp: FSDP shards nothing, "
                "gradients and optimizer states, or everything",
            )
        if cfg.zero.stage and not cfg.hardware.device.is_gpu:
            # a config no machine runs as asked: plan refuses it as run does
            raise ConfigError(
                "engine.backend",
                "fsdp",
                f"accelerate applies FSDP only on GPUs (on a CPU it quietly "
                f"runs DDP instead, so zero.stage={cfg.zero.stage} would not be what runs); use "
                "engine=fsdp (FSDP2 itself, under torchrun), engine.backend=deepspeed, or zero.stage=0 "
                "for DDP",
            )
    if cfg.engine.backend == "fsdp":
        check_fsdp(cfg)


def check_run(cfg: TrialConfig) -> str:
    r = cfg.run
    positive(r.steps, "run.steps")
    at_most(r.steps, "run.steps", MAX_STEPS)
    if not 0 <= r.seed <= MAX_SEED:
        raise ConfigError("run.seed", r.seed, f"a whole number from 0 to {MAX_SEED:,} (2^32 - 1)")
    if not 0 <= r.repeat <= MAX_REPEAT:
        raise ConfigError(
            "run.repeat",
            r.repeat,
            f"a whole number from 0 to {MAX_REPEAT:,} (run.repeat=range(3): each point three times)",
        )
    if not 0 <= r.warmup_steps < r.steps:
        raise ConfigError(
            "run.warmup_steps",
            r.warmup_steps,
            f"0 to run.steps-1={r.steps - 1} (timing warm-up steps are not measured)",
        )
    if r.min_timed_steps < 1 or r.steps - r.warmup_steps < r.min_timed_steps:
        raise ConfigError(
            "run.steps",
            r.steps,
            f"at least run.warmup_steps + run.min_timed_steps = "
            f"{r.warmup_steps + max(r.min_timed_steps, 1)} (run.min_timed_steps={r.min_timed_steps} "
            "timed steps after the warm-up; it must be 1 or more)",
        )
    if r.timing_ci is not None and not 0 < r.timing_ci < 1:
        raise ConfigError(
            "run.timing_ci",
            r.timing_ci,
            "a share of the median in (0, 1), e.g. 0.05: step on until "
            "the median's 95 % interval is within 5 % of it; null: run every run.steps",
        )
    if r.bf16 and r.fp16:
        raise ConfigError(
            "run.fp16", True, "run.bf16 is on too; choose one precision (set the other false; both false is fp32)"
        )
    if r.lr <= 0:
        raise ConfigError("run.lr", r.lr, "a learning rate > 0")
    if r.grad_clip < 0:
        raise ConfigError("run.grad_clip", r.grad_clip, "a norm >= 0 (0 turns clipping off)")
    if r.weight_decay < 0:
        raise ConfigError("run.weight_decay", r.weight_decay, "a decay >= 0 (0 turns it off)")
    for name in ("gc_collect_every", "dataloader_workers", "checkpoint_every"):
        if getattr(r, name) < 0:
            raise ConfigError(f"run.{name}", getattr(r, name), "a whole number >= 0")
    if r.step_sleep_s < 0:
        raise ConfigError("run.step_sleep_s", r.step_sleep_s, "seconds >= 0 (0: no sleep)")
    if r.timeout_min is not None and r.timeout_min <= 0:
        raise ConfigError("run.timeout_min", r.timeout_min, "minutes > 0, or null for no limit")
    if r.collective_timeout_s is not None and not 0 < r.collective_timeout_s <= MAX_COLLECTIVE_TIMEOUT_S:
        raise ConfigError(
            "run.collective_timeout_s",
            r.collective_timeout_s,
            f"seconds above 0 and at most {MAX_COLLECTIVE_TIMEOUT_S:,} (a day), or null for torch's default",
        )
    if r.fail_at_step is not None and not 0 <= r.fail_rank < cfg.parallel.dp:
        raise ConfigError("run.fail_rank", r.fail_rank, f"a rank from 0 to parallel.dp-1={cfg.parallel.dp - 1}")
    if r.slow_rank is not None and not 0 <= r.slow_rank < cfg.parallel.dp:
        raise ConfigError("run.slow_rank", r.slow_rank, f"a rank from 0 to parallel.dp-1={cfg.parallel.dp - 1}")
    if r.data is not None and cfg.cluster.name == "local":  # on SLURM it may exist only on the cluster
        check_token_file(r.data, r.data_dtype, cfg.model.seq_len, cfg.model.vocab)
    return "bf16" if r.bf16 else "fp16" if r.fp16 else "fp32"


def check_hardware(cfg: TrialConfig, precision: str, choice: str) -> None:
    hw = cfg.hardware
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,99}", hw.name) or ".." in hw.name:
        raise ConfigError(
            "hardware.name",
            hw.name,
            "a plain name of up to 100 letters, digits and - _ . + (it names the calibrated preset's file, so no path)",
        )
    if not hw.device.is_gpu:
        if precision == "fp16":
            raise ConfigError("run.fp16", True, "DeepSpeed's CPU accelerator has no fp16; use run.bf16=true or fp32")
    else:
        peak = getattr(hw.peak_tflops, precision)
        if peak is None and hw.kernels == KernelSource.measured:  # timed kernels: MFU unknown, time predicted
            if str(cfg.run.objective).endswith("mfu"):
                raise ConfigError(
                    "run.objective",
                    cfg.run.objective,
                    "tokens_per_sec_per_gpu or step_time_s: this GPU "
                    f"has no published {precision} peak (hardware.peak_tflops.{precision}), so no MFU",
                )
        elif peak is None or peak <= 0:
            known = hw.name in presets("hardware")
            raise ConfigError(
                f"hardware.peak_tflops.{precision}",
                peak,
                f"{'preset' if known else 'unknown hardware'} '{hw.name}' needs its dense {precision} peak in TFLOPS; "
                "MFU never uses a guessed peak",
            )
        if hw.memory_gib is None:  # a GPU's capacity cannot be read from here
            raise ConfigError(
                "hardware.memory_gib",
                None,
                "the GPU's memory in GiB: hardware=auto reads it from the "
                "device where the trial runs; with a preset named, give it (e.g. hardware.memory_gib=80)",
            )
    hardware_presets.check_plausible(hw)  # every figure's range, memory_gib and gemm_cache_mb among them


def with_network_table(cfg: TrialConfig) -> TrialConfig:
    """hardware.network read and checked now (a bad table exits 2 before anything runs), and
    kept as an absolute path: the trial is planned again on its SLURM node, from elsewhere."""
    if not cfg.hardware.network:
        return cfg
    path = hardware_presets.network_table_path(cfg.hardware.network)
    network_table.load(path)
    return dataclasses.replace(cfg, hardware=dataclasses.replace(cfg.hardware, network=str(path)))


def check_logger(cfg: TrialConfig) -> None:
    for tag in cfg.logger.tags:
        if not 1 <= len(tag) <= MAX_TAG:
            raise ConfigError("logger.tags", repr(tag), f"each tag 1 to {MAX_TAG} characters long (W&B's limit)")
    if cfg.logger.mode == "online" and not wandb_key_available():
        raise ConfigError(
            "logger.mode",
            "online",
            "needs WANDB_API_KEY in the environment (or `wandb login`); use logger.mode=offline and `wandb sync` later",
        )


def check_batch(cfg: TrialConfig, dp: int) -> tuple[int, int]:
    b = cfg.batch
    mbs = positive(b.micro_batch_size, "batch.micro_batch_size")
    unit = mbs * dp
    if b.global_batch_size is None and b.warmup is None:
        b.global_batch_size = unit
    gbs = positive(b.global_batch_size, "batch.global_batch_size")
    if gbs % unit:
        raise ConfigError(
            "batch.global_batch_size", gbs, f"a multiple of micro_batch_size x dp = {mbs} x {dp} = {unit}"
        )
    w = b.warmup
    if w is None:
        return mbs, gbs
    if w.end != gbs:
        raise ConfigError(
            "batch.warmup.end", w.end, f"the global batch after the warm-up, batch.global_batch_size={gbs}"
        )
    w.start = unit if w.start is None else positive(w.start, "batch.warmup.start")
    if w.start > w.end:
        raise ConfigError("batch.warmup.start", w.start, f"at most batch.warmup.end={w.end}")
    if w.ramp_tokens is None:  # the ramp in sequences (Megatron's samples): the same warm-up for every model
        if w.ramp_samples is None:
            raise ConfigError(
                "batch.warmup.ramp_tokens",
                None,
                "a number of tokens > 0, or batch.warmup.ramp_samples, the ramp in sequences",
            )
        w.ramp_tokens = positive(w.ramp_samples, "batch.warmup.ramp_samples") * cfg.model.seq_len
    if w.ramp_tokens <= 0:
        raise ConfigError("batch.warmup.ramp_tokens", w.ramp_tokens, "a number of tokens > 0")
    if w.start % unit:
        raise ConfigError("batch.warmup.start", w.start, f"a multiple of micro_batch_size x dp = {unit}")
    w.increment = unit if w.increment is None else positive(w.increment, "batch.warmup.increment")
    if w.increment % unit or (w.end - w.start) % w.increment:
        raise ConfigError(
            "batch.warmup.increment",
            w.increment,
            f"a multiple of micro_batch_size x dp = {unit} that divides end - start = {w.end - w.start}",
        )
    return mbs, gbs


def wandb_key_available() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    import netrc  # `wandb login` stores the key here

    try:
        path = os.environ.get("NETRC") or os.path.join(os.path.expanduser("~"), ".netrc")
        return bool(netrc.netrc(path).authenticators("api.wandb.ai"))
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False
