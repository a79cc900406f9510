"""The `orchestrator` command: run, plan, translate, tune, status, wait, report and calibrate.

run, plan, translate and tune take Hydra overrides and Hydra's flags: they are Hydra apps
(commands.py). status, wait, report and calibrate take directories (argparse, here).

Exit codes: 0 ok; 1 a trial ran and failed; 2 invalid config; 3 the plan refuses.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from orchestrator import commands
from orchestrator.analysis.report import COLUMNS, collect, write_report
from orchestrator.config import GROUPS
from orchestrator.core.errors import ConfigError, Interrupted, MeasurementFailed, PlanRefused, did_you_mean, one_of
from orchestrator.core.files import read_json, strict_json
from orchestrator.core.process import freeze_at_exit
from orchestrator.core.redact import redacted_output
from orchestrator.hardware_presets import calibrated_table_path
from orchestrator.hydra_glue.compose import MAX_POINTS
from orchestrator.hydra_glue.conf_tree import presets
from orchestrator.records.trial_dir import TrialPaths, trials_below
from orchestrator.run.display import console, show_bus_table, show_calibration, show_links, show_report, show_states
from orchestrator.run.trial import collect_states, wait_for
from orchestrator.spec import build_spec
from orchestrator.validation.checks import number_from_text
from orchestrator.workload.rank_steps import straggler_cell

FIELDS_ONLY = "(fields, no presets)"
HYDRA_COMMANDS = {  # commands.COMMANDS, summed up for `orchestrator --help`
    "run": "Run one trial (or a sweep with -m) and record result.json; `run --help` for overrides and Hydra flags.",
    "plan": "Predict memory, FLOPs, communication and step time; launch nothing (--json).",
    "translate": "Write the engine configs and launch commands without running (--out DIR).",
    "tune": "Find the fastest ZeRO stage, micro batch, recompute and buckets: plan all, run the best few, "
    "calibrate, repeat (--trials N, --minutes M, --out DIR).",
}
COMMANDS = (*commands.COMMANDS, "status", "wait", "report", "calibrate")


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # the program itself (its console script, python -m orchestrator), not a caller's call
        freeze_at_exit()
    argv = sys.argv[1:] if argv is None else list(argv)
    Interrupted.install()  # Ctrl-C and SIGTERM: record what runs, then one line, no traceback
    with redacted_output():  # what is printed (errors, --cfg job, tables) holds no secret
        return _command(argv)


def _command(argv: list[str]) -> int:
    command = argv[0] if argv else ""
    try:
        code = _dispatch(command, argv)
        if (lost := Interrupted.swallowed()) is not None:  # raised inside a finalizer and dropped there
            raise lost
        return code
    except (ConfigError, PlanRefused, MeasurementFailed) as exc:
        print(f"orchestrator {command}: {exc}", file=sys.stderr)
        return exc.exit_code
    except Interrupted as exc:
        print(
            f"orchestrator {command}: interrupted by {exc}"
            + (" (a trial that was running is recorded as interrupted)" if command in ("run", "tune") else ""),
            file=sys.stderr,
        )
        return exc.exit_code
    except SystemExit as exc:  # Hydra's --help and its own errors end this way
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)


def _dispatch(command: str, argv: list[str]) -> int:
    if command in commands.COMMANDS:
        return commands.main(command, argv[1:])
    if command and not command.startswith("-") and command not in COMMANDS:
        raise ConfigError("command", command, f"one of {one_of(COMMANDS)}{did_you_mean(command, COMMANDS)}")
    args = _parser().parse_args(argv)
    return args.handler(args)


# --- subcommands ------------------------------------------------------------------------


def status_command(args: argparse.Namespace) -> int:
    directory = Path(args.dir)
    dirs = trials_below(directory)
    if not dirs:
        print(f"orchestrator status: {directory} holds no trial", file=sys.stderr)
        return 2
    rows = []
    for trial_dir, (state, result) in collect_states(dirs).items():
        job = (read_json(TrialPaths(trial_dir).slurm_job) or {}).get("job_id", "")
        error = (result or {}).get("error") or {}
        if state == "unreadable":
            print(f"orchestrator status: warning: skipped {error['message']}", file=sys.stderr)
        metrics = (result or {}).get("metrics")
        ranks = metrics.get("ranks") if isinstance(metrics, dict) else None
        cause = error.get("message", "")[:100]
        rows.append((str(trial_dir.relative_to(directory)) or ".", job, state, cause, straggler_cell(ranks)))
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
    show_report(collect(directory)[0], COLUMNS, out)
    return commands.sweep_outcome(results, directory, out)


def report_command(args: argparse.Namespace) -> int:
    directory = Path(args.dir)
    rows, results = collect(directory)
    if not rows:
        print(
            f"orchestrator report: {directory} holds no result.json (run trials with `orchestrator run`)",
            file=sys.stderr,
        )
        return 2
    written = write_report(directory, rows, results)
    from orchestrator.analysis.tune.record import render  # a tune's directory: its own table and plot again

    written += render(directory)
    if args.json:
        print(strict_json(rows))
    else:
        show_report(rows, COLUMNS, console())
    print("wrote " + ", ".join(str(p) for p in written), file=sys.stderr if args.json else sys.stdout)
    return 0


def calibrate_command(args: argparse.Namespace) -> int:
    from orchestrator.analysis.calibrate import calibrate  # the planner and its fit: not needed by other commands

    if args.links:
        return links_command(args)
    if args.nccl_tests:
        return nccl_tests_command(args)
    if not args.dirs and not args.csv:
        raise ConfigError("DIR", "(none)", "a directory of trials, or --csv FILE of measured runs")
    warn = lambda line: print(line, file=sys.stderr)  # noqa: E731
    if args.max_rows < 1:
        raise ConfigError("--max-rows", args.max_rows, f"a whole number of CSV rows >= 1 (default {MAX_POINTS:,})")
    for c in calibrate([Path(d) for d in args.dirs], Path(args.csv) if args.csv else None, warn, args.max_rows):
        show_calibration(c, console())
    return 0


def links_command(args: argparse.Namespace) -> int:
    """calibrate --links: the network measured as nccl-tests does, fitted, written."""
    from orchestrator.measure import links  # measures with torchrun or srun: not needed by other commands

    args.hardware = args.hardware or "cpu"
    links.check_hardware(args.hardware)
    device = "cuda" if build_spec([f"hardware={args.hardware}"]).cfg.hardware.device.is_gpu else "cpu"
    nodes = links.check_arguments(args.nodes, args.ranks_per_node, args.max_mb, args.reps, args.partition, device)
    backend = "nccl" if device == "cuda" else "gloo"
    rows = links.measure(nodes, args.ranks_per_node, args.max_mb, args.reps, device, args.partition)
    inside, between = links.fit_network(rows, backend)
    what = f"{backend}, {args.ranks_per_node} rank(s) per node on {args.nodes} node(s), up to {args.max_mb:g} MB"
    path = links.write_links(args.hardware, inside, between, what, table=links.table_of(rows, what))
    show_links(rows, [links.predicted_seconds(m, inside, between, backend) for m in rows], inside, between, console())
    console().print(f"wrote {path} (hardware={Path(path).stem})")
    return 0


def nccl_tests_command(args: argparse.Namespace) -> int:
    """calibrate --nccl-tests FILE...: published or the user's own nccl-tests logs, as the
    network table of NAME-calibrated."""
    from orchestrator.measure import links, nccl_tests  # not needed by other commands

    if args.hardware is None:  # --links' default is this CPU; nccl-tests ran on GPUs someone must name
        raise ConfigError(
            "--hardware",
            "(none)",
            "the GPU preset these nccl-tests logs measured, e.g. --hardware "
            "h100-sxm: its calibrated copy gets their network table",
        )
    links.check_hardware(args.hardware)
    if not build_spec([f"hardware={args.hardware}"]).cfg.hardware.device.is_gpu:
        raise ConfigError(
            "--hardware",
            args.hardware,
            "a GPU preset: nccl-tests measures NCCL between GPUs, and a "
            "CPU preset's network is gloo's (calibrate --links measures it)",
        )
    runs = [run for f in args.nccl_tests for run in nccl_tests.read_runs(Path(f))]
    for run in runs:
        if not run.complete:
            print(
                f"warning: {run.path} has no '# Avg bus bandwidth' footer: the run was cut short; its "
                f"{len(run.rows)} complete row(s) are used",
                file=sys.stderr,
            )
    table = nccl_tests.table_of(runs)
    # ten imports at once: each curve kept, or told why not (the preset's lock)
    path = links.write_network_table(args.hardware, table, f"the network as nccl-tests measured it ({table.source})")
    show_bus_table(table, console())
    console().print(f"wrote {calibrated_table_path(args.hardware)} and {path} (hardware={Path(path).stem})")
    return 0


# --- argument parsing -----------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="orchestrator",
        description="Declarative experiments for distributed LLM training: plan a trial, "
        "write its DeepSpeed/Accelerate configs, launch it here or on SLURM, measure it.",
        epilog=_groups_help() + _EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    for name, summary in HYDRA_COMMANDS.items():  # parsed by commands.py; listed here for --help
        sub.add_parser(name, help=summary, add_help=False)
    status = sub.add_parser(
        "status",
        help="State of every trial below DIR (pending, running, ok, failed, ...).",
        description="State of every trial below DIR, from sacct and the trial files.",
    )
    status.add_argument("dir", metavar="DIR")
    status.set_defaults(handler=status_command)
    wait = sub.add_parser(
        "wait",
        help="Wait until every trial below DIR has ended, then show the results.",
        description="Wait until every trial below DIR has ended, then show the results.",
    )
    wait.add_argument("dir", metavar="DIR")
    wait.add_argument(
        "--timeout",
        type=_seconds("--timeout"),
        default=None,
        metavar="SECONDS",
        help="give up after this long (0: look once)",
    )
    wait.set_defaults(handler=wait_command)
    report = sub.add_parser(
        "report",
        help="Collect every result.json below DIR into a table, CSV and plots.",
        description="Collect every result.json below DIR into a table, CSV and plots.",
    )
    report.add_argument("dir", metavar="DIR")
    report.add_argument("--json", action="store_true", help="print the collected rows as JSON")
    report.set_defaults(handler=report_command)
    _add_calibrate(sub)
    return parser


def _add_calibrate(sub) -> None:
    """`calibrate`'s flags: the trials or a CSV to fit, or a network to measure (--links) or read
    (--nccl-tests)."""
    calib = sub.add_parser(
        "calibrate",
        help="Fit a hardware preset's step-time and network parameters to the trials below DIR (or to --csv FILE).",
        description="Fit the step-time parameters of each hardware kind found among the ok "
        "trials below DIR to their measured step times, and write the preset as "
        "NAME-calibrated in the user's config directory (hardware=auto prefers it).",
    )
    calib.add_argument("dirs", metavar="DIR", nargs="*")
    calib.add_argument(
        "--csv",
        metavar="FILE",
        help="measured runs this tool did not make: a column per override key "
        "(zero, model.hidden, parallel.dp, ...) and tokens_per_sec_per_gpu or step_time_s",
    )
    calib.add_argument(
        "--links",
        action="store_true",
        help="measure the network instead (all-reduce, "
        "reduce-scatter, all-gather, 1 MB up to --max-mb) and write its levels into the preset",
    )
    calib.add_argument(
        "--nccl-tests",
        nargs="+",
        metavar="FILE",
        help="nccl-tests logs (all_reduce_perf, "
        "all_gather_perf, reduce_scatter_perf; one or more runs a file): their bus bandwidth "
        "by size becomes the network table of --hardware's calibrated preset",
    )
    calib.add_argument(
        "--max-rows",
        type=int,
        default=MAX_POINTS,
        help=f"--csv: refuse a file of more rows "
        f"than this (default {MAX_POINTS:,}; each row is planned at every step of the fit)",
    )
    calib.add_argument(
        "--hardware",
        default=None,
        help="--links (default: cpu), --nccl-tests (a GPU preset, "
        "required): the preset whose -calibrated copy gets the network",
    )
    calib.add_argument("--nodes", default="1", help="--links: node counts, e.g. 1,2,4 (more than one: through srun)")
    calib.add_argument("--ranks-per-node", type=int, default=2, help="--links: ranks on each node (its GPUs)")
    calib.add_argument("--max-mb", type=float, default=1024, help="--links: the largest buffer, MB (from 1 MB)")
    calib.add_argument("--reps", type=int, default=5, help="--links: timed calls per size (the median counts)")
    calib.add_argument("--partition", default=None, help="--links: the SLURM partition (also runs one node there)")
    calib.set_defaults(handler=calibrate_command)


def _seconds(flag: str):
    """An argparse type: a finite number of seconds >= 0, else exit 2 naming the flag."""

    def parse(text: str) -> float:
        value = number_from_text(text)
        if value is None or value < 0:
            raise argparse.ArgumentTypeError(
                f"{text} is not allowed: seconds >= 0, e.g. {flag} 600 (0: look "
                "once; leave it out to wait as long as it takes)"
            )
        return value

    return parse


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
  orchestrator calibrate multirun/                   fit the plan's step-time model to what ran
  orchestrator tune model=gpt2-1.3b hardware=h100-sxm parallel.dp=8 cluster=slurm --trials 8

exit codes: 0 ok, 1 a trial failed, 2 invalid config, 3 the plan refuses (run.force=true launches anyway)
"""
