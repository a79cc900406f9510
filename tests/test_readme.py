"""The README stays true: CI runs its test command, and its commands and the documents
name real things."""

import re
from pathlib import Path

import pytest

from orchestrator.hydra_glue.conf_tree import presets
from orchestrator.records.trial_dir import SweepPaths, TrialPaths

ROOT = Path(__file__).resolve().parent.parent


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    quick = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return [x for x in quick.splitlines() if x.startswith("python3 -m venv")]


def test_quick_start_is_two_commands_and_ci_runs_the_test_one():
    setup_and_run, setup_and_test = _readme_commands()
    assert setup_and_run.endswith("orchestrator run")
    assert setup_and_test in (ROOT / ".ci" / "run").read_text().splitlines()


def test_readme_sweeps_exist():
    text = (ROOT / "README.md").read_text()
    for name in presets("sweep"):
        assert (ROOT / "sweeps" / f"{name}.yaml").is_file()
    assert "+sweep=dp_bucket_local" in text and "dp_bucket_local" in presets("sweep")


TOP = {"conf", "sweeps", "orchestrator", "hydra_plugins", "bench", "tests", "docs", ".ci"}


def _named_paths(text: str) -> set[str]:
    """Every repository path a document names in backticks: a word that starts with one of
    the repository's folders, or a file name with a source or document suffix; less
    placeholders (DATE, NAME, DIR, ...) and globs."""
    words = set()
    for span in re.findall(r"`([^`\n]+)`", text):
        for word in span.split():
            word = word.strip(",;:()'\"").rstrip(".")
            if not re.fullmatch(r"[\w./-]+", word) or re.search(r"[A-Z]{3,}", word):
                continue  # not a path, or a placeholder (multirun/DATE/TIME, hardware/NAME-calibrated.yaml)
            if word.split("/")[0] in TOP or ("/" not in word and re.fullmatch(r"\w[\w.-]*\.(py|md|yaml|sh|csv)", word)):
                words.add(word)
    return words


def _exists(path: str) -> bool:
    """A path from the repository root (or orchestrator/, as module paths are written), a
    bare file name found in the repository, or a file a trial or sweep writes (named by
    TrialPaths / SweepPaths)."""
    owned = {getattr(TrialPaths(Path("/t")), a).name for a, v in vars(TrialPaths).items() if isinstance(v, property)}
    owned |= {getattr(SweepPaths(Path("/s")), a).name for a, v in vars(SweepPaths).items() if isinstance(v, property)}
    if "/" not in path:
        return path in owned or any(".venv" not in p.parts for p in ROOT.rglob(path))
    return any((base / path.rstrip("/")).exists() for base in (ROOT, ROOT / "orchestrator"))


@pytest.mark.parametrize("doc", ["README.md", *sorted(p.name for p in (ROOT / "docs").glob("*.md"))])
def test_every_path_a_document_names_exists(doc):
    path = ROOT / doc if doc == "README.md" else ROOT / "docs" / doc
    named = _named_paths(path.read_text())
    assert named, "the check found no path to check"
    assert sorted(p for p in named if not _exists(p)) == []


def test_no_document_points_outside_the_repository():
    # a relative path that climbs out of the checkout names something a user's clone does not have
    docs = [
        ROOT / "README.md",
        *(ROOT / "docs").glob("*.md"),
        ROOT / "bench" / "RESULTS.md",
        *(ROOT / "bench" / "data").glob("*.md"),
    ]
    for doc in docs:
        assert not re.search(r"(^|[\s`(])\.\./", doc.read_text()), doc
