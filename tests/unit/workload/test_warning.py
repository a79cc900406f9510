"""SLURM's warning (SIGUSR2) is noted at a step boundary and kills nothing on the way.

Real signals to real processes; the SLURM side is in test_slurm.py.
"""

import subprocess
import sys

RANK = r"""
import os, signal, subprocess, sys
from orchestrator.workload import warning

warning.listen()
assert not warning.warned()
# A child the rank spawns (as DeepSpeed spawns ninja to build an op) gets the warning too.
child = subprocess.run([sys.executable, "-c",
                        "import os, signal; os.kill(os.getpid(), signal.SIGUSR2); print('built')"],
                       capture_output=True, text=True)
print("child", child.returncode, child.stdout.strip())
os.kill(os.getpid(), signal.SIGUSR2)
print("warned", warning.warned(), warning.warned())  # noted, and it stays noted until saved
warning.clear()
print("after save", warning.warned())  # consumed: one warning, one save
"""


def test_the_warning_is_noted_once_and_kills_neither_the_rank_nor_its_children():
    proc = subprocess.run([sys.executable, "-c", RANK], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines == ["child 0 built", "warned True True", "after save False"]
