"""The `orchestrator` command: run, plan, translate, status, wait and report.

Every subcommand that takes a trial reads Hydra overrides (`model=gpt2-350m
zero.stage=2`), and with -m a Hydra multirun sweep (`parallel.dp=1,2,4`,
`+sweep=dp_bucket`). All points of a sweep are composed and validated before anything
starts, so a bad value fails in a second with exit code 2 and a one-paragraph message,
not half-way through a sweep with a traceback.

Exit codes: 0 ok; 1 a trial ran and failed; 2 invalid config; 3 the plan refuses.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
from pathlib import Path

from orchestrator.compose import expand_sweep, presets, swept_values
from orchestrator.config import GROUPS
from orchestrator.display import console, show_plan, show_report, show_states, show_sweep, trial_label
from orchestrator.errors import ConfigError, Interrupted, PlanRefused
from orchestrator.plan.planner import make_plan
from orchestrator.report import collect, write_report
from orchestrator.spec import TrialSpec, build_spec
from orchestrator.tracking import sync_hint
from orchestrator.translate import write_trial_files
from orchestrator.files import read_json
from orchestrator.trial import check_runnable_here, collect_state, run_trial, submit_trials, wait_for
from orchestrator.trial_dir import CLAIM, SWEEP_CLAIM, claim, trials_below, writable_dir

FIELDS_ONLY = "(fields, no presets)"


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    Interrupted.install()  # Ctrl-C and SIGTERM: record what runs, then one line, no traceback
    try:
        return args.handler(args)
    except (ConfigError, PlanRefused) as exc:
        print(f"orchestrator {args.command}: {exc}", file=sys.stderr)
        return exc.exit_code
    except Interrupted as exc:
        print(f"orchestrator {args.command}: interrupted by {exc}" + (" (the running trial is recorded as "
              "interrupted)" if args.command == "run" else ""), file=sys.stderr)
        return exc.exit_code


def specs_from(args: argparse.Namespace) -> list[TrialSpec]:
    """Every trial the command line asks for, composed and validated (ConfigError if not)."""
    sweep_files = [o for o in args.overrides if o.lstrip("+").partition("=")[0] == "sweep"]
    if sweep_files and not args.multirun:  # its axes would be silently ignored
        raise ConfigError("+sweep", sweep_files[0].partition("=")[2], f"a sweep file runs with -m: orchestrator "
                          f"{args.command} -m {' '.join(args.overrides)}")
    points = expand_sweep(args.overrides) if args.multirun else [args.overrides]
    specs = []
    for i, point in enumerate(points):
        try:
            specs.append(build_spec(point))
        except ConfigError as exc:
            if len(points) > 1:
                exc.args = (f"sweep point {i + 1} of {len(points)} ({' '.join(point)}): {exc}",)
            raise
    return specs


# --- subcommands ------------------------------------------------------------------------


def plan_command(args: argparse.Namespace) -> int:
    points = [(spec, make_plan(spec)) for spec in specs_from(args)]
    if args.json:
        data = ([{"overrides": list(spec.overrides), "plan": plan.as_dict()} for spec, plan in points]
                if args.multirun else points[0][1].as_dict())
        print(json.dumps(data, indent=2))
    elif len(points) == 1 and not args.multirun:
        show_plan(*points[0], console())
    else:
        show_sweep(points, console())
    refused = [spec for spec, plan in points if not plan.fits]
    if refused:
        print(f"orchestrator plan: {len(refused)} of {len(points)} trial(s) do not fit in device memory "
              "(run.force=true launches anyway)", file=sys.stderr)
        return PlanRefused.exit_code
    return 0


def run_command(args: argparse.Namespace) -> int:
    specs = specs_from(args)
    for spec in specs:
        check_runnable_here(spec)
    # Claimed only now that every point is valid: bad input leaves no directory behind.
    base = claim(Path(args.out) if args.out else default_output_dir(args.multirun), "--out",
                 overwrite=args.overwrite, unique=not args.out, marker=SWEEP_CLAIM if args.multirun else CLAIM)
    out = console()
    swept = swept_values([spec.overrides for spec in specs])
    group = "_".join(base.parts[-2:]) if not args.out else base.name  # multirun/DATE/TIME -> DATE_TIME
    points = []
    for i, spec in enumerate(specs):
        trial_dir = base / point_name(i, spec) if args.multirun else base
        name = ",".join(f"{k}={v}" for k, v in swept[i].items()) or " ".join(spec.overrides) or "default"
        points.append((spec, trial_dir, {"group": group if args.multirun else None, "name": name[:120],
                                         "index": i, "swept": swept[i]}))
    if any(spec.cfg.cluster.name == "slurm" for spec in specs):
        for _, trial_dir, _ in points:
            if trial_dir != base:
                claim(trial_dir, "--out")
        refused = submit_trials(points, base / "slurm-logs", out)
        if not all(spec.cfg.cluster.wait for spec in specs):
            out.print(f"follow with: orchestrator status {base}   |   orchestrator wait {base}")
            return 3 if refused and len(refused) == len(points) else 0
        results = wait_for(base, out)
        show_report(collect(base)[0], out)
    else:
        # Each point's directory is claimed when it starts: an interrupted sweep leaves no
        # directories for the points it never ran.
        results = [run_trial(spec, trial_dir if trial_dir == base else claim(trial_dir, "--out"), out, sweep)
                   for spec, trial_dir, sweep in points]
    if hint := sync_hint([trial_dir for _, trial_dir, _ in points]):
        out.print(f"[dim]{hint}[/dim]")
    return _sweep_outcome(results, base, out)


def _sweep_outcome(results: list[dict], base: Path, out) -> int:
    if len(results) > 1:
        failed = [r for r in results if r["status"] != "ok"]
        out.print(f"sweep: {len(results) - len(failed)} ok, {len(failed)} not ({', '.join(r['status'] for r in failed)})"
                  f" in {base}" if failed else f"sweep: all {len(results)} ok in {base}")
    codes = {r["exit_code"] for r in results}
    return 1 if codes - {0, 3} else max(codes)  # a failure outranks a refusal


def status_command(args: argparse.Namespace) -> int:
    directory = Path(args.dir)
    dirs = trials_below(directory)
    if not dirs:
        print(f"orchestrator status: {directory} holds no trial", file=sys.stderr)
        return 2
    rows = []
    for trial_dir in dirs:
        state, result = collect_state(trial_dir)
        job = (read_json(trial_dir / "slurm.json") or {}).get("job_id", "")
        error = (result or {}).get("error") or {}
        if state == "unreadable":
            print(f"orchestrator status: warning: skipped {error['message']}", file=sys.stderr)
        rows.append((str(trial_dir.relative_to(directory)) or ".", job, state, error.get("message", "")[:100]))
    show_states(rows, console())
    return 0


def wait_command(args: argparse.Namespace) -> int:
    directory = Path(args.dir)
    if not trials_below(directory):
        print(f"orchestrator wait: {directory} holds no trial", file=sys.stderr)
        return 2
    out = console()
    try:
        results = wait_for(directory, out, timeout_s=args.timeout)
    except TimeoutError as exc:
        print(f"orchestrator wait: {exc} after --timeout {args.timeout:g} s", file=sys.stderr)
        return 1
    show_report(collect(directory)[0], out)
    return _sweep_outcome(results, directory, out)


def default_output_dir(multirun: bool) -> Path:
    """Hydra's layout: outputs/DATE/TIME for one trial, multirun/DATE/TIME/N_overrides for a sweep."""
    stamp = datetime.datetime.now()
    return Path("multirun" if multirun else "outputs") / stamp.strftime("%Y-%m-%d") / stamp.strftime("%H-%M-%S")


def translate_command(args: argparse.Namespace) -> int:
    specs = specs_from(args)
    out = writable_dir(Path(args.out), "--out")
    for i, spec in enumerate(specs):
        trial_dir = out / point_name(i, spec) if args.multirun else out
        files = write_trial_files(spec, trial_dir, plan=make_plan(spec).as_dict())
        print(f"{trial_label(spec)}\n  wrote {', '.join(p.name for p in files.written)} in {files.directory}")
        for w in files.warnings:
            print(f"  warning: {w}", file=sys.stderr)
    return 0


def point_name(index: int, spec: TrialSpec) -> str:
    """A sweep point's directory: its index, then its overrides made file-name safe."""
    slug = re.sub(r"[^A-Za-z0-9_.=,-]+", "_", ",".join(spec.overrides))[:120]
    return f"{index:03d}_{slug}" if slug else f"{index:03d}"


def report_command(args: argparse.Namespace) -> int:
    directory = Path(args.dir)
    rows, results = collect(directory)
    if not rows:
        print(f"orchestrator report: {directory} holds no result.json (run trials with `orchestrator run`)",
              file=sys.stderr)
        return 2
    written = write_report(directory, rows, results)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        show_report(rows, console())
    print("wrote " + ", ".join(str(p) for p in written), file=sys.stderr if args.json else sys.stdout)
    return 0


# --- argument parsing -----------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="orchestrator",
        description="Declarative experiments for distributed LLM training: plan a trial, "
                    "write its DeepSpeed/Accelerate configs, launch it here or on SLURM, measure it.",
        epilog=_groups_help() + _EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def trial_command(name: str, summary: str, handler) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=summary, description=summary, epilog=_groups_help(),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("overrides", nargs="*", metavar="OVERRIDE",
                       help="Hydra override: group=preset (model=gpt2-350m), field=value "
                            "(zero.reduce_bucket_size=2e8), with -m a sweep (parallel.dp=1,2,4)")
        p.add_argument("-m", "--multirun", action="store_true", help="run a Hydra sweep over comma lists, range(), +sweep=NAME")
        p.set_defaults(handler=handler)
        return p

    run = trial_command("run", "Run one trial (or a sweep with -m) and record result.json.", run_command)
    run.add_argument("--out", metavar="DIR", help="trial directory (default outputs/DATE/TIME, multirun/DATE/TIME); "
                     "one that holds a trial is refused unless --overwrite")
    run.add_argument("--overwrite", action="store_true", help="replace the trial --out holds (it is deleted first)")
    plan = trial_command("plan", "Predict memory, FLOPs, communication and step time; launch nothing.", plan_command)
    plan.add_argument("--json", action="store_true", help="print the plan as JSON (the keys of DESIGN.md)")
    translate = trial_command("translate", "Write the engine configs and launch commands without running.",
                              translate_command)
    translate.add_argument("--out", required=True, metavar="DIR", help="directory for the configs and commands")
    status = sub.add_parser("status", help="State of every trial below DIR (pending, running, ok, failed, ...).",
                            description="State of every trial below DIR, from sacct and the trial files.")
    status.add_argument("dir", metavar="DIR")
    status.set_defaults(handler=status_command)
    wait = sub.add_parser("wait", help="Wait until every trial below DIR has ended, then show the results.",
                          description="Wait until every trial below DIR has ended, then show the results.")
    wait.add_argument("dir", metavar="DIR")
    wait.add_argument("--timeout", type=float, default=None, metavar="SECONDS", help="give up after this long")
    wait.set_defaults(handler=wait_command)
    report = sub.add_parser("report", help="Collect every result.json below DIR into a table, CSV and plots.",
                            description="Collect every result.json below DIR into a table, CSV and plots.")
    report.add_argument("dir", metavar="DIR")
    report.add_argument("--json", action="store_true", help="print the collected rows as JSON")
    report.set_defaults(handler=report_command)
    return parser


def _groups_help() -> str:
    lines = ["config groups (choose with GROUP=PRESET, override fields with GROUP.FIELD=VALUE):"]
    lines += [f"  {group:<10} {', '.join(presets(group))}" for group in GROUPS]
    lines += [f"  {group:<10} {FIELDS_ONLY}" for group in ("parallel", "run")]
    sweeps = presets("sweep")
    lines.append(f"  {'sweep':<10} {', '.join(sweeps) if sweeps else '(none yet)'}  (with -m: +sweep=NAME)")
    return "\n".join(lines) + "\n"


_EXAMPLES = """
examples:
  orchestrator run                                   the default: tiny GPT, 2 CPU ranks, W&B offline
  orchestrator plan model=gpt2-1.3b zero=stage2 hardware=h100-sxm parallel.dp=8
  orchestrator plan -m model=gpt2-1.3b hardware=h100-sxm parallel.dp=8,16,32,64
  orchestrator translate model=llama3-8b zero=stage3 hardware=h100-sxm --out cfgs/
  orchestrator run -m +sweep=dp_bucket_local
  orchestrator report multirun/

exit codes: 0 ok, 1 a trial failed, 2 invalid config, 3 the plan refuses (run.force=true launches anyway)
"""
