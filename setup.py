"""Which packages the wheel holds; pyproject.toml holds everything else.

hydra_plugins/ ships as it is: Hydra discovers plugins in that namespace. The config tree conf/
ships as data under the orchestrator namespace (orchestrator/conf) without living in
orchestrator/: it is Hydra's config directory, which users read and extend. Every package is
found, never listed by hand, so a new sub-package cannot be left out of the wheel; .ci/run installs
the built wheel and runs a trial from it.
"""

from setuptools import find_namespace_packages, find_packages, setup

packages = find_packages(include=["orchestrator", "orchestrator.*"])
# Hydra finds launcher plugins in the hydra_plugins namespace package (no __init__.py).
packages += find_namespace_packages(include=["hydra_plugins.*"])

setup(
    packages=[*packages, "orchestrator.conf"],
    package_dir={"orchestrator.conf": "conf"},
    package_data={"orchestrator.conf": ["*.yaml", "*/*.yaml", "hardware/*.csv"]},
)
