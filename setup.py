"""Only what pyproject.toml cannot say: the top-level `sql/` ships inside the package as `runstate._sql`.

setuptools' automatic discovery (`packages.find`) cannot rename a folder, and an explicit list in
pyproject.toml would have to name every subpackage, so the list is found here and the one mapped
package appended. Everything else (metadata, dependencies, package data) is in pyproject.toml.
"""

from setuptools import find_packages, setup

setup(
    packages=[
        *find_packages(include=["runstate", "runstate.*", "runstate_tests", "runstate_tests.*"]),
        "runstate._sql",
    ],
    package_dir={"runstate._sql": "sql"},
)
