"""This host's own links, measured once: what a CPU trial's ranks on one node talk over.

A CPU preset cannot know what a gloo collective costs between processes of this host: on
a 2-core AMD EPYC it was 186 us a hop at 0.8 GB/s of bus bandwidth, where the preset
assumes 50 us and 5 GB/s, and a ZeRO-3 or FSDP2 step at dp 2 makes about forty calls
(bench/RESULTS.md, "This host's links, measured by the plan"). So where a CPU trial puts
several ranks on a node and its preset's inside-node level was not measured (`orchestrator
calibrate --links` writes a measured one), the plan measures it here as `calibrate --links
--nodes 1` does (links.py: torchrun, workload/collective_timing.py), once per CPU, torch
version and ranks a node, cached beside the kernels (local_links.json), and plans from that
curve and the level fitted to it, as it would from a calibrated preset. The preset's fixed
cost per call the engine issues (`collective_overhead_us`) is still added: planned without
it, the dp 2 trials came out 0.71-0.85 of their steps, with it 0.81-0.96 (bench/RESULTS.md).
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

import numpy as np

from orchestrator.core.errors import MeasurementFailed
from orchestrator.measure.hardware import cache_dir, cpu_model, torch_version
from orchestrator.measure.links import OPS, Measurement, fit_level, measure, table_of
from orchestrator.measure.measured_file import cached_or_measured
from orchestrator.plan.bus_table import MAX_BUSBW_GBPS
from orchestrator.plan.collectives import bus_factor
from orchestrator.plan.inputs import LocalLinks

BACKEND = "gloo"
# 16 KB to 16 MB: ZeRO-3's persistent parameters after each step (a bias, a norm) up to a
# small model's buckets; a call below the smallest size measured is read as that size's time.
MIN_BYTES, MAX_MB = 16 << 10, 16
REPS = 5
# Longer than this, a call is not a host's loopback (a stalled machine): measured again.
MAX_CALL_S = 60.0


def cache_path():
    return cache_dir() / "local_links.json"


def key(ranks_per_node: int) -> str:
    return f"{cpu_model()}|torch {torch_version()}|{BACKEND}|{ranks_per_node} ranks|{MIN_BYTES >> 10} KB-{MAX_MB} MB"


# What this process has read or measured: a sweep plans every point with the same links,
# and the plan's per-call cache (collectives.call_time) is keyed by the table object.
_IN_PROCESS: dict[tuple[str, str], LocalLinks] = {}


def local_links(ranks_per_node: int) -> LocalLinks:
    """This host's links between `ranks_per_node` ranks: read or measured once per process
    and cache file."""
    where = (str(cache_path()), key(ranks_per_node))
    if where not in _IN_PROCESS:
        _IN_PROCESS[where] = _cached_or_measured(ranks_per_node)
    return _IN_PROCESS[where]


def _cached_or_measured(ranks_per_node: int) -> LocalLinks:
    """Cached, else measured now (seconds: the ranks import torch). MeasurementFailed where
    they cannot be measured."""

    def measured() -> dict:
        # A call timed at nothing (the barriers' cost taken off a call as short as they are)
        # says nothing of the link; the others are kept.
        rows = [
            m
            for m in measure([1], ranks_per_node, MAX_MB, REPS, "cpu", min_bytes=MIN_BYTES)
            if m.seconds > 0 and possible(m)
        ]
        entry = {
            "when": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "rows": [[m.op, m.ranks, m.nodes, m.bytes, m.seconds] for m in rows],
        }
        if rows_of(entry) is None:
            raise MeasurementFailed(f"{ranks_per_node} ranks of this host timed no usable call of each collective")
        return entry

    entry = cached_or_measured(cache_path(), key(ranks_per_node), lambda e: rows_of(e) is not None, measured)
    rows = rows_of(entry)
    assert rows is not None  # the cached one was usable, or the new one
    what = (
        f"{BACKEND} between {ranks_per_node} ranks of this host, {MIN_BYTES >> 10} KB-{MAX_MB} MB, "
        f"measured {entry['when']}"
    )
    try:
        level = fit_level(rows, BACKEND)
    except (ValueError, np.linalg.LinAlgError) as exc:
        raise MeasurementFailed(f"no level fits this host's measured calls ({exc})") from None
    return LocalLinks(level, table_of(rows, what), what)


def possible(m: Measurement) -> bool:
    """A call no link can make faster: its bus bandwidth within what a network table may hold
    (a call of 1e-12 s planned gloo between a host's ranks at 2.8e8 GB/s)."""
    return m.bytes * bus_factor(m.op, m.ranks) / m.seconds <= MAX_BUSBW_GBPS * 1e9


def rows_of(entry) -> list[Measurement] | None:
    """The cached rows where every one is a measurement this host could have made (each
    collective at least once, a time within (0, MAX_CALL_S]), else None."""
    try:
        rows = [
            Measurement(str(op), int(ranks), int(nodes), int(size), float(seconds))
            for op, ranks, nodes, size, seconds in entry["rows"]
        ]
        str(entry["when"])
    except (TypeError, KeyError, ValueError):
        return None
    fine = all(
        m.op in OPS
        and m.ranks > 1
        and m.nodes == 1
        and m.bytes > 0
        and math.isfinite(m.seconds)
        and 0 < m.seconds <= MAX_CALL_S
        and possible(m)
        for m in rows
    )
    return rows if fine and {m.op for m in rows} == set(OPS) else None
