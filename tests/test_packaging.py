"""The wheel holds the whole package: every sub-package, the launchers, the config tree.

An editable install hides a package left out of the wheel (the source tree is on the
path); this builds the real wheel and compares it with the source tree. .ci/run also
installs that wheel in a fresh virtualenv and runs a trial from it.
"""

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_wheel_holds_every_package_and_config_of_the_source_tree(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("orchestrator-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    shipped = {str(Path(n).parent) for n in names if n.endswith("/__init__.py")}
    expected = {str(p.parent.relative_to(ROOT)) for p in (ROOT / "orchestrator").rglob("__init__.py")}
    expected |= {str(p.parent.relative_to(ROOT)) for p in (ROOT / "hydra_plugins").rglob("__init__.py")}
    assert shipped == expected
    modules = {n for n in names if n.endswith(".py")}
    assert {
        "orchestrator/launchers/slurm.py",
        "orchestrator/launchers/slurm_task.py",
        "hydra_plugins/orchestrator_launcher/orchestrator_launcher.py",
    } <= modules
    assert "hydra_plugins/__init__.py" not in modules  # a namespace that other plugins share
    dist_info = wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1] + ".dist-info"
    assert {n.split("/")[0] for n in names} == {"orchestrator", "hydra_plugins", dist_info}  # no generic module
    conf = ROOT / "conf"  # conf/sweep links sweeps/: glob follows it
    configs = {
        str(p.relative_to(conf)) for p in [*conf.glob("*.yaml"), *conf.glob("*/*.yaml"), *conf.glob("hardware/*.csv")]
    }  # presets' network tables
    assert any(c.startswith("sweep/") for c in configs)
    assert (
        configs
        and {n.removeprefix("orchestrator/conf/") for n in names if n.startswith("orchestrator/conf/")} == configs
    )
