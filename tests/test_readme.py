"""The README stays true: CI runs its test command, and its commands name real things."""

from pathlib import Path

from orchestrator.compose import presets

ROOT = Path(__file__).resolve().parent.parent


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    quick = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return [l for l in quick.splitlines() if l.startswith("python3 -m venv")]


def test_quick_start_is_two_commands_and_ci_runs_the_test_one():
    setup_and_run, setup_and_test = _readme_commands()
    assert setup_and_run.endswith("orchestrator run")
    assert setup_and_test in (ROOT / ".ci" / "run").read_text().splitlines()


def test_readme_sweeps_exist():
    text = (ROOT / "README.md").read_text()
    for name in presets("sweep"):
        assert (ROOT / "sweeps" / f"{name}.yaml").is_file()
    assert "+sweep=dp_bucket_local" in text and "dp_bucket_local" in presets("sweep")
