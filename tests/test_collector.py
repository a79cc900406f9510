"""What Python's cyclic collector is kept from walking: imports (collector_paused) and a
program's exit (freeze_at_exit), both in orchestrator/core/process.py."""

import gc
import subprocess
import sys

import pytest

from orchestrator.core.process import collector_paused

# A fresh interpreter runs the orchestrator program's `main` as its console script does
# (argv None) or as a caller does (argv given). A handler registered before main runs after
# main's (atexit runs last-registered first) and says how many objects were frozen by then;
# one registered after main's runs before it and writes a file, as a command's own
# handlers flush what they hold.
EXIT = """
import atexit, gc, sys
atexit.register(lambda: print("frozen at exit:", gc.get_freeze_count()))
sys.argv = ["orchestrator", "--help"]
from orchestrator.cli import main
main() if {as_program} else main(["--help"])
atexit.register(lambda: open({written!r}, "w").write("flushed"))
"""


def test_the_collector_is_off_inside_and_as_it_was_after():
    assert gc.isenabled()
    with pytest.raises(RuntimeError):
        with collector_paused():
            assert not gc.isenabled()
            raise RuntimeError("an import failed")
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # a caller that had it off keeps it off
    finally:
        gc.enable()


@pytest.mark.parametrize("as_program", [True, False])
def test_the_program_freezes_its_objects_at_exit_after_its_handlers_and_a_callers_call_does_not(tmp_path, as_program):
    written = tmp_path / "handler.txt"
    proc = subprocess.run(
        [sys.executable, "-c", EXIT.format(as_program=as_program, written=str(written))],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    frozen = int(proc.stdout.rsplit("frozen at exit:", 1)[1])
    if as_program:
        assert frozen > 10_000  # every object of the imports: the interpreter's last collections walk none
    else:
        assert frozen == 0  # a test or a library calling main keeps its collector as it was
    assert written.read_text() == "flushed"  # a handler registered later still ran
