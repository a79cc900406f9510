"""Which packages the wheel holds; pyproject.toml holds everything else.

hydra_plugins/ ships as it is: Hydra discovers plugins in that namespace. Two folders of the repository ship under the orchestrator namespace without living in
orchestrator/: launchers/ (as orchestrator.launchers, so no generic top-level module lands
in site-packages) and the config tree conf/ (data, as orchestrator/conf). Every package
below them is found, never listed by hand, so a new sub-package cannot be left out of the
wheel; .ci/run installs the built wheel and runs a trial from it.
"""

from setuptools import find_namespace_packages, find_packages, setup

MAPPED = {"orchestrator.launchers": "launchers"}  # import name -> folder in the repository

packages = find_packages(include=["orchestrator", "orchestrator.*"])
# Hydra finds launcher plugins in the hydra_plugins namespace package (no __init__.py).
packages += find_namespace_packages(include=["hydra_plugins.*"])
package_dir = {"orchestrator.conf": "conf"}
for name, folder in MAPPED.items():
    subpackages = find_packages(folder)
    packages += [name, *(f"{name}.{sub}" for sub in subpackages)]
    package_dir.update({name: folder, **{f"{name}.{sub}": f"{folder}/{sub.replace('.', '/')}" for sub in subpackages}})

setup(packages=[*packages, "orchestrator.conf"], package_dir=package_dir,
      package_data={"orchestrator.conf": ["*.yaml", "*/*.yaml", "hardware/*.csv"]})
