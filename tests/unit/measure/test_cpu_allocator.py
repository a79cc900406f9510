"""The ranks' allocator (orchestrator/measure/cpu_allocator.py): a CPU rank returns its freed
activations to the system, and whatever times a CPU trial's work allocates as the ranks do."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from orchestrator.measure import cpu_allocator, engine_timing
from orchestrator.measure.cpu_allocator import ENV, MMAP_THRESHOLD, allocator_key, mmap_threshold
from orchestrator.spec import build_spec

GLIBC = cpu_allocator.allocator_key().startswith("glibc")
only_glibc = pytest.mark.skipif(not GLIBC, reason="glibc's malloc threshold; other C libraries ignore it")

# A freed heap block stays resident; a CPU rank's activations are such blocks unless glibc's
# mmap threshold is fixed (its default rises to each mmapped block freed, up to 32 MiB).
# BEFORE is run first: what a process does before it allocates (nothing, or as the planner).
HEAP_PATTERN = """
import resource, sys, torch
{before}
def rss(): return int(open('/proc/self/statm').read().split()[1]) * resource.getpagesize()
big = torch.empty(16 << 20, dtype=torch.uint8).fill_(1); del big   # a freed mmapped block
base = rss()
blocks = [torch.empty(4 << 20, dtype=torch.uint8).fill_(1) for _ in range(50)]
last = blocks.pop(); del blocks                                        # 49 freed, one alive on top
print(rss() - base)
"""


def held(env: dict[str, str], before: str = "") -> int:
    """Bytes a fresh process keeps resident after freeing 49 blocks of 4 MiB."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run(
        [sys.executable, "-c", HEAP_PATTERN.format(before=before)],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    return int(out.split()[-1])


def test_the_threshold_is_the_users_where_they_set_a_whole_number(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert mmap_threshold() == MMAP_THRESHOLD and cpu_allocator.rank_environment() == {ENV: str(MMAP_THRESHOLD)}
    monkeypatch.setenv(ENV, "4194304")
    assert cpu_allocator.rank_environment() == {ENV: "4194304"}
    if GLIBC:
        assert allocator_key() == "glibc mmap from 4194304 B"
        monkeypatch.setenv(ENV, str(64 << 20))  # past glibc's largest: glibc ignores it, its threshold moves
        assert allocator_key() == "malloc's own"
    monkeypatch.setenv(ENV, "lots")
    assert mmap_threshold() == MMAP_THRESHOLD


@only_glibc
def test_a_cpu_ranks_freed_activations_go_back_to_the_system(tmp_path):
    from orchestrator.launchers.binding import binding
    from orchestrator.launchers.local import local_command

    env = local_command(build_spec([]), tmp_path, binding("none", "cpu", 2)).env
    assert ENV not in local_command(build_spec(["hardware=h100-sxm"]), tmp_path, binding("none", "cuda", 2)).env
    assert held({}) > 150 << 20  # glibc's default: the 49 freed 4 MiB blocks stay resident
    assert held({ENV: env[ENV]}) < 16 << 20  # the ranks': returned


@only_glibc
def test_a_process_timing_a_cpu_trials_kernels_allocates_as_the_ranks():
    # The planner's kernel timing fixes its own threshold (mallopt: its process has started,
    # too late for the variable), so its kernels pay the ranks' page faults.
    before = "from orchestrator.measure.cpu_allocator import allocate_as_the_ranks\nallocate_as_the_ranks()"
    assert held({}, before) < 16 << 20


def test_the_engines_timing_process_on_a_cpu_gets_the_ranks_allocator(monkeypatch):
    started = []
    monkeypatch.setattr(engine_timing.subprocess, "Popen", lambda argv, **kw: started.append(kw["env"]))
    monkeypatch.delenv(ENV, raising=False)
    cpu = engine_timing.EngineTiming({"engine": "deepspeed", "device": "cpu"}, 1, 1000, "cpu")
    engine_timing.start_timing(cpu.settings)
    engine_timing.start_timing({"engine": "deepspeed", "device": "cuda:0"})  # a GPU's: CUDA's allocator
    assert started[0][ENV] == str(MMAP_THRESHOLD) and ENV not in started[1]
    assert cpu.settings["allocator"] == allocator_key()
    monkeypatch.setenv(ENV, "4194304")  # another allocator: another line, timed again
    other = engine_timing.EngineTiming({"engine": "deepspeed", "device": "cpu"}, 1, 1000, "cpu")
    assert (other.key != cpu.key) == GLIBC
