"""The parity report (``python -m parity``) on small junit fixtures: no Airflow, no database."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from typing import TYPE_CHECKING

import pytest

from parity.__main__ import main
from parity.check import Cell, Outcome, actual_outcome, expected_outcome, node_id
from parity.expectations import load

if TYPE_CHECKING:
    from pathlib import Path

V1, V2 = "3.3.2", "3.4.0b2"
CELLS = [Cell(v, d, m) for v in (V1, V2) for d in ("sqlite", "postgres") for m in ("fixed", "stock")]

EXPECTATIONS = f"""
mirrored_modules = ["tests/test_mod.py"]

[matrix]
versions = ["{V1}", "{V2}"]
dbs = ["sqlite", "postgres"]
modes = ["fixed", "stock"]

[bugs.unconverged_purge]
fix = "converged_heartbeat_purge"
title = "purge leaves the task instance RUNNING"
versions = ["{V1}"]

[bugs.sink_closes_session]
fix = "session_preserving_sink"
title = "the sink closes the scheduler's session"
versions = ["{V1}", "{V2}"]

[sources.pr-1]
title = "an upstream pull request"
ref = "apache/airflow#1"

[[test]]
node = "tests/test_mod.py::TestScheduler::test_purge"
upstream = "airflow-core/tests/unit/jobs/test_scheduler_job.py::TestSchedulerJob::test_purge"
source = "pr-1"
catches = ["unconverged_purge"]

[[test]]
node = "tests/test_mod.py::TestScheduler::test_param"
upstream = ""
upstream_note = "ours only"
source = "pr-1"
catches = ["unconverged_purge"]

[[test]]
node = "tests/test_mod.py::TestScheduler::test_param[retry]"
catches = ["unconverged_purge", "sink_closes_session"]

[[test]]
node = "tests/test_mod.py::TestScheduler::test_locks"
upstream = ""
upstream_note = "ours only"
source = "pr-1"
catches = ["sink_closes_session"]
not_applicable = [{{ dbs = ["sqlite"], reason = "row locks need PostgreSQL" }}]

[[test]]
node = "tests/test_mod.py::TestScheduler::test_plain"
upstream = "airflow-core/tests/unit/jobs/test_scheduler_job.py::TestSchedulerJob::test_plain"
source = "pr-1"
catches = []
"""

XFAIL = '<skipped type="pytest.xfail" message="stock Airflow has the bug" />'


def as_declared(cell: Cell) -> dict[str, str]:
    """What each test of the fixture does in a cell when all is as declared, written out by hand."""
    stock = cell.mode == "stock"
    cases = {
        "test_purge": XFAIL if stock and cell.version == V1 else "",
        "test_param[plain]": XFAIL if stock and cell.version == V1 else "",
        "test_param[retry]": XFAIL if stock else "",
        "test_plain": "",
    }
    if cell.db == "postgres":  # deselected on SQLite: absent from its junit XML
        cases["test_locks"] = XFAIL if stock else ""
    return cases


def write_cell(
    results: Path, cell: Cell, cases: dict[str, str], classname: str = "tests.test_mod.TestScheduler"
) -> None:
    body = "".join(
        f'<testcase classname="{classname}" name="{name}">{child}</testcase>' for name, child in cases.items()
    )
    suite = (
        f'<testsuites><testsuite name="pytest" timestamp="2026-12-01T10:00">{body}</testsuite></testsuites>'
    )
    results.mkdir(parents=True, exist_ok=True)
    (results / f"{cell.name}.xml").write_text(suite, encoding="utf-8")


def read_tables(path: Path) -> str:
    """A Markdown file with its tables' column padding squeezed to one space, so rows compare as text."""
    return "".join(re.sub(r" *\| *", " | ", line).strip() + "\n" for line in path.read_text().splitlines())


@pytest.fixture
def toml(tmp_path: Path) -> Path:
    path = tmp_path / "expectations.toml"
    path.write_text(EXPECTATIONS, encoding="utf-8")
    return path


@pytest.fixture
def results(tmp_path: Path) -> Path:
    results = tmp_path / "results"
    for cell in CELLS:
        write_cell(results, cell, as_declared(cell))
    return results


def run(toml: Path, results: Path, *extra: str) -> int:
    out = toml.parent / "REPORT.md"
    return main(
        ["--results", str(results), "--expectations", str(toml), "--out", str(out), "--tested", "abc", *extra]
    )


def test_all_cells_as_declared(toml: Path, results: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(toml, results, "--json", str(toml.parent / "report.json")) == 0
    counts = "26 pass, 10 xfail, 4 n/a, 0 missing, 0 FAIL"
    assert f"5 declared tests x 8 cells: {counts}" in capsys.readouterr().out
    report = read_tables(toml.parent / "REPORT.md")
    assert "**Result: every cell as declared**" in report
    assert "| xfail: unconverged_purge, sink_closes_session |" in report
    # test_param[retry] on stock 3.4 fails for the sink bug: no proof either way for the purge fix there
    assert f"| {V1} | - | needed (6 stock xfails) | needed (3 stock xfails) |" in report
    assert f"| {V2} | - | not needed (4 stock passes) | needed (3 stock xfails) |" in report
    data = json.loads((toml.parent / "report.json").read_text())
    assert data["ok"] and data["summary"]["FAIL"] == 0
    assert data["compatibility"][V2]["converged_heartbeat_purge"]["needed"] is False


def test_readme_compatibility_block_is_rewritten(toml: Path, results: Path) -> None:
    readme = toml.parent / "README.md"
    readme.write_text("intro\n<!-- compatibility:start -->\nstale\n<!-- compatibility:end -->\nrest\n")
    assert run(toml, results, "--compatibility", str(readme)) == 0
    text = read_tables(readme)
    assert text.startswith(
        "intro\n<!-- compatibility:start -->\n_Generated by `python -m parity --compatibility PAGE`"
    )
    assert "stale" not in text
    assert f"| {V2} | - | not needed (4 stock passes) | needed (3 stock xfails) |" in text
    assert text.endswith("<!-- compatibility:end -->\nrest\n")
    readme.write_text("no block here\n")
    assert run(toml, results, "--compatibility", str(readme)) == 2


def write_status(results: Path, version: str, states: dict[str, str], python: str = "3.12.1") -> None:
    """What ``airflow-heartbeat-fix status -o json`` writes (only the parts parity reads)."""
    fixes = [{"fix": fix, "state": state} for fix, state in states.items()]
    document = {"fixes": fixes, "python_version": python}
    (results / f"status-{version}.json").write_text(json.dumps(document), encoding="utf-8")


def test_status_recorded_next_to_each_release_is_checked(
    toml: Path, results: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`status` must report a needed fix active and a fix the release does not need "not needed"."""
    purge, sink = "converged_heartbeat_purge", "session_preserving_sink"
    write_status(results, V1, {purge: "active", sink: "active"})
    write_status(results, V2, {purge: "not needed (present upstream)", sink: "active"})
    assert run(toml, results) == 0
    report = read_tables(toml.parent / "REPORT.md")
    active = "needed (6 stock xfails); status: active | needed (3 stock xfails); status: active"
    assert f"| {V1} | 3.12.1 | {active} |" in report
    assert f"| {V2} | 3.12.1 | not needed (4 stock passes); status: not needed (present upstream) |" in report

    write_status(results, V2, {purge: "active", sink: "unsupported"})
    assert run(toml, results) == 1
    err = capsys.readouterr().err
    assert f"Airflow {V2}: `status` reports {purge} 'active', declared not needed" in err
    assert f"Airflow {V2}: `status` reports {sink} 'unsupported', declared needed: it must be 'active'" in err
    assert "status: FAIL(unsupported)" in read_tables(toml.parent / "REPORT.md")

    (results / f"status-{V1}.json").write_text("not json", encoding="utf-8")
    assert run(toml, results) == 1
    unreadable = f"`status` reports {sink} 'unreadable status-{V1}.json: JSONDecodeError'"
    assert unreadable in capsys.readouterr().err


def test_results_in_subfolders(toml: Path, results: Path) -> None:
    for xml in list(results.glob("*.xml")):
        (results / xml.stem).mkdir()
        xml.rename(results / xml.stem / xml.name)
    assert run(toml, results) == 0


def test_another_release_gets_its_own_column(toml: Path, results: Path) -> None:
    """A sweep cell of a release outside [matrix] is judged by [bugs] like the others; other files ignored."""
    cell = Cell("3.3.0", "sqlite", "stock")  # the fixture declares no bug in 3.3.0: stock passes
    write_cell(results, cell, as_declared(Cell(V2, "sqlite", "fixed")))
    write_cell(results, Cell("e2e", "3.4.0b2", "sqlite"), {"test_purge": '<failure message="x" />'})
    partial_run = {"test_purge": '<failure message="x" />'}  # another session's cell: not a matrix cell
    write_cell(results, Cell(f"kubernetes-{V2}", "sqlite", "fixed"), partial_run)
    (results / "lint.xml").write_text("not xml", encoding="utf-8")
    assert run(toml, results) == 0
    report = read_tables(toml.parent / "REPORT.md")
    assert "| 3.3.0<br>sqlite<br>stock |" in report
    assert "| 3.3.0 | - | not needed (3 stock passes) | not needed (1 stock passes) |" in report


def test_dependency_set_cell_is_judged_as_its_release(toml: Path, results: Path) -> None:
    """``3.3.2-sqlalchemy1.4-postgres-stock`` has 3.3.2's bugs, and its proofs count in 3.3.2's row."""
    deps = Cell(f"{V1}-sqlalchemy1.4", "postgres", "stock")
    write_cell(results, deps, as_declared(Cell(V1, "postgres", "stock")))
    assert run(toml, results) == 0
    report = read_tables(toml.parent / "REPORT.md")
    assert f"| {V1}-sqlalchemy1.4<br>postgres<br>stock |" in report
    assert f"| {V1} | - | needed (9 stock xfails) | needed (5 stock xfails) |" in report
    assert f"| {V1}-sqlalchemy1.4 |" not in report


def test_sweep_release_is_expected_on_sqlite_only(
    toml: Path, results: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A [matrix].sweep release must have its SQLite cells, fixed and stock, with the tests that catch a
    bug and no others."""
    sweep = toml.read_text().replace(
        'modes = ["fixed", "stock"]\n', 'modes = ["fixed", "stock"]\nsweep = ["3.3.0"]\n', 1
    )
    toml.write_text(sweep, encoding="utf-8")
    assert run(toml, results) == 1
    err = capsys.readouterr().err
    assert "3.3.0-sqlite-fixed: no results" in err
    assert "3.3.0-sqlite-stock: no results" in err
    assert "3.3.0-postgres" not in err
    swept = {name: outcome for name, outcome in as_declared(Cell(V2, "sqlite", "fixed")).items()}
    for mode in ("fixed", "stock"):
        write_cell(results, Cell("3.3.0", "sqlite", mode), swept)
    assert run(toml, results) == 1  # test_plain catches no bug: a sweep cell must not run it
    assert "test_plain in 3.3.0-sqlite-fixed, 3.3.0-sqlite-stock: FAIL" in capsys.readouterr().err
    del swept["test_plain"]
    for mode in ("fixed", "stock"):
        write_cell(results, Cell("3.3.0", "sqlite", mode), swept)
    assert run(toml, results) == 0


def test_stock_pass_where_a_bug_is_declared(
    toml: Path, results: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cell = Cell(V1, "postgres", "stock")
    write_cell(results, cell, as_declared(cell) | {"test_purge": ""})
    assert run(toml, results) == 1
    err = capsys.readouterr().err
    assert f"tests/test_mod.py::TestScheduler::test_purge in {cell.name}: FAIL: passed" in err
    assert "declared: fail on stock (unconverged_purge)" in err
    report = read_tables(toml.parent / "REPORT.md")
    assert "FAIL(passed vs xfailed)" in report
    assert f"| {V1} | - | FAIL(declared needed; stock cells differ) |" in report


def test_fixed_cell_must_pass_not_xfail(
    toml: Path, results: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cell = Cell(V2, "sqlite", "fixed")
    write_cell(results, cell, as_declared(cell) | {"test_plain": XFAIL})
    assert run(toml, results) == 1
    assert "FAIL: xfailed (stock Airflow has the bug); declared: pass" in capsys.readouterr().err


def test_missing_cell_and_missing_test(toml: Path, results: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (results / f"{V2}-postgres-stock.xml").unlink()
    cell = Cell(V1, "sqlite", "fixed")
    write_cell(results, cell, {k: v for k, v in as_declared(cell).items() if k != "test_plain"})
    assert run(toml, results) == 1
    err = capsys.readouterr().err
    assert f"{V2}-postgres-stock: no results (no junit XML for it)" in err
    assert f"test_plain in {cell.name}: missing" in err
    assert "missing" in read_tables(toml.parent / "REPORT.md")


def test_undeclared_test_of_a_mirrored_module(
    toml: Path, results: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cell = Cell(V1, "sqlite", "fixed")
    write_cell(results, cell, as_declared(cell) | {"test_new": ""})
    assert run(toml, results) == 1
    assert (
        "tests/test_mod.py::TestScheduler::test_new: in a mirrored module but not declared"
        in capsys.readouterr().err
    )


def test_undeclared_parametrization_of_an_override_only_test(toml: Path, results: Path) -> None:
    """test_param's base entry covers any parametrization; a name with no entry at all does not."""
    cell = Cell(V1, "sqlite", "fixed")
    write_cell(results, cell, as_declared(cell) | {"test_param[new]": "", "test_other[x]": ""})
    assert run(toml, results) == 1
    report = read_tables(toml.parent / "REPORT.md")
    assert "test_param[new]: in a mirrored module" not in report
    assert "test_other[x]: in a mirrored module but not declared" in report


def test_tests_outside_mirrored_modules_need_no_declaration(toml: Path, results: Path) -> None:
    write_cell(
        results / "extra", Cell(V1, "sqlite", "fixed"), {"test_activation": ""}, classname="tests.test_other"
    )
    assert run(toml, results) == 0


def test_not_applicable(toml: Path, results: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cell = Cell(V1, "sqlite", "fixed")
    skipped = '<skipped type="pytest.skip" message="needs PostgreSQL" />'
    write_cell(results, cell, as_declared(cell) | {"test_locks": skipped})
    assert run(toml, results) == 0  # skipped where not applicable: still n/a
    write_cell(results, cell, as_declared(cell) | {"test_locks": ""})
    assert run(toml, results) == 1
    assert "FAIL: passed; declared: not applicable (row locks need PostgreSQL)" in capsys.readouterr().err


@pytest.mark.parametrize(
    "text",
    [
        "mirrored_modules = [",  # not TOML
        EXPECTATIONS.replace('catches = ["sink_closes_session"]', 'catches = ["no_such_bug"]'),
    ],
    ids=["bad_toml", "unknown_bug"],
)
def test_invalid_expectations(
    toml: Path, results: Path, text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    toml.write_text(text, encoding="utf-8")
    assert run(toml, results) == 2
    err = capsys.readouterr().err
    assert err.startswith("parity: invalid expectations") and err.count("\n") == 1


def test_no_results(toml: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(toml, tmp_path / "empty") == 2
    assert "no <version>-<db>-<mode>.xml junit results" in capsys.readouterr().err


# --- the pure decisions -----------------------------------------------------------------------------


def test_expected_outcome(toml: Path) -> None:
    exp = load(toml)
    retry, locks = (
        "tests/test_mod.py::TestScheduler::test_param[retry]",
        "tests/test_mod.py::TestScheduler::test_locks",
    )
    assert expected_outcome(exp, retry, Cell(V2, "sqlite", "stock")).outcome is Outcome.XFAILED
    assert expected_outcome(exp, retry, Cell(V2, "sqlite", "fixed")).outcome is Outcome.PASSED
    plain = "tests/test_mod.py::TestScheduler::test_param[plain]"
    assert expected_outcome(exp, plain, Cell(V2, "sqlite", "stock")).outcome is Outcome.PASSED
    assert expected_outcome(exp, locks, Cell(V1, "sqlite", "stock")).outcome is Outcome.NOT_APPLICABLE


@pytest.mark.parametrize(
    ("child", "outcome"),
    [
        ("", Outcome.PASSED),
        (XFAIL, Outcome.XFAILED),
        ('<skipped type="pytest.skip" message="x" />', Outcome.SKIPPED),
        ('<failure message="[XPASS(strict)] x" />', Outcome.FAILED),
        ('<error message="teardown" />', Outcome.ERROR),
    ],
)
def test_actual_outcome(child: str, outcome: Outcome) -> None:
    assert actual_outcome(ET.fromstring(f'<testcase name="t">{child}</testcase>')).outcome is outcome


@pytest.mark.parametrize(
    ("classname", "name", "node"),
    [
        ("tests.test_mod", "test_it[a-b]", "tests/test_mod.py::test_it[a-b]"),
        (
            "tests.unit.jobs.test_scheduler_job.TestSchedulerJob",
            "t",
            "tests/unit/jobs/test_scheduler_job.py::TestSchedulerJob::t",
        ),
    ],
)
def test_node_id_from_junit(classname: str, name: str, node: str) -> None:
    assert node_id(classname, name) == node


def test_release_row_shows_the_pythons_its_cells_ran_on(toml: Path, results: Path) -> None:
    """The release's own Python first, then each dependency set's, as their `status -o json` recorded."""
    states = {"converged_heartbeat_purge": "active", "session_preserving_sink": "active"}
    write_status(results, V1, states, python="3.12.1")
    write_status(results, f"{V1}-python3.10", states, python="3.10.13")
    assert run(toml, results) == 0
    report = read_tables(toml.parent / "REPORT.md")
    assert f"| {V1} | 3.12.1, 3.10.13 (python3.10) | needed" in report
