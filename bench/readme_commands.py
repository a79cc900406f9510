"""Every command of the README's "Every day" block, run here as it is written.

    .venv/bin/python bench/readme_commands.py OUT [--deadline S]

Each line is run as the README writes it, in OUT (a new directory), in its order: the
planning lines, then `run` (the trial the README shows), the local sweep, and the lines
that read a sweep (`status`, `wait`, `report`, `calibrate`) pointed at the sweep it made.
The README's placeholders are filled with what exists here: `multirun/DATE/TIME` is the
sweep just run, `past_runs.csv` that sweep's report.csv (a column per swept key and the
measured figures, which is what `--csv` reads), and the nccl-tests logs
`all_reduce_perf-2n.log all_reduce_perf-8n.log` are written in nccl-tests' own format from a
published p5 curve (no GPU here to run nccl-tests on). A line that needs what this machine lacks (a
SLURM cluster with a `gpu` partition and H100s) is named with what it needs, not run. A trial whose
plan says it takes longer than `--deadline` runs until then (its cost line printed and its first
rank started are checked) and is stopped; the table says so.

Prints one row per line: exit code, seconds, and what the README says it does, checked.
"""

from __future__ import annotations

import argparse
import csv
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # nccl-tests' output format, as the tests write it

from test_nccl_tests import curve, log  # noqa: E402

# The lines that run trials or collectives on a GPU cluster (SLURM, a gpu partition, H100s;
# translate and plan only write and print for one), and the tests that run the same
# command on the SLURM test cluster (tests/slurm/cluster.sh: CPU nodes, the cpu preset).
ON_THE_TEST_CLUSTER = {
    "run": "tests/test_slurm.py::test_a_sweep_submits_returns_at_once_and_wait_collects_it",
    "tune": "tests/test_slurm.py::test_tune_runs_its_rounds_as_slurm_jobs_and_waits_for_each",
    "--links": "tests/test_links_multinode.py::test_calibrate_links_recovers_the_shaped_rate_between_nodes",
}


def needs_gpus(line: str) -> str | None:
    """The test that runs this line's command on the test cluster, where the line needs GPUs."""
    words = line.split()
    if "--links" in words:
        return ON_THE_TEST_CLUSTER["--links"]
    if words[1] in ("run", "tune") and "cluster=slurm" in words:
        return ON_THE_TEST_CLUSTER[words[1]]
    return None


LINE_LIMIT_S = 3600.0  # any other line (the local sweep takes under 2 minutes here)


def readme_lines() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = text.split("## Every day", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.startswith("orchestrator ")]


def filled(line: str, sweep: Path | None) -> str:
    """The line with the README's placeholders made real here."""
    if sweep is not None:
        line = line.replace("multirun/DATE/TIME", str(sweep))
    return line


def nccl_logs(out: Path) -> None:
    """all_reduce_perf-2n.log and -8n.log: all_reduce_perf on 2 and 8 p5 nodes, 8 GPUs each (the
    shape of AWS's published p5 curves; 8 nodes at 0.8 of the 2-node bus bandwidth)."""
    for nodes, scale in ((2, 1.0), (8, 0.8)):
        (out / f"all_reduce_perf-{nodes}n.log").write_text(
            log("all_reduce", nodes, 8, curve(*(scale * b for b in (18, 55, 140, 280, 370, 420))))
        )


def past_runs_csv(out: Path) -> None:
    """past_runs.csv from `report multirun/`'s report.csv (the one sweep run here): the swept
    keys and the measured step time, a row per trial."""
    rows = list(csv.DictReader((out / "multirun" / "report.csv").open()))
    keys = ["parallel.dp", "zero.reduce_bucket_size", "zero.stage", "run.steps"]
    with (out / "past_runs.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow([*keys, "step_time_s"])
        for r in rows:
            if r.get("status") == "ok":
                w.writerow([r.get("parallel.dp"), r.get("zero.reduce_bucket_size"), 2, 6, r["step_time_s"]])


def run_line(line: str, out: Path, deadline: float) -> tuple[int | str, float, str]:
    """Run one line in `out`; stop it at `deadline` seconds (a trial planned to take longer)."""
    argv = [str(Path(sys.executable).parent / "orchestrator"), *shlex.split(line)[1:]]
    start = time.monotonic()
    proc = subprocess.Popen(
        argv, cwd=out, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        stdout, _ = proc.communicate(timeout=deadline)
        return proc.returncode, time.monotonic() - start, stdout
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGINT)  # a user's Ctrl-C, to the command and its ranks
        try:
            stdout, _ = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, _ = proc.communicate()
        return "stopped", time.monotonic() - start, stdout


def check(line: str, code, stdout: str, out: Path, sweep: Path | None) -> str:
    """What the README says the line does, checked on what it printed and wrote."""
    words = " ".join(stdout.split())
    if line.endswith("--help"):
        return "the config groups listed" if code == 0 and "config groups" in words.lower() else "NO help"
    if line.startswith("orchestrator run -m"):
        return "a result.json per point" if sweep and len(list(sweep.glob("*/result.json"))) >= 4 else "MISSING results"
    if line.startswith("orchestrator run "):
        said = "planned:" in words and "s a step" in words
        started = bool(list(out.glob("outputs/*/*/logs/rank0.log")))
        return ("cost said before the start" if said else "NO cost line") + ("; rank 0 started" if started else "")
    if " status " in f" {line} ":
        return "a state per trial" if words.count(" ok") >= 4 else "MISSING states"
    if " report " in f" {line} ":
        return "report.csv written" if (out / "multirun" / "report.csv").is_file() else "NO report.csv"
    if " calibrate " in f" {line} ":
        return "a calibrated preset written" if "calibrated" in words else "NO preset"
    return "exit 0" if code == 0 else "FAILED"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument(
        "--deadline",
        type=float,
        default=600.0,
        help="seconds the README's one-trial `run` may take before it is stopped",
    )
    args = ap.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True)
    nccl_logs(out)
    env_note = f"ORCHESTRATOR_USER_CONF={out / 'conf'}"
    os.environ["ORCHESTRATOR_USER_CONF"] = str(out / "conf")  # a calibration here writes no user's preset
    os.environ.setdefault("WANDB_MODE", "offline")
    sweep: Path | None = None
    rows = []
    for line in readme_lines():
        if test := needs_gpus(line):
            rows.append((line, "-", 0.0, f"not run: needs a SLURM cluster with GPUs; on CPU nodes: {test}"))
            continue
        if "--csv" in line and (out / "multirun" / "report.csv").is_file():
            past_runs_csv(out)
        one_trial = line.startswith("orchestrator run ") and "-m" not in line.split() and "--help" not in line
        code, seconds, stdout = run_line(filled(line, sweep), out, args.deadline if one_trial else LINE_LIMIT_S)
        (out / f"line-{len(rows):02d}.log").write_text(f"$ {filled(line, sweep)}\n{stdout}")
        if line.startswith("orchestrator run -m") and (made := sorted(out.glob("multirun/*/*"))):
            sweep = made[-1]
        rows.append((line, code, seconds, check(line, code, stdout, out, sweep)))
    print(f"{len(rows)} README lines, run in {out} ({env_note}); each line's output in line-NN.log\n")
    print(f"{'exit':>7}  {'seconds':>8}  line / checked")
    for line, code, seconds, verdict in rows:
        print(f"{code!s:>7}  {seconds:8.1f}  {line}\n{'':19}{verdict}")


if __name__ == "__main__":
    main()
