"""
The parity decision: what each declared test must do in each cell (release x database x mode), what the
cell's junit XML says it did, and whether the two agree. Pure functions over parsed data; the files are
read and written in ``parity.__main__``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

from airflow_heartbeat_fix.detection import FixState
from parity.expectations import base_node

if TYPE_CHECKING:
    import xml.etree.ElementTree as ET
    from collections.abc import Mapping

    from parity.expectations import Expectations, TestExpectation


class Outcome(str, Enum):
    PASSED = "passed"
    XFAILED = "xfailed"  # the suite's strict xfail: the test failed on stock Airflow, as it must there
    SKIPPED = "skipped"
    FAILED = "failed"
    ERROR = "error"
    MISSING = "missing"  # not in the cell's junit XML (deselected, not collected, or no XML at all)
    NOT_APPLICABLE = "n/a"  # only ever expected: declared not applicable in that cell

    def __str__(self) -> str:  # as enum.StrEnum (3.11+) prints it
        return self.value


@dataclass(frozen=True)
class Result:
    outcome: Outcome
    detail: str = ""  # expected: the bugs caught or the n/a reason; actual: the junit message


@dataclass(frozen=True, order=True)
class Cell:
    version: str
    db: str
    mode: str

    @property
    def name(self) -> str:
        return f"{self.version}-{self.db}-{self.mode}"

    @property
    def release(self) -> str:
        """The Airflow release: ``3.1.8`` also for a cell of its dependency set ``3.1.8-sqlalchemy1.4``."""
        return self.version.split("-", 1)[0]

    @classmethod
    def from_name(cls, name: str) -> Cell | None:
        """
        ``3.4.0b2-sqlite-stock`` (or a dependency set's ``3.1.8-sqlalchemy1.4-postgres-stock``) -> Cell;
        None for a name that is not a matrix cell: ``lint``, or another session's cell such as
        ``kubernetes-3.3.2-sqlite-fixed``, which runs only part of the suite.
        """
        parts = name.rsplit("-", 2)
        return cls(*parts) if len(parts) == 3 and all(parts) and parts[0][:1].isdigit() else None


@dataclass(frozen=True)
class Verdict:
    kind: str  # pass, xfail, n/a, missing or FAIL: what the summary counts
    label: str  # what the report's cell shows
    ok: bool
    why: str = ""


def matrix_cells(expectations: Expectations) -> list[Cell]:
    """Every db x mode of ``[matrix].versions``, then the sweep: ``[matrix].sweep`` on the sweep's dbs."""
    return [Cell(*cell) for cell in expectations.cells()]


def expected_outcome(expectations: Expectations, node: str, cell: Cell) -> Result:
    """
    Fixed: every applicable test passes. Stock: strict xfail where the release has a bug it catches.
    A matrix cell has none of the package's extras but ``dev``, so a test that needs one is n/a there.
    """
    # A dependency set's cells run the whole suite, also of a sweep release (HEARTBEAT_FIX_SWEEP=full).
    reason = expectations.not_applicable(
        node, cell.release, cell.db, cell.mode, sweep=cell.version == cell.release
    )
    if reason is not None:
        return Result(Outcome.NOT_APPLICABLE, reason)
    if cell.mode == "stock":
        bugs = expectations.bugs_caught(node, cell.release)
        if bugs:
            return Result(Outcome.XFAILED, ", ".join(bug.name for bug in bugs))
    return Result(Outcome.PASSED)


def actual_outcome(testcase: ET.Element) -> Result:
    """What one junit ``<testcase>`` says happened (an xfail is ``<skipped type="pytest.xfail">``)."""
    for tag in ("error", "failure", "skipped"):
        child = testcase.find(tag)
        if child is None:
            continue
        message = " ".join(child.get("message", "").split())
        if tag == "skipped":
            xfailed = child.get("type") == "pytest.xfail"
            return Result(Outcome.XFAILED if xfailed else Outcome.SKIPPED, message)
        return Result(Outcome.ERROR if tag == "error" else Outcome.FAILED, message)
    return Result(Outcome.PASSED)


def judge(expected: Result, actual: Result) -> Verdict:
    if expected.outcome is Outcome.NOT_APPLICABLE and actual.outcome in (Outcome.SKIPPED, Outcome.MISSING):
        return Verdict("n/a", "n/a", True)
    if actual.outcome is Outcome.MISSING:
        return Verdict("missing", "missing", False, "not in the cell's junit XML")
    if actual.outcome is expected.outcome is Outcome.PASSED:
        return Verdict("pass", "pass", True)
    if actual.outcome is expected.outcome is Outcome.XFAILED:
        return Verdict("xfail", f"xfail: {expected.detail}", True)
    declared = {
        Outcome.PASSED: "pass",
        Outcome.XFAILED: f"fail on stock ({expected.detail})",
        Outcome.NOT_APPLICABLE: f"not applicable ({expected.detail})",
    }[expected.outcome]
    happened = f"{actual.outcome} ({actual.detail[:200]})" if actual.detail else str(actual.outcome)
    label = f"FAIL({actual.outcome} vs {expected.outcome})"
    return Verdict("FAIL", label, False, f"{happened}; declared: {declared}")


def node_id(classname: str, name: str) -> str:
    """junit ("tests.unit.test_x.TestY", "t[p]") -> pytest node id "tests/unit/test_x.py::TestY::t[p]"."""
    parts = classname.split(".") if classname else []
    classes: list[str] = []
    while parts and parts[-1][:1].isupper():
        classes.insert(0, parts.pop())
    module = "/".join(parts) + ".py" if parts else ""
    return "::".join(p for p in (module, *classes, name) if p)


_SEVERITY = [Outcome.ERROR, Outcome.FAILED, Outcome.SKIPPED, Outcome.XFAILED, Outcome.PASSED]


def parse_junit(root: ET.Element) -> dict[str, Result]:
    """Every test case of one junit document by node id; a node reported twice keeps its worst outcome."""
    results: dict[str, Result] = {}
    for case in root.iter("testcase"):
        node = node_id(case.get("classname", ""), case.get("name", ""))
        result = actual_outcome(case)
        if node not in results or _SEVERITY.index(result.outcome) < _SEVERITY.index(results[node].outcome):
            results[node] = result
    return results


@dataclass
class Row:
    node: str
    expectation: TestExpectation
    verdicts: dict[Cell, Verdict] = field(default_factory=dict)


@dataclass(frozen=True)
class Compatibility:
    """
    Whether one release needs one fix: declared in [bugs], proven (or contradicted) by the stock cells,
    and what ``airflow-heartbeat-fix status`` reported next to that release (``None``: not recorded).
    """

    needed: bool
    proofs: int  # stock cells of the release that behaved as declared for a test of this fix's bugs
    differs: bool
    status: str | None = None

    @property
    def expected_status(self) -> str:
        """What ``status`` must say: the fix applied where the release needs it, left out elsewhere."""
        return (FixState.ACTIVE if self.needed else FixState.NOT_NEEDED).value

    @property
    def status_differs(self) -> bool:
        return self.status is not None and self.status != self.expected_status

    @property
    def label(self) -> str:
        need = "needed" if self.needed else "not needed"
        if self.differs:
            label = f"FAIL(declared {need}; stock cells differ)"
        elif not self.proofs:
            label = f"{need} (unproven: no stock result)"
        else:
            label = f"{need} ({self.proofs} stock {'xfails' if self.needed else 'passes'})"
        if self.status is None:
            return label
        return f"{label}; status: {f'FAIL({self.status})' if self.status_differs else self.status}"


@dataclass
class Report:
    cells: list[Cell]
    rows: list[Row]
    undeclared: list[str]  # tests of mirrored modules that have no [[test]] entry
    unusable: dict[Cell, str]  # cells without results, and why
    compatibility: dict[str, dict[str, Compatibility]]  # release -> fix -> status
    #: release -> the CPython its environment ran on, as ``status -o json`` recorded it next to the cells
    pythons: dict[str, str] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        counts = dict.fromkeys(("pass", "xfail", "n/a", "missing", "FAIL"), 0)
        for row in self.rows:
            for verdict in row.verdicts.values():
                counts[verdict.kind] += 1
        return counts

    def differences(self) -> list[str]:
        """One line per test and reason (listing its cells); a cell without results is one line."""
        grouped: dict[tuple[str, str, str], list[str]] = {}
        for row in self.rows:
            for cell, verdict in row.verdicts.items():
                if not verdict.ok and cell not in self.unusable:
                    grouped.setdefault((row.node, verdict.kind, verdict.why), []).append(cell.name)
        lines = [
            f"{node} in {', '.join(cells)}: {kind}: {why}" for (node, kind, why), cells in grouped.items()
        ]
        lines += [f"{cell.name}: no results ({why})" for cell, why in self.unusable.items()]
        lines += [f"{node}: in a mirrored module but not declared" for node in self.undeclared]
        lines += [
            f"Airflow {version}: `status` reports {fix} {c.status!r}, declared "
            f"{'needed' if c.needed else 'not needed'}: it must be {c.expected_status!r}"
            for version, by_fix in self.compatibility.items()
            for fix, c in by_fix.items()
            if c.status_differs
        ]
        return lines

    @property
    def ok(self) -> bool:
        return not self.differences()


def build_report(
    expectations: Expectations,
    results: dict[Cell, dict[str, Result]],
    unusable: dict[Cell, str],
    statuses: Mapping[str, Mapping[str, str]] | None = None,
    pythons: Mapping[str, str] | None = None,
) -> Report:
    """
    Judge every declared test in every matrix cell, and in any other release's cell that has results.

    ``statuses``: per release, each fix's state as ``airflow-heartbeat-fix status`` reported it;
    ``pythons``: per release, the Python it reported.
    """
    matrix = matrix_cells(expectations)
    extra = {cell for cell in results if cell.db in expectations.dbs and cell.mode in expectations.modes}
    cells = matrix + sorted(extra - set(matrix))
    results = {cell: cell_results for cell, cell_results in results.items() if cell in cells}
    seen = list(dict.fromkeys(node for cell_results in results.values() for node in cell_results))
    undeclared = [
        node
        for node in seen
        if node.split("::", 1)[0] in expectations.mirrored_modules and expectations.for_node(node) is None
    ]
    # A parametrized test declared once (without parameters) gets a row per parametrization that ran.
    nodes = [node for node in seen if expectations.for_node(node) is not None]
    ran = {base_node(node) for node in nodes}
    nodes += [n for n in expectations.tests if n not in nodes and ("[" in n or n not in ran)]
    order = {base: i for i, base in enumerate(dict.fromkeys(map(base_node, expectations.tests)))}
    nodes.sort(key=lambda node: order.get(base_node(node), len(order)))  # stable: run order within a test

    rows = []
    for node in nodes:
        expectation = expectations.for_node(node)
        assert expectation is not None
        row = Row(node, expectation)
        for cell in cells:
            actual = results.get(cell, {}).get(node, Result(Outcome.MISSING))
            row.verdicts[cell] = judge(expected_outcome(expectations, node, cell), actual)
        rows.append(row)
    unusable = {cell: why for cell, why in unusable.items() if cell in cells}
    unusable |= {
        cell: "no junit XML for it" for cell in matrix if cell not in results and cell not in unusable
    }
    by_fix = compatibility(expectations, rows, cells, statuses or {})
    return Report(cells, rows, undeclared, unusable, by_fix, dict(pythons or {}))


def compatibility(
    expectations: Expectations,
    rows: list[Row],
    cells: list[Cell],
    statuses: Mapping[str, Mapping[str, str]],
) -> dict[str, dict[str, Compatibility]]:
    """
    Per release and fix: needed where [bugs] says so; the stock cells of the fix's tests prove it, the
    release's dependency sets' cells included.
    """
    table: dict[str, dict[str, Compatibility]] = {}
    for version in dict.fromkeys(cell.release for cell in cells):
        stock = [cell for cell in cells if cell.release == version and cell.mode == "stock"]
        table[version] = {}
        for fix in dict.fromkeys(bug.fix for bug in expectations.bugs.values()):
            fix_bugs = {bug.name for bug in expectations.bugs.values() if bug.fix == fix}
            needed = any(version in expectations.bugs[name].versions for name in fix_bugs)
            proofs, differs = 0, False
            for row in rows:
                if not fix_bugs & set(row.expectation.catches):
                    continue
                caught = {bug.name for bug in expectations.bugs_caught(row.node, version)}
                for cell in stock:
                    verdict = row.verdicts[cell]
                    differs |= verdict.kind == "FAIL"
                    if needed:  # proven by a stock failure that this fix's bug explains
                        proofs += verdict.kind == "xfail" and bool(caught & fix_bugs)
                    else:
                        proofs += verdict.kind == "pass"
            status = statuses.get(version, {}).get(fix)
            table[version][fix] = Compatibility(needed, proofs, differs, status)
    return table
