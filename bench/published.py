"""Every public measurement this project holds, planned with the shipped presets.

    .venv/bin/python bench/published.py [--rows]

One `DataSet` per published table in bench/data (bench/data/README.md says where each comes
from and how those runs were made): each row becomes the trial those runs were, is planned
(nothing timed: a GPU preset's plan is pure arithmetic), and its predicted tokens/s/GPU is
set against the published one. `share_within` is the figure each set is held to: the rows
within +-20 % of what ran, which must not fall below the set's floor in
bench/data/floors.json (tests/test_published_accuracy.py). A floor may rise, never fall;
a change that moves one says so in its commit.

Nothing of a network is fitted on these rows: a network is the preset's, a table measured by
the network itself (bench/data/network/), or the link a source states for its cluster.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from orchestrator.analysis.calibrate import (
    current_params,
    determined,
    fit_in_stages,
    fitted_names,
    with_params,
)
from orchestrator.analysis.fit_inputs import MeasuredTrial
from orchestrator.plan.prediction import Plan
from orchestrator.run.planning import plan_trial
from orchestrator.spec import build_spec

DATA = Path(__file__).resolve().parent / "data"
FLOORS = DATA / "floors.json"
TOLERANCE = 0.20
CLUSTER = DATA / "network" / "ultrascale-cluster.csv"  # the Ultra-Scale runs' cluster measuring itself


@dataclass(frozen=True)
class Row:
    """One published run as this project plans it."""

    label: str  # what tells it from the set's other rows
    overrides: tuple[str, ...]
    measured: float | None  # published tokens/s/GPU; None: the run crashed or ran out of memory
    key: tuple = ()  # the fields other checks look a row up by (dp, ZeRO stage, micro batch)


@dataclass(frozen=True)
class Planned:
    row: Row
    plan: Plan

    @property
    def predicted(self) -> float:
        return self.plan.time.tokens_per_sec_per_gpu

    @property
    def ratio(self) -> float | None:
        return self.predicted / self.row.measured if self.row.measured else None


@dataclass(frozen=True)
class DataSet:
    name: str  # its key in floors.json
    title: str
    rows: Callable[[], list[Row]]


def read_csv(path: Path) -> list[dict]:
    """A published table: its `#` lines are where it comes from."""
    with path.open(newline="") as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def plan_rows(rows: list[Row], extra: tuple[str, ...] = (), params: dict | None = None) -> list[Planned]:
    out = []
    for row in rows:
        spec = build_spec([*row.overrides, *extra])
        out.append(Planned(row, plan_trial(with_params(spec, params) if params else spec)))
    return out


def share_within(planned: list[Planned], tolerance: float = TOLERANCE) -> tuple[int, int]:
    """(rows within +-tolerance of what ran, rows with a measurement)."""
    ratios = [p.ratio for p in planned if p.ratio is not None]
    return sum(abs(r - 1) <= tolerance for r in ratios), len(ratios)


def summary(planned: list[Planned]) -> dict:
    """What a set's table of record says: rows within 20 %, the ratios' range and median."""
    ratios = sorted(p.ratio for p in planned if p.ratio is not None)
    within, n = share_within(planned)
    return {"within": within, "rows": n, "low": ratios[0], "median": statistics.median(ratios), "high": ratios[-1]}


# llm-foundry's MPT tables: MPT is GPT-2's block without biases or position embeddings
# (neither costs FLOPs), a GELU MLP of 4 x d_model, tied embeddings; FULL_SHARD is FSDP with
# parameters resharded after the forward (engine=fsdp zero=stage3); activation checkpointing
# of whole blocks is recompute=full.
MPT_GPUS = {"h100-80gb": "h100-sxm", "a100-80gb": "a100-80gb"}


def mpt_overrides(row: dict, engine: str = "fsdp") -> tuple[str, ...]:
    s, gpus, micro = int(row["seq_len"]), int(row["n_gpus"]), int(row["micro_batch"])
    return (
        "model=gpt2-125m",
        f"model.hidden={row['d_model']}",
        f"model.heads={row['n_heads']}",
        f"model.n_layers={row['n_layers']}",
        "model.kv_heads=null",
        "model.ffn_hidden=null",
        f"model.vocab={row['vocab']}",
        f"model.seq_len={s}",
        f"model.max_positions={s}",
        "model.tie_embeddings=true",
        "model.attention=sdpa",
        f"hardware={MPT_GPUS[row['gpu']]}",
        "cluster=slurm",
        "cluster.gpus_per_node=8",
        "zero=stage3",
        f"parallel.dp={gpus}",
        f"batch.micro_batch_size={micro}",
        f"batch.global_batch_size={micro * int(row['grad_accum']) * gpus}",
        f"recompute={'full' if row['activation_checkpointing'] == 'True' else 'none'}",
        "run.bf16=true",
        "logger.mode=disabled",
        f"engine={engine}",
    )


def llm_foundry() -> list[Row]:
    return [
        Row(
            f"{r['gpu']} {r['model']} seq {r['seq_len']} x{r['n_gpus']} mb {r['micro_batch']}"
            f"{' ckpt' if r['activation_checkpointing'] == 'True' else ''}",
            mpt_overrides(r),
            float(r["published_tokens_per_sec_per_gpu"]),
            (r["gpu"],),
        )
        for r in read_csv(DATA / "llm-foundry.csv")
    ]


# The Ultra-Scale Playbook's 1B rows, as those runs ran: gradients reduced in fp32, 25 MB
# buckets (6.25M fp32 elements to reduce, 12.5M bf16 to gather), no recompute. ZeRO-0 is
# planned as DDP (engine=accelerate: buckets all-reduced during the last backward, as nanotron
# does); DeepSpeed's own stage 0 reduces in fixed 5e8-element buckets after the backward.
# nanotron's Llama runs fused kernels for its norms and rotary (its decoder layer's
# TritonRMSNorm, flash-attn's rotary), not transformers' eager chains: its memory-bound
# traffic is a fused kernel's, which the plan has as run.compile=true (its one fused mode).
ULTRASCALE_MODEL = (
    "model=llama3-8b",
    "model.n_layers=16",
    "model.hidden=2048",
    "model.heads=32",
    "model.kv_heads=32",
    "model.ffn_hidden=8192",
    "model.vocab=131072",
    "model.tie_embeddings=true",
    "model.seq_len=4096",
    "model.max_positions=4096",
)
ULTRASCALE_RUNS = (
    "cluster=slurm",
    "cluster.gpus_per_node=8",
    "batch.global_batch_size=256",
    "recompute=none",
    "logger.mode=disabled",
    "zero.reduce_bucket_size=6250000",
    "zero.allgather_bucket_size=12500000",
    "zero.communication_dtype=fp32",
    "run.compile=true",
)


def ultrascale_overrides(dp: int, stage: int, micro: int, hardware: str) -> tuple[str, ...]:
    engine = ("engine=accelerate", "engine.backend=fsdp") if stage == 0 else ("engine=deepspeed",)
    return (
        *ULTRASCALE_MODEL,
        *ULTRASCALE_RUNS,
        *engine,
        f"hardware={hardware}",
        f"zero=stage{stage}",
        f"parallel.dp={dp}",
        f"batch.micro_batch_size={micro}",
    )


def ultrascale(hardware: str = "h100-p5", network: Path | None = CLUSTER, measured_only: bool = True) -> list[Row]:
    extra = (f"hardware.network={network}",) if network else ()
    rows = []
    for r in read_csv(DATA / "ultrascale-1b.csv"):
        if measured_only and not r["tokens_per_sec_per_gpu"]:
            continue
        key = (int(r["dp"]), int(r["zero_stage"]), int(r["micro_batch"]))
        rows.append(
            Row(
                f"dp {key[0]} ZeRO-{key[1]} micro {key[2]}",
                (*ultrascale_overrides(*key, hardware), *extra),
                float(r["tokens_per_sec_per_gpu"]) if r["tokens_per_sec_per_gpu"] else None,
                key,
            )
        )
    return rows


def scaling_ratio(planned: list[Planned], stage: int) -> tuple[float, float]:
    """dp 256 against dp 8 at micro batch 1: (measured, predicted) tokens/s/GPU ratio."""
    by = {p.row.key: p for p in planned}
    low, high = by[(8, stage, 1)], by[(256, stage, 1)]
    return high.row.measured / low.row.measured, high.predicted / low.predicted  # type: ignore[operator]


def calibrated_held_out(fit_up_to: int = 32) -> tuple[list[Planned], dict]:
    """`orchestrator calibrate --csv`'s fit on the Ultra-Scale rows of dp up to `fit_up_to`
    (on their cluster's network), then the rest planned with the fitted parameters: the check
    of calibration on rows it did not see. Returns (the held-out rows, the fitted parameters)."""
    rows = ultrascale()
    specs = [(r, build_spec(list(r.overrides))) for r in rows if r.key[0] <= fit_up_to]
    train = [MeasuredTrial(r.label, spec, spec.tokens_per_step / (r.measured * spec.world_size)) for r, spec in specs]
    start = current_params(train[0].spec.cfg.hardware, fitted_names(train))
    seen, _ = determined(train, start)
    params = fit_in_stages(train, start, seen)
    return plan_rows([r for r in rows if r.key[0] > fit_up_to], params=params), {k: params[k] for k in seen}


# Public FSDP data-parallel runs in bench/data/fsdp's format (its README names each column):
# IBM's fms-fsdp here, and the rows kept back, which `--fsdp-csv` plans the same way. Each
# cluster's network is the one its source states per node, at the 0.9 of nominal that
# nccl-tests reaches over InfiniBand (the a100-80gb preset's note), else the preset's. HSDP is
# planned as FSDP full shard over every GPU: the plan has no replica groups, and full shard
# communicates more across nodes than HSDP does. "selective" checkpointing of a share of the
# blocks (the share not stated) is the plan's selective recompute.
FSDP_GPUS = {"A100": "a100-80gb", "H100": "h100-sxm", "H200": "h200"}
LOW_PRECISION = ("FP8", "FLOAT8", "FP4", "MXFP")  # rows in these are not bf16 runs: not planned


def stated_gbits_per_node(text: str) -> float | None:
    """A node's network as a source states it: "400 Gbps per node", "8x400 Gb/s", "3.2 Tbps"."""
    m = re.search(r"(\d+)\s*x\s*(\d+(?:\.\d+)?)\s*G", text)
    if m:
        return float(m[1]) * float(m[2])
    m = re.search(r"(\d+(?:\.\d+)?)\s*(G|T)(?:bps|b/s|bit)", text)
    return float(m[1]) * (1000 if m[2] == "T" else 1) if m else None


def fsdp_engine(mode: str) -> tuple[str, ...]:
    mode = mode.lower()
    if mode.startswith("ddp"):
        return ("engine=accelerate", "engine.backend=fsdp", "zero=stage0")
    if "zero" in mode:
        return ("engine=deepspeed", f"zero=stage{re.search(r'([0-3])', mode)[1] if re.search(r'[0-3]', mode) else 3}")
    return ("engine=fsdp", "zero=stage3")


def fsdp_overrides(row: dict) -> tuple[str, ...] | None:
    """The trial a published FSDP row ran, or None where the plan cannot say (a GPU without a
    preset, a precision below bf16)."""
    hardware = next((preset for name, preset in FSDP_GPUS.items() if name in row["gpu"]), None)
    flags = " ".join(row.get(k, "") for k in ("precision", "flags", "other_optimizations")).upper()
    if hardware is None or any(p in flags for p in LOW_PRECISION):
        return None
    micro, gpus = int(row["micro_batch_seqs"]), int(row["gpu_count"])
    accum = int(row["grad_accum"]) if row.get("grad_accum") else 1
    ac = row["activation_checkpointing"].lower()
    recompute = "none" if ac.startswith("none") or not ac else "full" if ac.startswith("full") else "selective"
    gbits = stated_gbits_per_node(row.get("inter_node", ""))
    kv = row.get("n_kv_heads") or row["n_heads"]
    return (
        "model=llama3-8b",
        f"model.n_layers={row['n_layers']}",
        f"model.hidden={row['hidden']}",
        f"model.heads={row['n_heads']}",
        f"model.kv_heads={kv}",
        f"model.ffn_hidden={row['ffn_hidden']}",
        f"model.vocab={row['vocab']}",
        f"model.seq_len={row['seq_len']}",
        f"model.max_positions={row['seq_len']}",
        "model.tie_embeddings=false",
        f"hardware={hardware}",
        *((f"hardware.inter_node.busbw_gbps={0.9 * gbits / 8:g}",) if gbits else ()),
        "cluster=slurm",
        f"cluster.gpus_per_node={row.get('gpus_per_node') or 8}",
        *fsdp_engine(row["dp_mode"]),
        f"parallel.dp={gpus}",
        f"batch.micro_batch_size={micro}",
        f"batch.global_batch_size={micro * accum * gpus}",
        f"recompute={recompute}",
        "run.bf16=true",
        f"run.compile={str(row['torch_compile'].lower().startswith('y')).lower()}",
        "logger.mode=disabled",
    )


def fsdp_runs(path: Path, compiled: bool | None = None) -> list[Row]:
    """The rows of an FSDP table the plan can say something of (compiled or not; None: both)."""
    rows = []
    for r in read_csv(path):
        overrides = fsdp_overrides(r)
        if overrides is None or (compiled is not None and r["torch_compile"].lower().startswith("y") != compiled):
            continue
        rows.append(
            Row(
                r.get("run_id") or f"{r['model']} {r['gpu']} x{r['gpu_count']}",
                overrides,
                float(r["tokens_per_sec_per_gpu"]),
                (r["model"], r["gpu"], int(r["gpu_count"])),
            )
        )
    return rows


def fms_fsdp(compiled: bool = False) -> list[Row]:
    return fsdp_runs(DATA / "fsdp" / "ibm-fms-fsdp.csv", compiled)


def gpu_scaling(planned: list[Planned], low: int = 8, high: int = 128) -> list[tuple[str, float, float]]:
    """(model and GPU, measured, predicted) tokens/s/GPU at `high` GPUs over `low`, where a
    table holds one model on one GPU at both (the same everything else is the table's care)."""
    by = {p.row.key: p for p in planned}
    return [
        (
            f"{model} {gpu}",
            by[(model, gpu, high)].row.measured / by[(model, gpu, low)].row.measured,
            by[(model, gpu, high)].predicted / by[(model, gpu, low)].predicted,
        )
        for (model, gpu, gpus) in by
        if gpus == low and (model, gpu, high) in by
    ]


SETS = {
    s.name: s
    for s in (
        DataSet("llm-foundry", "llm-foundry's MPT tables (H100 and A100, FSDP)", llm_foundry),
        DataSet("ultrascale-1b", "Ultra-Scale 1B DP rows, their cluster's network", ultrascale),
        DataSet("ultrascale-1b-p5", "Ultra-Scale 1B DP rows, h100-p5 as shipped", lambda: ultrascale(network=None)),
        DataSet(
            "ultrascale-1b-sxm", "Ultra-Scale 1B DP rows, h100-sxm as shipped", lambda: ultrascale("h100-sxm", None)
        ),
        DataSet("fms-fsdp-eager", "IBM fms-fsdp, bf16 eager", fms_fsdp),
        DataSet("fms-fsdp-compile", "IBM fms-fsdp, torch.compile", lambda: fms_fsdp(compiled=True)),
    )
}


def floors() -> dict[str, int]:
    return json.loads(FLOORS.read_text())["within_20_percent"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", action="store_true", help="print every row's ratio too")
    parser.add_argument("--fsdp-csv", type=Path, help="plan a held-out table of FSDP runs in bench/data/fsdp's format")
    args = parser.parse_args()
    if args.fsdp_csv:
        planned = plan_rows(fsdp_runs(args.fsdp_csv))
        for p in planned:
            print(f"    {p.row.label:45} {p.row.measured:>10,.0f} {p.predicted:>10,.0f} {p.ratio:.2f}")
        within, n = share_within(planned)
        print(f"{args.fsdp_csv.name}: {within} of {n} bf16 rows within 20 % ({within / max(n, 1):.0%}; target 80 %)")
        for label, measured, predicted in gpu_scaling(planned):
            print(
                f"  {label}: 128 / 8 GPUs measured {measured:.2f}, planned {predicted:.2f} ({predicted / measured:.2f})"
            )
        return
    held = floors()
    for data in SETS.values():
        planned = plan_rows(data.rows())
        s = summary(planned)
        print(
            f"{data.name:20} {s['within']:3} of {s['rows']:3} within 20 % (floor {held.get(data.name, '-')}); "
            f"pred/meas {s['low']:.2f}-{s['high']:.2f}, median {s['median']:.2f}"
        )
        for p in planned if args.rows else ():
            print(
                f"    {p.row.label:45} {p.row.measured or 0:>10,.0f} {p.predicted:>10,.0f} "
                + (f"{p.ratio:.2f}" if p.ratio else "-")
            )
    held_out, params = calibrated_held_out()
    within, n = share_within(held_out)
    print(
        f"{'ultrascale calibrated':20} {within:3} of {n:3} held-out rows within 20 % (floor "
        f"{held.get('ultrascale-1b-calibrated', '-')}); fitted " + ", ".join(f"{k}={v:.3g}" for k, v in params.items())
    )


if __name__ == "__main__":
    main()
