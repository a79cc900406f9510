"""`orchestrator calibrate --links`: measure the cluster's network as nccl-tests does, and
write what the plan needs of it.

All-reduce, reduce-scatter and all-gather from 1 MB up to `--max-mb` (1 GB by default) on
one node, then on every node count asked for, through torch.distributed on the real
backend (workload/collective_timing.py: NCCL on GPUs, gloo on CPUs): locally under torchrun
for one node, as a SLURM step (srun) inside the current allocation or cluster for several.
Each row is printed with nccl-tests' algorithm and bus bandwidth (busbw = algbw x
2(n-1)/n for an all-reduce, x (n-1)/n for the others).

Each level of the network is then fitted as plan/collectives.py models it: latency per hop
and bus bandwidth by least squares on the one-node rows (inside a node) and on the
multi-node rows (between nodes, inside-node figures held), and written into the user's
NAME-calibrated hardware preset beside what `orchestrator calibrate` fits there.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from orchestrator import network_table
from orchestrator.config import GIB
from orchestrator.core.errors import ConfigError, MeasurementFailed, one_of
from orchestrator.core.process import run_group
from orchestrator.hardware_presets import (
    calibrated_name,
    calibrated_preset,
    calibrated_preset_path,
    calibrated_table_path,
    preset_lock,
    write_calibrated_preset,
)
from orchestrator.hydra_glue.compose import plain_dict
from orchestrator.hydra_glue.conf_tree import presets, user_conf_dir
from orchestrator.measure.host_load import available_bytes
from orchestrator.plan.bus_table import BusRow, BusTable
from orchestrator.plan.collectives import Level, Network, bus_factor, ring_steps, ring_time
from orchestrator.spec import build_spec

OPS = ("all_reduce", "reduce_scatter", "all_gather")
MEASURED = "measured: "  # how a level this module wrote names itself
MIN_BYTES = 2**20


@dataclass(frozen=True)
class Measurement:
    op: str
    ranks: int
    nodes: int
    bytes: int
    seconds: float

    @property
    def algbw(self) -> float:
        return self.bytes / self.seconds if self.seconds else math.inf

    @property
    def busbw(self) -> float:
        """nccl-tests' bus bandwidth: what each rank's links carried, per second."""
        return self.algbw * bus_factor(self.op, self.ranks)


def sizes(max_mb: float, min_bytes: int = MIN_BYTES) -> list[int]:
    """min_bytes (1 MB), doubling, up to max_mb."""
    out, size = [], min_bytes
    while size <= max_mb * 2**20:
        out.append(size)
        size *= 2
    return out or [min_bytes]


def ring_terms(m: Measurement, backend: str) -> tuple[float, float]:
    """(latency hops, bytes each rank sends) of one ring call: t = hops x latency + bytes / busbw."""
    steps = ring_steps(m.op, m.ranks, backend)
    return steps, steps * m.bytes / m.ranks


def fit_level(rows: list[Measurement], backend: str) -> Level:
    """Latency per hop and bus bandwidth of one level, least squares on relative error. For
    rows that span nodes every step is charged to the network: a ring waits for its slowest
    hop (gloo's lock step; for NCCL the one-node steps' share is small beside it)."""
    if not rows:
        raise ValueError("no rows to fit")
    a = np.array([ring_terms(m, backend) for m in rows], dtype=float)
    t = np.array([m.seconds for m in rows])
    (latency, inverse), *_ = np.linalg.lstsq(a / t[:, None], np.ones(len(t)), rcond=None)
    if inverse <= 0:  # latency-bound rows only: bandwidth from the largest call alone
        largest = max(rows, key=lambda m: m.bytes)
        inverse = 1 / largest.busbw
    return Level(busbw=float(1 / inverse), latency=max(float(latency), 0.0))


# Past these a measurement is a typing slip, not a network: the largest clusters' nodes,
# the most ranks a node holds (its GPUs, or a CPU's cores), nccl-tests' usual largest buffer.
MAX_NODES, MAX_RANKS_PER_NODE, MAX_MB, MAX_REPS = 4096, 64, 16384, 1000


def check_arguments(
    nodes_text: str, ranks_per_node: int, max_mb: float, reps: int, partition: str | None, device: str
) -> list[int]:
    """The node counts of `--nodes`, every argument checked before anything runs: bounds,
    srun where more than one node (or a partition) is asked, and on this machine's CPU the
    buffers of its ranks within its free memory."""
    try:
        nodes = sorted({int(n) for n in nodes_text.split(",")})
    except ValueError:
        raise ConfigError("--nodes", nodes_text, "node counts separated by commas, e.g. 1,2,4") from None
    if not 1 <= nodes[0] <= nodes[-1] <= MAX_NODES:
        raise ConfigError("--nodes", nodes_text, f"node counts from 1 to {MAX_NODES}")
    if not 1 <= ranks_per_node <= MAX_RANKS_PER_NODE:
        raise ConfigError(
            "--ranks-per-node",
            ranks_per_node,
            f"1 to {MAX_RANKS_PER_NODE} (a node's GPUs); the "
            f"nearest valid value is {min(max(ranks_per_node, 1), MAX_RANKS_PER_NODE)}",
        )
    if not (math.isfinite(max_mb) and 1 <= max_mb <= MAX_MB):
        nearest = f"; the nearest valid value is {MAX_MB if max_mb > MAX_MB else 1}" if not math.isnan(max_mb) else ""
        raise ConfigError("--max-mb", max_mb, f"a buffer size in MB from 1 to {MAX_MB}{nearest}")
    if not 1 <= reps <= MAX_REPS:
        raise ConfigError("--reps", reps, f"1 to {MAX_REPS} timed calls per size")
    if nodes[-1] * ranks_per_node < 2:
        raise ConfigError(
            "--ranks-per-node",
            ranks_per_node,
            "at least 2 ranks in all to time a collective: --ranks-per-node 2, or --nodes 1,2",
        )
    if nodes[-1] > 1 or partition:
        _check_slurm_has(nodes[-1], nodes_text, partition)
    free = available_bytes()
    # each rank holds the whole buffer and a rank's part of it (collective_timing.py)
    need = ranks_per_node * 2 * max_mb * 2**20
    if device == "cpu" and nodes[0] == 1 and partition is None and free is not None and need > free:
        fits = max(1, int(free / (ranks_per_node * 2 * 2**20)))
        raise ConfigError(
            "--max-mb",
            max_mb,
            f"buffers that fit this host's free memory ({free / GIB:.1f} GiB for "
            f"{ranks_per_node} rank(s), two buffers each); the nearest valid value is {fits}",
        )
    return nodes


def _check_slurm_has(most: int, nodes_text: str, partition: str | None) -> None:
    """SLURM answers here (sinfo) and has `most` nodes (in `partition`): found before the
    one-node measurement, not after it."""
    if shutil.which("srun") is None or shutil.which("sinfo") is None:
        raise ConfigError(
            "--nodes",
            nodes_text,
            "one node here (--nodes 1, no --partition), or several through "
            "SLURM's srun, which this machine does not have",
        )
    argv = ["sinfo", "--noheader", "--format=%D", *([f"--partition={partition}"] if partition else [])]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        proc = subprocess.CompletedProcess(argv, 1, "", str(exc))
    counts = [int(line) for line in proc.stdout.split() if line.isdigit()]
    if partition and not proc.returncode and not counts:
        raise ConfigError("--partition", partition, "a partition SLURM has (sinfo lists none by that name)")
    if proc.returncode or not counts:
        said = (proc.stderr.strip().splitlines() or ["no nodes listed"])[-1][-300:]
        raise ConfigError("--nodes", nodes_text, f"nodes SLURM has, but it does not answer here (sinfo: {said})")
    if most > sum(counts):
        raise ConfigError(
            "--nodes",
            nodes_text,
            f"at most the {sum(counts)} node(s) SLURM has{f' in partition {partition}' if partition else ''}",
        )


def measure(
    node_counts: list[int],
    ranks_per_node: int,
    max_mb: float,
    reps: int,
    device: str,
    partition: str | None = None,
    min_bytes: int = MIN_BYTES,
) -> list[Measurement]:
    """Every collective and size on each node count; one node runs here unless SLURM is asked.
    The ranks end with this process (run_group): a signal to the command ends them too."""
    out = []
    for nodes in node_counts:
        ranks = nodes * ranks_per_node
        worker = [
            "-m",
            "orchestrator.workload.collective_timing",
            ",".join(map(str, sizes(max_mb, min_bytes))),
            str(reps),
            device,
        ]
        if nodes == 1 and partition is None:
            argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}", *worker]
        else:
            argv = [
                "srun",
                "--export=ALL,SUBMITIT_EXECUTOR=slurm",
                f"--nodes={nodes}",
                f"--ntasks={ranks}",
                f"--ntasks-per-node={ranks_per_node}",
                *([f"--partition={partition}"] if partition else []),
                sys.executable,
                *worker,
            ]
        try:
            proc = run_group(argv, timeout=3600)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise MeasurementFailed(f"{ranks} ranks on {nodes} node(s) could not be measured: {exc}") from None
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        if proc.returncode or not lines:
            said = " ".join(proc.stderr.strip().splitlines()[-3:])[-600:] or f"exit code {proc.returncode}"
            raise MeasurementFailed(f"{ranks} ranks on {nodes} node(s) failed ({argv[0]}): {said}")
        run = json.loads(lines[-1])
        out += [Measurement(r["op"], run["world"], run["nodes"], r["bytes"], r["seconds"]) for r in run["rows"]]
    return out


def fit_network(rows: list[Measurement], backend: str) -> tuple[Level, Level | None]:
    """(inside a node, between nodes or None): the one-node rows first, then the others."""
    one = [m for m in rows if m.nodes == 1 and m.ranks > 1]
    many = [m for m in rows if m.nodes > 1]
    inside = fit_level(one, backend) if one else None
    between = fit_level(many, backend) if many else None
    first = inside or between
    if first is None:
        raise ConfigError("--ranks-per-node", 1, "at least 2 ranks in all, on one node or across nodes")
    return first, between


def write_links(hardware: str, inside: Level, between: Level | None, what: str, table: BusTable | None = None) -> str:
    """The NAME-calibrated preset with its network levels (and table) replaced (created from
    NAME if new)."""

    def levels(data: dict) -> None:
        data["intra_node"] = {
            **data.get("intra_node", {}),
            "busbw_gbps": round(inside.busbw / 1e9, 4),
            "latency_us": round(inside.latency * 1e6, 2),
            "name": f"{MEASURED}{what}",
        }
        if between is not None:
            data["inter_node"] = {
                **data.get("inter_node", {}),
                "busbw_gbps": round(between.busbw / 1e9, 4),
                "latency_us": round(between.latency * 1e6, 2),
                "name": f"{MEASURED}{what}",
            }

    return _write_preset(hardware, f"the network measured as nccl-tests does ({what})", levels, table)


def write_network_table(hardware: str, table: BusTable, what: str) -> str:
    """The NAME-calibrated preset planning from `table` (merged into the one an earlier
    calibration wrote there: a curve measured again replaces the old one)."""
    return _write_preset(hardware, what, lambda data: None, table)


def _write_preset(hardware: str, what: str, change, table: BusTable | None) -> str:
    """NAME-calibrated (created from NAME if new) changed by `change`, its network table merged
    into the one it has: read, changed and written under the preset's lock."""
    with preset_lock(hardware):
        return str(_changed_preset(hardware, what, change, table))


def _changed_preset(hardware: str, what: str, change, table: BusTable | None) -> Path:
    path = calibrated_preset_path(hardware)
    data = calibrated_preset(hardware, user_conf_dir()) if path.is_file() else None  # checked as the plan reads it
    if data is None:
        hw = OmegaConf.structured(build_spec([f"hardware={hardware}"]).cfg.hardware)
        data = {**plain_dict(hw), "name": calibrated_name(hardware)}
    change(data)
    if table is not None:
        own = calibrated_table_path(hardware)
        if data.get("network") == str(own) and own.is_file():  # ours from an earlier run: keep its other curves
            old = network_table.load(own)
            kept = [r for r in old.rows if (r.collective, r.nodes, r.ranks_per_node) not in table.curves]
            table = BusTable(kept + list(table.rows), f"{old.source}\n{table.source}" if kept else table.source)
        network_table.write(own, table)
        data["network"] = str(own)  # a preset of someone else's network (h100-p5's table) is not kept
    return write_calibrated_preset(hardware, data, f"# Written by `orchestrator calibrate`: {what}.\n")


def table_of(rows: list[Measurement], what: str) -> BusTable:
    """What was measured, as the network table the plan reads (one curve per op and node count)."""
    return BusTable(
        [
            BusRow(m.op, m.nodes, m.ranks // m.nodes, m.bytes, m.busbw / 1e9)
            for m in rows
            if m.ranks > 1 and m.seconds > 0
        ],
        f"measured by `orchestrator calibrate --links`: {what}",
    )


def check_hardware(name: str) -> None:
    known = [p for p in presets("hardware") if p != "auto"]
    if name not in known:
        raise ConfigError("--hardware", name, f"a hardware preset to write the links of: {one_of(known)}")


def predicted_seconds(m: Measurement, inside: Level, between: Level | None, backend: str) -> float:
    """What the fitted levels say one measured call took (plan/collectives.py's ring)."""
    net = Network(ranks=m.ranks, nodes=m.nodes, intra=inside, inter=between or inside, backend=backend)
    return ring_time(m.op, m.bytes, net)
