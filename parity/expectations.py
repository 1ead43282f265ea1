"""
Load ``parity/expectations.toml``: which Airflow release carries which bug, and which test catches it.

The file is the one place these facts are written; the test suite derives its stock-mode strict
xfails from it and the parity report checks every cell against it. Standard library only, so the
report can read it without Airflow installed.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10 (pytest's own dependency there)
    import tomli as tomllib

from airflow_heartbeat_fix.detection import FIXES

DEFAULT_PATH = Path(__file__).with_name("expectations.toml")
#: The databases ``[matrix].sweep`` releases run on (fixed + stock); the full matrix has ``[matrix].dbs``.
SWEEP_DBS = ("sqlite",)
#: What a sweep cell runs: the declared tests that catch a bug, so that each release shows its stock
#: bugs and their fixes in seconds; the newest patch of its line runs everything.
SWEEP_RULE = "a sweep release runs only the declared tests that catch a bug"

#: Keys a ``not_applicable`` entry may narrow by; an absent key means "every value".
_NOT_APPLICABLE_KEYS = ("versions", "dbs", "modes")
_TEST_KEYS = frozenset({"node", "upstream", "upstream_note", "source", "catches", "not_applicable"})


class ExpectationsError(ValueError):
    """``expectations.toml`` contradicts itself or the schema."""


@dataclass(frozen=True)
class Bug:
    name: str
    fix: str
    title: str
    versions: tuple[str, ...]


@dataclass(frozen=True)
class Source:
    name: str
    title: str
    ref: str


@dataclass(frozen=True)
class NotApplicable:
    versions: tuple[str, ...] | None
    dbs: tuple[str, ...] | None
    modes: tuple[str, ...] | None
    reason: str
    #: the package extra the test needs (``kubernetes``): it does not run where that extra is not
    #: installed, which is every matrix cell (their environments have the ``dev`` extra only)
    without_extra: str | None = None

    def covers(self, version: str, db: str, mode: str, extras: frozenset[str] = frozenset()) -> bool:
        if self.without_extra is not None and self.without_extra in extras:
            return False
        return all(
            allowed is None or value in allowed
            for allowed, value in ((self.versions, version), (self.dbs, db), (self.modes, mode))
        )


@dataclass(frozen=True)
class TestExpectation:
    __test__ = False  # not a pytest test class, whatever its name

    node: str
    upstream: str
    upstream_note: str
    source: str
    catches: tuple[str, ...]
    not_applicable: tuple[NotApplicable, ...]


@dataclass(frozen=True)
class Expectations:
    mirrored_modules: tuple[str, ...]
    versions: tuple[str, ...]
    dbs: tuple[str, ...]
    modes: tuple[str, ...]
    bugs: dict[str, Bug]
    sources: dict[str, Source]
    tests: dict[str, TestExpectation]
    #: Releases swept on SQLite only (fixed + stock); ``versions`` get every db x mode.
    sweep: tuple[str, ...] = ()
    #: The CPython minor each release's environment is built on, where it is not ``default_python``.
    pythons: dict[str, str] = field(default_factory=dict)
    default_python: str = "3.11"

    def python_of(self, version: str) -> str:
        """
        The CPython (``3.12``) that ``version``'s cells run on: a release's, or a dependency set's
        (``3.0.6-python3.10``), which is its release's unless named.
        """
        release = version.split("-", 1)[0]
        return self.pythons.get(version) or self.pythons.get(release, self.default_python)

    @property
    def all_versions(self) -> tuple[str, ...]:
        """Every release the suite is run on: the full matrix's, then the sweep's."""
        return self.versions + self.sweep

    @property
    def newest_stable(self) -> str:
        """The newest matrix release that is not a pre-release (no letter: ``3.3.2``, not ``3.4.0b2``)."""
        return next(v for v in reversed(self.versions) if v.replace(".", "").isdigit())

    def cells(self) -> list[tuple[str, str, str]]:
        """Every (release, db, mode) the suite runs in: ``versions`` on every db, the sweep on SWEEP_DBS."""
        full = [(v, d, m) for v in self.versions for d in self.dbs for m in self.modes]
        return full + [(v, d, m) for v in self.sweep for d in SWEEP_DBS for m in self.modes]

    def swept_nodes(self) -> list[str]:
        """The declared tests a sweep release runs (:data:`SWEEP_RULE`)."""
        return [node for node, entry in self.tests.items() if _swept(entry)]

    def for_node(self, nodeid: str) -> TestExpectation | None:
        """The entry for ``nodeid``: its parametrized entry, if any, already merged over its base entry."""
        if nodeid in self.tests:
            return self.tests[nodeid]
        return self.tests.get(base_node(nodeid))

    def bugs_caught(self, nodeid: str, version: str) -> tuple[Bug, ...]:
        """The bugs ``nodeid`` catches that stock Airflow ``version`` has: non-empty means "fails stock"."""
        entry = self.for_node(nodeid)
        if entry is None:
            return ()
        return tuple(self.bugs[name] for name in entry.catches if version in self.bugs[name].versions)

    def not_applicable(
        self,
        nodeid: str,
        version: str,
        db: str,
        mode: str,
        extras: frozenset[str] = frozenset(),
        *,
        sweep: bool = True,
    ) -> str | None:
        """
        Why ``nodeid`` does not run in that cell (with the package's ``extras`` installed), or ``None``.
        ``sweep=False``: the cell runs the whole suite although ``version`` is a sweep release (a
        dependency set's cells, ``nox -s sweep_full``).
        """
        entry = self.for_node(nodeid)
        if entry is None:
            return None
        if sweep and version in self.sweep and not _swept(entry):
            return SWEEP_RULE
        return next((na.reason for na in entry.not_applicable if na.covers(version, db, mode, extras)), None)


def _swept(entry: TestExpectation | None) -> bool:
    """:data:`SWEEP_RULE`: whether a sweep release runs the test ``entry`` declares."""
    return entry is not None and bool(entry.catches)


def disagreements_with_detection(
    expectations: Expectations, version: str, not_needed: set[str] | frozenset[str]
) -> list[str]:
    """Where the file and feature detection disagree about Airflow ``version``; empty if nowhere.

    ``not_needed``: the fixes detection reports as "not needed" on that Airflow. A release listed under
    a bug must need that bug's fix; a release listed under no bug of a fix must not.
    """
    if version not in expectations.all_versions:
        return [
            f"Airflow {version} is in neither [matrix].versions {list(expectations.versions)} "
            f"nor [matrix].sweep {list(expectations.sweep)}"
        ]
    problems = []
    for fix in sorted({bug.fix for bug in expectations.bugs.values()}):
        present = [b.name for b in expectations.bugs.values() if b.fix == fix and version in b.versions]
        if present and fix in not_needed:
            problems.append(
                f"it lists {present} on Airflow {version}, but detection says {fix} is not needed"
            )
        if not present and fix not in not_needed:
            problems.append(f"it lists no bug of {fix} on Airflow {version}, but detection says it is needed")
    return problems


def base_node(nodeid: str) -> str:
    """``nodeid`` without its parameter id: ``a.py::T::test[x-y]`` -> ``a.py::T::test``."""
    return nodeid.split("[", 1)[0]


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ExpectationsError(f"{where}: expected a list of strings, got {value!r}")
    return tuple(value)


def _not_applicable(raw: Any, where: str, matrix: dict[str, tuple[str, ...]]) -> NotApplicable:
    if not isinstance(raw, dict) or not isinstance(raw.get("reason"), str) or not raw["reason"]:
        raise ExpectationsError(f"{where}: not_applicable entries need a non-empty reason")
    unknown_keys = set(raw) - {*_NOT_APPLICABLE_KEYS, "reason", "without_extra"}
    if unknown_keys:
        raise ExpectationsError(f"{where}: unknown not_applicable keys {sorted(unknown_keys)}")
    narrowed: dict[str, tuple[str, ...] | None] = {}
    for key in _NOT_APPLICABLE_KEYS:
        values = _strings(raw[key], f"{where}.{key}") if key in raw else None
        known = matrix[key] + matrix["sweep"] if key == "versions" else matrix[key]
        if values is not None and (unknown := set(values) - set(known)):
            raise ExpectationsError(f"{where}.{key}: {sorted(unknown)} not in [matrix].{key}")
        narrowed[key] = values
    extra = raw.get("without_extra")
    if extra is not None and (not isinstance(extra, str) or not extra):
        raise ExpectationsError(f"{where}.without_extra: expected the name of an extra, got {extra!r}")
    return NotApplicable(reason=raw["reason"], without_extra=extra, **narrowed)


def _bug(name: str, raw: Any, versions: tuple[str, ...]) -> Bug:
    where = f"[bugs.{name}]"
    if not isinstance(raw, dict) or not all(isinstance(raw.get(key), str) for key in ("fix", "title")):
        raise ExpectationsError(f"{where}: needs string fields fix and title")
    if raw["fix"] not in FIXES:
        raise ExpectationsError(f"{where}.fix: {raw['fix']!r} is not one of the package's fixes {FIXES}")
    bug_versions = _strings(raw.get("versions"), f"{where}.versions")
    if unknown := set(bug_versions) - set(versions):
        raise ExpectationsError(f"{where}.versions: {sorted(unknown)} not in [matrix].versions or .sweep")
    return Bug(name=name, fix=raw["fix"], title=raw["title"], versions=bug_versions)


def _tests(
    raw_tests: Any, bugs: dict[str, Bug], sources: dict[str, Source], matrix: dict[str, tuple[str, ...]]
) -> dict[str, TestExpectation]:
    """Every ``[[test]]``; a parametrized entry inherits the fields it does not set from its base entry."""
    if not isinstance(raw_tests, list):
        raise ExpectationsError("[[test]] must be an array of tables")
    raw_by_node: dict[str, dict[str, Any]] = {}
    for raw in raw_tests:
        node = raw.get("node") if isinstance(raw, dict) else None
        if not isinstance(node, str) or "::" not in node:
            raise ExpectationsError(f"[[test]] without a valid node id: {raw!r}")
        if node in raw_by_node:
            raise ExpectationsError(f"{node}: declared twice")
        raw_by_node[node] = raw

    tests: dict[str, TestExpectation] = {}
    for node, raw in raw_by_node.items():
        base = base_node(node)
        if base != node and base not in raw_by_node:
            raise ExpectationsError(f"{node}: a parametrized entry needs an entry for {base}")
        merged = {**raw_by_node[base], **raw} if base != node else raw
        if unknown_keys := set(merged) - _TEST_KEYS:
            raise ExpectationsError(f"{node}: unknown keys {sorted(unknown_keys)}")
        upstream, note = merged.get("upstream"), merged.get("upstream_note", "")
        if not isinstance(upstream, str) or not isinstance(note, str):
            raise ExpectationsError(f'{node}: upstream ("" if none) and upstream_note must be strings')
        if not upstream and not note:
            raise ExpectationsError(f"{node}: upstream is empty, so upstream_note must say why")
        if merged.get("source") not in sources:
            raise ExpectationsError(f"{node}: unknown source {merged.get('source')!r}")
        catches = _strings(merged.get("catches"), f"{node}.catches")
        if unknown := [name for name in catches if name not in bugs]:
            raise ExpectationsError(f"{node}: catches unknown bugs {unknown}")
        raw_na = merged.get("not_applicable", [])
        if not isinstance(raw_na, list):
            raise ExpectationsError(f"{node}.not_applicable: expected a list")
        tests[node] = TestExpectation(
            node=node,
            upstream=upstream,
            upstream_note=note,
            source=merged["source"],
            catches=catches,
            not_applicable=tuple(_not_applicable(na, f"{node}.not_applicable", matrix) for na in raw_na),
        )
    return tests


def parse(data: dict[str, Any]) -> Expectations:
    """Validate the parsed TOML and build :class:`Expectations` from it."""
    raw_matrix = data.get("matrix")
    if not isinstance(raw_matrix, dict):
        raise ExpectationsError("[matrix] is missing")
    matrix = {key: _strings(raw_matrix.get(key), f"[matrix].{key}") for key in _NOT_APPLICABLE_KEYS}
    matrix["sweep"] = _strings(raw_matrix.get("sweep", []), "[matrix].sweep")
    if twice := set(matrix["versions"]) & set(matrix["sweep"]):
        raise ExpectationsError(f"[matrix]: {sorted(twice)} in both versions and sweep")
    pythons = raw_matrix.get("python", {})
    default_python = raw_matrix.get("python_default", "3.11")
    named = [*pythons.values(), default_python] if isinstance(pythons, dict) else []
    if not isinstance(pythons, dict) or not all(isinstance(v, str) for v in named):
        raise ExpectationsError("[matrix].python maps releases to CPython versions; python_default is one")
    if unknown := {
        name for name in pythons if name.split("-", 1)[0] not in matrix["versions"] + matrix["sweep"]
    }:
        raise ExpectationsError(f"[matrix].python names releases not in the matrix: {sorted(unknown)}")
    raw_bugs, raw_sources = data.get("bugs", {}), data.get("sources", {})
    if not isinstance(raw_bugs, dict) or not isinstance(raw_sources, dict):
        raise ExpectationsError("[bugs] and [sources] must be tables")
    bugs = {name: _bug(name, raw, matrix["versions"] + matrix["sweep"]) for name, raw in raw_bugs.items()}
    sources: dict[str, Source] = {}
    for name, raw in raw_sources.items():
        if not isinstance(raw, dict) or not all(isinstance(raw.get(key), str) for key in ("title", "ref")):
            raise ExpectationsError(f"[sources.{name}]: needs string fields title and ref")
        sources[name] = Source(name=name, title=raw["title"], ref=raw["ref"])
    return Expectations(
        mirrored_modules=_strings(data.get("mirrored_modules", []), "mirrored_modules"),
        versions=matrix["versions"],
        dbs=matrix["dbs"],
        modes=matrix["modes"],
        bugs=bugs,
        sources=sources,
        tests=_tests(data.get("test", []), bugs, sources, matrix),
        sweep=matrix["sweep"],
        pythons=dict(pythons),
        default_python=default_python,
    )


def load(path: Path = DEFAULT_PATH) -> Expectations:
    """Read and validate ``path``; raises :class:`ExpectationsError` on any inconsistency."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as error:
        raise ExpectationsError(f"{path}: {error}") from error
    return parse(data)


__all__ = [
    "DEFAULT_PATH",
    "SWEEP_DBS",
    "SWEEP_RULE",
    "Bug",
    "Expectations",
    "ExpectationsError",
    "NotApplicable",
    "Source",
    "TestExpectation",
    "base_node",
    "disagreements_with_detection",
    "load",
    "parse",
]
