"""The install range: pip never moves an installed Airflow to a pre-release; installed betas satisfy it."""

from __future__ import annotations

import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10 (pytest's own dependency there)
    import tomli as tomllib
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent


def _airflow_requirement() -> Requirement:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    (requirement,) = (
        Requirement(line)
        for line in pyproject["project"]["dependencies"]
        if Requirement(line).name == "apache-airflow-core"
    )
    return requirement


def _supported_releases() -> list[str]:
    matrix = tomllib.loads((ROOT / "parity" / "expectations.toml").read_text(encoding="utf-8"))["matrix"]
    return [*matrix["versions"], *matrix.get("sweep", [])]


def test_airflow_range_names_no_pre_release() -> None:
    """
    A pre-release in any bound (``<=3.4.0rc99``) makes pip and uv consider pre-releases for the whole
    range: ``pip install`` then replaced an installed 3.1.8 or 3.3.2 with 3.4.0b2. The install check
    (``nox -s install_check``) cannot see that, because its environments already hold a release in range.
    """
    specifier = _airflow_requirement().specifier
    assert not [spec for spec in specifier if Version(spec.version).is_prerelease]
    assert not specifier.prereleases  # None or False: pip and uv leave pre-releases out


def test_airflow_range_accepts_every_supported_release_as_installed() -> None:
    """An installed beta of the matrix still satisfies the range, so installing next to it changes nothing."""
    specifier = _airflow_requirement().specifier
    assert [v for v in _supported_releases() if not specifier.contains(v, prereleases=True)] == []


def test_every_description_of_the_package_is_pyprojects() -> None:
    """``airflow-heartbeat-fix --help`` and ``airflow providers list`` say what its metadata says."""
    from airflow_heartbeat_fix import cli, provider_info, summary

    description = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"][
        "description"
    ]
    assert summary() == description
    assert cli._parser().description == description
    assert provider_info.get_provider_info()["description"] == description


#: The longest a module of the package or of its test support may grow before it is split by what it does.
MAX_MODULE_LINES = 450


def test_no_module_of_the_package_or_its_test_support_is_over_the_limit() -> None:
    long = {
        str(path.relative_to(ROOT)): lines
        for tree in ("airflow_heartbeat_fix", "testing")
        for path in sorted((ROOT / tree).rglob("*.py"))
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}
