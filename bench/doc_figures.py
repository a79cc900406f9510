"""The accuracy figures the docs quote, rewritten from what the code plans now.

    .venv/bin/python bench/doc_figures.py           # rewrite every block in place
    .venv/bin/python bench/doc_figures.py --check   # exit 1, naming each block that is stale

A figure about the published sets lives in a block of README.md, docs/*.md or
bench/RESULTS.md fenced by two comments:

    <!-- figures: NAME -->
    ...what BLOCKS[NAME]() renders...
    <!-- /figures: NAME -->

This script owns the text between them; tests/test_published_accuracy.py fails when a block
differs from what its renderer prints today, so no figure stands for code that no longer
produces it. Everything here is planned, nothing timed: the blocks are the same on every
machine.
"""

from __future__ import annotations

import argparse
import functools
import re
import sys
from collections.abc import Callable
from pathlib import Path

import buckets
import gpu_host
import published
from published import SETS, Planned, floors, plan_rows, scaling_ratio, share_within, summary

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"(<!-- figures: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /figures: (?P=name) -->)", re.DOTALL)


def docs() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "bench" / "RESULTS.md"]


@functools.cache
def planned(name: str) -> tuple[Planned, ...]:
    return tuple(plan_rows(SETS[name].rows()))


@functools.cache
def held_out() -> tuple[tuple[Planned, ...], tuple[tuple[str, float], ...]]:
    rows, params = published.calibrated_held_out()
    return tuple(rows), tuple(params.items())


def ratio_text(p: Planned) -> str:
    return f"{p.ratio:.2f}" if p.ratio is not None else "-"


def summary_table() -> str:
    """Each set: rows within 20 %, its floor, the ratios' range."""
    held = floors()
    lines = [
        "| published set | rows | within 20 % | floor | pred / measured | median |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, data in SETS.items():
        s = summary(list(planned(name)))
        lines.append(
            f"| {data.title} (`{name}`) | {s['rows']} | **{s['within']}** | {held[name]} | "
            f"{s['low']:.2f}-{s['high']:.2f} | {s['median']:.2f} |"
        )
    rows, _ = held_out()
    s = summary(list(rows))
    lines.append(
        f"| Ultra-Scale 1B, calibrated on dp 8-32, dp 64-256 held out (`ultrascale-1b-calibrated`) | "
        f"{s['rows']} | **{s['within']}** | {held['ultrascale-1b-calibrated']} | "
        f"{s['low']:.2f}-{s['high']:.2f} | {s['median']:.2f} |"
    )
    return "\n".join(lines) + "\n"


def ultrascale_rows() -> str:
    """The 1B rows per network: pred / measured tokens/s/GPU."""
    names = ("ultrascale-1b", "ultrascale-1b-p5", "ultrascale-1b-sxm")
    columns = [{p.row.key: p for p in planned(n)} for n in names]
    calibrated = {p.row.key: p for p in held_out()[0]}
    lines = [
        "| dp | ZeRO | micro | measured tok/s/GPU | its cluster's network | h100-p5 | h100-sxm | calibrated |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key, p in columns[0].items():
        cells = [ratio_text(c[key]) for c in columns] + [ratio_text(calibrated[key]) if key in calibrated else "fit"]
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {p.row.measured:,.0f} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def ultrascale_scaling() -> str:
    """dp 256 / dp 8 at micro batch 1, measured and planned, per network."""
    lines = ["| network | ZeRO-0: dp 256 / dp 8 | ZeRO-1 |", "|---|---:|---:|"]
    measured = [scaling_ratio(list(planned("ultrascale-1b")), stage)[0] for stage in (0, 1)]
    lines.append(f"| measured | {measured[0]:.2f} | {measured[1]:.2f} |")
    for name in ("ultrascale-1b", "ultrascale-1b-p5", "ultrascale-1b-sxm"):
        predicted = [scaling_ratio(list(planned(name)), stage)[1] for stage in (0, 1)]
        lines.append(f"| planned, {SETS[name].title.split(', ')[1]} | {predicted[0]:.2f} | {predicted[1]:.2f} |")
    return "\n".join(lines) + "\n"


def llm_foundry_by_gpu() -> str:
    lines = ["| GPU | rows | within 20 % | pred / measured |", "|---|---:|---:|---:|"]
    rows = planned("llm-foundry")
    for gpu in dict.fromkeys(p.row.key[0] for p in rows):
        of = [p for p in rows if p.row.key[0] == gpu]
        s = summary(of)
        lines.append(f"| {gpu} | {s['rows']} | {s['within']} | {s['low']:.2f}-{s['high']:.2f} |")
    return "\n".join(lines) + "\n"


def fms_rows() -> str:
    eager, compiled = planned("fms-fsdp-eager"), planned("fms-fsdp-compile")
    lines = [
        "| run | eager: measured tok/s/GPU | planned | pred / meas | compiled: measured | planned | pred / meas |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for e, c in zip(eager, compiled):
        lines.append(
            f"| {e.row.label} | {e.row.measured:,.0f} | {e.predicted:,.0f} | {ratio_text(e)} | "
            f"{c.row.measured:,.0f} | {c.predicted:,.0f} | {ratio_text(c)} |"
        )
    return "\n".join(lines) + "\n"


def calibrated_fit() -> str:
    rows, params = held_out()
    within, n = share_within(list(rows))
    fitted = ", ".join(f"`{k}={v:.3g}`" for k, v in params)
    return f"Fitted on the 6 measured dp 8-32 rows: {fitted}; held out: {within} of {n} rows within 20 %.\n"


BLOCKS: dict[str, Callable[[], str]] = {
    "published-summary": summary_table,
    "ultrascale-rows": ultrascale_rows,
    "ultrascale-scaling": ultrascale_scaling,
    "ultrascale-calibrated": calibrated_fit,
    "llm-foundry-by-gpu": llm_foundry_by_gpu,
    "fms-fsdp-rows": fms_rows,
    "buckets-gpu": buckets.table,
    "gpu-host-h100": lambda: "```\n" + gpu_host.report(gpu_host.H100_RUNS) + "```\n",
}


def blocks_in(text: str) -> list[tuple[str, str]]:
    """(name, body) of every block in a document."""
    return [(m["name"], m["body"]) for m in BLOCK.finditer(text)]


def rewrite(text: str) -> str:
    return BLOCK.sub(lambda m: m.group(1) + BLOCKS[m["name"]]() + m.group(4), text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="rewrite nothing; exit 1 if a block is stale")
    args = parser.parse_args()
    stale = []
    for path in docs():
        text = path.read_text()
        new = rewrite(text)
        if new != text:
            stale += [
                f"{path.relative_to(ROOT)}: {name}"
                for (name, body), (_, now) in zip(blocks_in(text), blocks_in(new))
                if body != now
            ]
            if not args.check:
                path.write_text(new)
    print("\n".join(stale) or "every block is current")
    sys.exit(1 if stale and args.check else 0)


if __name__ == "__main__":
    main()
