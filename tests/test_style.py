"""The code as the field's best projects keep theirs: formatted and linted by ruff, typed by mypy.

Their settings are pyproject.toml's ([tool.ruff], [tool.mypy]); each check runs the tool as a
developer would (`ruff format --check`, `ruff check`, `mypy`), and what it prints is the
failure's message. Each test also shows the check can fail, on a file written to fail it.
"""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _tool(*argv: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *argv], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_the_repository_is_formatted_by_ruff():
    done = _tool("ruff", "format", "--check", ".")
    assert done.returncode == 0, done.stdout + done.stderr + "\nrun: .venv/bin/ruff format ."


def test_the_repository_passes_ruffs_lint_imports_sorted():
    done = _tool("ruff", "check", ".")
    assert done.returncode == 0, done.stdout + done.stderr + "\nrun: .venv/bin/ruff check --fix ."


def test_the_package_type_checks_with_mypy(tmp_path):
    done = _tool("mypy", "--cache-dir", str(tmp_path / "cache"))
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_checks_fail_on_code_that_breaks_them(tmp_path):
    """The settings are read (line length, the rules, the types), not a check that passes anything."""
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text().replace('"orchestrator", ', ""))
    bad = tmp_path / "hydra_plugins" / "bad.py"
    bad.parent.mkdir()
    bad.write_text("import sys, os\n\nPAIR = [1,2]\n\n\ndef f(x: int) -> str:\n    return x  # " + "a" * 120 + "\n")
    assert _tool("ruff", "format", "--check", ".", cwd=tmp_path).returncode == 1
    lint = _tool("ruff", "check", ".", cwd=tmp_path).stdout
    assert all(rule in lint for rule in ("E401", "F401", "E501")), lint
    types = _tool("mypy", "--cache-dir", str(tmp_path / "cache"), cwd=tmp_path)
    assert types.returncode == 1 and 'Incompatible return value type (got "int", expected "str")' in types.stdout
