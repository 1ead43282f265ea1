"""
Which Airflow releases this package supports: one fact, its own ``apache-airflow-core`` requirement.

The range is read from the installed distribution's metadata, so pip's resolver and the run-time check
can never disagree, and nothing here imports Airflow: an Airflow outside the range (Airflow 2 has no
``apache-airflow-core`` at all) is recognised before any of its internals are touched.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata

DISTRIBUTION = "airflow-heartbeat-fix"
AIRFLOW_CORE = "apache-airflow-core"
#: Airflow 2 ships as one distribution; Airflow 3's ``apache-airflow`` is a meta-package over the core.
AIRFLOW_2 = "apache-airflow"


@dataclass(frozen=True)
class Support:
    """The installed Airflow and the range this package's metadata requires; ``None``: not known."""

    airflow_version: str | None
    supported: str | None

    @property
    def in_range(self) -> bool:
        """Pre-releases count (an installed 3.4.0b2 satisfies ``<3.5``); unknown is not a refusal."""
        from packaging.specifiers import SpecifierSet
        from packaging.version import InvalidVersion, Version

        if self.airflow_version is None or self.supported is None:
            return True
        try:
            return SpecifierSet(self.supported).contains(Version(self.airflow_version), prereleases=True)
        except InvalidVersion:
            return False

    @property
    def refusal(self) -> str | None:
        """The one line every entry point prints for an Airflow outside the range, or ``None``."""
        if self.in_range:
            return None
        return (
            f"Airflow {self.airflow_version} is outside the range this package supports "
            f"({AIRFLOW_CORE}{self.supported}): nothing patched"
        )


def supported_range() -> str | None:
    """The ``apache-airflow-core`` specifier of the installed package, lower bound first."""
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        requirements = metadata.requires(DISTRIBUTION) or []
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return None
    for line in requirements:
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue
        if requirement.name == AIRFLOW_CORE and requirement.marker is None:
            specifiers = sorted(str(s) for s in requirement.specifier)
            return ",".join(sorted(specifiers, key=lambda s: not s.startswith(">")))
    return None


def installed_airflow_version() -> str | None:
    """From metadata, not from ``import airflow``: Airflow 3's core, else Airflow 2's one distribution."""
    for name in (AIRFLOW_CORE, AIRFLOW_2):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def check() -> Support:
    return Support(installed_airflow_version(), supported_range())
