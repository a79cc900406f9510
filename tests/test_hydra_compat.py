"""Every private Hydra call the orchestrator makes (orchestrator/hydra_glue/hydra_compat.py), checked
against the installed hydra-core, which pyproject bounds to >=1.3.2,<1.4. A hydra-core
that moves or changes one of them fails here, by name."""

import os
import subprocess
import sys
from importlib.metadata import version

import pytest
from hydra.conf import HydraConf
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import setup_globals
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from orchestrator import config
from orchestrator.hydra_glue.hydra_compat import apply_value_changes, hydra_arguments, hydra_config_as, split_sweep


def test_the_installed_hydra_core_is_in_the_range_pyproject_allows():
    import hydra

    major, minor, patch = (int(x) for x in hydra.__version__.split(".")[:3])
    assert (1, 3, 2) <= (major, minor, patch) < (1, 4, 0)
    assert version("hydra-core").startswith("1.3.")


def test_hydra_arguments_reads_a_command_line_as_hydra_main_does():
    args = hydra_arguments(["-m", "--cfg", "job", "-cd", "/tmp/x", "zero=stage2", "parallel.dp=1,2"])
    assert args.multirun and args.cfg == "job" and args.config_dir == "/tmp/x"
    assert args.overrides == ["zero=stage2", "parallel.dp=1,2"]


def test_apply_value_changes_checks_types_against_the_schema():
    cfg = OmegaConf.structured(config.TrialConfig)
    parsed = OverridesParser.create().parse_overrides(["zero.stage=2", "run.lr=0.5", "run.extra=1"])
    with pytest.raises(
        ConfigCompositionException
    ):  # the schema is closed: run.extra is not a field (only +run.extra adds one)
        apply_value_changes(parsed, cfg)
    apply_value_changes(parsed[:2], cfg)
    assert cfg.zero.stage == 2 and cfg.run.lr == 0.5
    with pytest.raises(ConfigCompositionException):  # a string where the schema wants an int
        apply_value_changes(OverridesParser.create().parse_overrides(["zero.stage=two"]), cfg)


def test_split_sweep_gives_the_basic_sweepers_points_in_its_order():
    parsed = OverridesParser.create().parse_overrides(["a=1,2", "b=x,y", "c=3"])
    points = [p for batch in split_sweep(parsed) for p in batch]
    assert points == [["a=1", "b=x", "c=3"], ["a=1", "b=y", "c=3"], ["a=2", "b=x", "c=3"], ["a=2", "b=y", "c=3"]]


def test_hydra_config_as_sets_and_restores_hydras_state():
    setup_globals()  # Hydra's ${hydra:...} resolver, as every Hydra app has it
    before = HydraConfig.instance().cfg
    cfg = OmegaConf.create({"hydra": OmegaConf.structured(HydraConf)})
    cfg.hydra.job.name = "probe"
    with hydra_config_as(cfg):
        assert HydraConfig.get().job.name == "probe"
        assert OmegaConf.create({"d": "${hydra:job.name}"}).d == "probe"
    assert HydraConfig.instance().cfg is before


@pytest.mark.slow
def test_the_oldest_hydra_core_allowed_passes_these_tests_too(tmp_path):
    """hydra-core 1.3.2, the bottom of pyproject's range, installed beside the current one
    and put first on the path of a child pytest that runs this file's other tests."""
    target = tmp_path / "hydra-1.3.2"
    pip = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), "hydra-core==1.3.2"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if pip.returncode != 0:
        pytest.skip(f"hydra-core 1.3.2 could not be installed here: {pip.stderr.strip()[-300:]}")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), os.environ.get("PYTHONPATH", "")])}
    seen = subprocess.run(
        [sys.executable, "-c", "import hydra; print(hydra.__version__)"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert seen.stdout.strip() == "1.3.2", seen.stdout + seen.stderr
    child = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "-m", "not slow", __file__],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert child.returncode == 0, child.stdout[-3000:] + child.stderr[-2000:]
    assert "5 passed" in child.stdout
