"""The parity report's decision logic (scripts/parity_report.py): pure functions, no Airflow needed."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("tomllib", reason="scripts/parity_report.py needs Python 3.11+")

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("parity_report", ROOT / "scripts" / "parity_report.py")
assert _spec is not None and _spec.loader is not None
pr = importlib.util.module_from_spec(_spec)
sys.modules["parity_report"] = pr  # dataclasses resolve their module's annotations through sys.modules
_spec.loader.exec_module(pr)

V1, V2 = "3.3.2", "3.4.0b2"
PURGE, SINK = "converged_heartbeat_purge", "session_preserving_sink"
NODE = "tests/test_mod.py::test_it"


def _toml(tests: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        "mirrored_modules": ["tests/test_mod.py"],
        "matrix": {"versions": [V1, V2], "dbs": ["sqlite", "postgres"], "modes": ["fixed", "stock"]},
        "bugs": {PURGE: {"title": "purge", "versions": [V1]}, SINK: {"title": "sink", "versions": [V1, V2]}},
        "sources": {"seed-000": {"title": "t", "ref": "r"}},
        "test": tests,
        **extra,
    }


def _entry(node: str = NODE, **fields: Any) -> dict[str, Any]:
    return {
        "node": node,
        "upstream": "up.py::TestX::test_it",
        "source": "seed-000",
        "stock": {V1: PURGE, V2: "pass"},
    } | fields


def _xml(*cases: str) -> str:
    return f'<testsuites><testsuite name="pytest">{"".join(cases)}</testsuite></testsuites>'


def _case(name: str, child: str = "", classname: str = "tests.test_mod") -> str:
    return f'<testcase classname="{classname}" name="{name}">{child}</testcase>'


XFAIL = '<skipped type="pytest.xfail" message="stock Airflow needs {}: this test must catch the bug" />'
CELL_STOCK = pr.Cell(V1, "sqlite", "stock")
CELL_FIXED = pr.Cell(V1, "sqlite", "fixed")


# --- node ids -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("classname", "name", "expected"),
    [
        ("tests.test_mod", "test_it", "tests/test_mod.py::test_it"),
        ("tests.test_mod", "test_it[a-b]", "tests/test_mod.py::test_it[a-b]"),
        ("tests.test_mod.TestThing", "test_it", "tests/test_mod.py::TestThing::test_it"),
        ("tests.e2e.test_mod", "test_it", "tests/e2e/test_mod.py::test_it"),
    ],
)
def test_node_id_from_junit(classname: str, name: str, expected: str) -> None:
    assert pr.node_id(classname, name) == expected


def test_base_node_drops_parameters() -> None:
    assert pr.base_node("m.py::t[a-b[c]]") == "m.py::t"
    assert pr.base_node("m.py::t") == "m.py::t"


# --- junit parsing ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("children", "outcome"),
    [
        ([], "passed"),
        ([("failure", {"message": "AssertionError"})], "failed"),
        ([("error", {"message": "fixture"})], "error"),
        ([("skipped", {"type": "pytest.xfail", "message": "m"})], "xfailed"),
        ([("skipped", {"type": "pytest.skip", "message": "m"})], "skipped"),
        ([("system-out", {})], "passed"),
    ],
)
def test_classify(children: list[tuple[str, dict[str, str]]], outcome: str) -> None:
    assert pr.classify(children).outcome == outcome


def test_parse_junit_reads_every_case_and_keeps_the_worst_duplicate() -> None:
    text = _xml(
        _case("test_a"),
        _case("test_b[x]", XFAIL.format(PURGE)),
        _case("test_c", '<skipped type="pytest.skip" message="no pg" />'),
        _case("test_d"),
        _case("test_d", '<error message="teardown failed" />'),
    )
    results = pr.parse_junit(text)
    assert {node: o.outcome for node, o in results.items()} == {
        "tests/test_mod.py::test_a": "passed",
        "tests/test_mod.py::test_b[x]": "xfailed",
        "tests/test_mod.py::test_c": "skipped",
        "tests/test_mod.py::test_d": "error",
    }
    assert pr.xfail_bug(results["tests/test_mod.py::test_b[x]"].message) == PURGE


def test_xfail_bug_only_reads_the_suites_reason() -> None:
    assert pr.xfail_bug(f"stock Airflow needs {SINK}: this test must catch the bug") == SINK
    assert pr.xfail_bug("reason: flaky") is None


# --- expectations ------------------------------------------------------------------------------------


def test_expected_for_each_mode_and_version() -> None:
    decl = pr.load_expectations(_toml([_entry()])).declarations[NODE]
    assert pr.expected_for(decl, pr.Cell(V1, "sqlite", "fixed")) == pr.Expected("pass")
    assert pr.expected_for(decl, pr.Cell(V1, "postgres", "stock")) == pr.Expected("xfail", bug=PURGE)
    assert pr.expected_for(decl, pr.Cell(V2, "sqlite", "stock")) == pr.Expected("pass")


def test_not_applicable_covers_only_its_cells() -> None:
    na = [{"dbs": ["sqlite"], "reason": "row locks"}]
    decl = pr.load_expectations(_toml([_entry(not_applicable=na)])).declarations[NODE]
    assert pr.expected_for(decl, pr.Cell(V1, "sqlite", "fixed")) == pr.Expected("na", reason="row locks")
    assert pr.expected_for(decl, pr.Cell(V2, "sqlite", "stock")).kind == "na"
    assert pr.expected_for(decl, pr.Cell(V1, "postgres", "stock")) == pr.Expected("xfail", bug=PURGE)


def test_parametrized_entry_overrides_its_base() -> None:
    override = {"node": f"{NODE}[retry]", "stock": {V1: PURGE, V2: SINK}}
    exp = pr.load_expectations(_toml([_entry(), override]))
    decl = pr.declaration_for(f"{NODE}[retry]", exp.declarations)
    assert decl.stock == {V1: PURGE, V2: SINK}
    assert (decl.upstream, decl.source) == ("up.py::TestX::test_it", "seed-000")  # inherited
    assert pr.declaration_for(f"{NODE}[plain]", exp.declarations).stock == {V1: PURGE, V2: "pass"}
    assert pr.declaration_for("tests/test_mod.py::test_other", exp.declarations) is None


@pytest.mark.parametrize(
    ("tests", "message"),
    [
        ([_entry(stock={V1: PURGE})], "exactly the versions"),
        ([_entry(stock={V1: "typo", V2: "pass"})], "neither 'pass' nor a [bugs] key"),
        ([_entry(stock={V1: PURGE, V2: PURGE})], f"which [bugs] says {V2} lacks"),
        ([_entry(upstream="")], "upstream_note must say why"),
        ([_entry(source="nowhere")], "not in [sources]"),
        ([_entry(), _entry()], "declared twice"),
        ([_entry(not_applicable=[{"dbs": ["mysql"], "reason": "x"}])], "not in the matrix"),
        ([_entry(not_applicable=[{"dbs": ["sqlite"]}])], "needs a reason"),
        ([{"node": f"{NODE}[p]", "stock": {V1: "pass", V2: "pass"}}], "no 'upstream'"),
    ],
)
def test_invalid_expectations_are_rejected(tests: list[dict[str, Any]], message: str) -> None:
    with pytest.raises(pr.ExpectationsError, match=message.replace("[", r"\[").replace("]", r"\]")):
        pr.load_expectations(_toml(tests))


def test_unknown_upstream_with_a_note_is_accepted() -> None:
    exp = pr.load_expectations(_toml([_entry(upstream="", upstream_note="not named in the seed")]))
    assert exp.declarations[NODE].upstream == ""


def test_the_projects_expectations_file_is_valid() -> None:
    with (ROOT / "parity" / "expectations.toml").open("rb") as f:
        exp = pr.load_expectations(pr.tomllib.load(f))
    assert len(exp.cells) == 16
    assert all(module.startswith("tests/") for module in exp.mirrored_modules)


# --- judging one cell --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expected", "observed", "cell", "value", "ok", "reason"),
    [
        (pr.Expected("pass"), pr.Observed("passed"), CELL_FIXED, "pass", True, ""),
        (
            pr.Expected("pass"),
            pr.Observed("failed", "AssertionError: x"),
            CELL_FIXED,
            "FAIL",
            False,
            "failed",
        ),
        (pr.Expected("pass"), pr.Observed("error", "boom"), CELL_FIXED, "FAIL", False, "error: boom"),
        (pr.Expected("pass"), pr.Observed("missing"), CELL_FIXED, "missing", False, "not in the cell"),
        (pr.Expected("pass"), pr.Observed("skipped", "why"), CELL_FIXED, "FAIL", False, "not declared"),
        (
            pr.Expected("pass"),
            pr.Observed("xfailed", f"stock Airflow needs {PURGE}: x"),
            CELL_STOCK,
            "FAIL",
            False,
            "disagree",
        ),
        (
            pr.Expected("xfail", bug=PURGE),
            pr.Observed("xfailed", f"stock Airflow needs {PURGE}: x"),
            CELL_STOCK,
            "fail-on-stock",
            True,
            "",
        ),
        (
            pr.Expected("xfail", bug=PURGE),
            pr.Observed("xfailed", f"stock Airflow needs {SINK}: x"),
            CELL_STOCK,
            "FAIL",
            False,
            f"attributes it to {SINK}",
        ),
        (pr.Expected("xfail", bug=PURGE), pr.Observed("passed"), CELL_STOCK, "FAIL", False, "must fail"),
        (
            pr.Expected("xfail", bug=PURGE),
            pr.Observed("failed", "[XPASS(strict)] stock Airflow needs ..."),
            CELL_STOCK,
            "FAIL",
            False,
            "does not catch the bug",
        ),
        (
            pr.Expected("xfail", bug=PURGE),
            pr.Observed("failed", "DetachedInstanceError"),
            CELL_STOCK,
            "FAIL",
            False,
            "without the suite's xfail",
        ),
        (pr.Expected("xfail", bug=PURGE), pr.Observed("missing"), CELL_STOCK, "missing", False, "not in"),
        (pr.Expected("na", reason="pg only"), pr.Observed("skipped", "pg"), CELL_STOCK, "n/a", True, ""),
        (pr.Expected("na", reason="pg only"), pr.Observed("missing"), CELL_STOCK, "n/a", True, ""),
        (pr.Expected("na", reason="pg only"), pr.Observed("passed"), CELL_STOCK, "FAIL", False, "but it ran"),
    ],
)
def test_judge(expected: Any, observed: Any, cell: Any, value: str, ok: bool, reason: str) -> None:
    verdict = pr.judge(expected, observed, cell)
    assert (verdict.value, verdict.ok) == (value, ok)
    assert reason in verdict.reason


# --- the whole report ----------------------------------------------------------------------------


def _results(exp: Any, cells: dict[str, str | None]) -> dict[str, Any]:
    """Every cell of the matrix: its XML text, or None for "no file"."""
    out: dict[str, Any] = {}
    for cell in exp.cells:
        text = cells.get(cell.name, cells.get("*"))
        out[cell.name] = pr.parse_junit(text) if text is not None else f"no test-results/{cell.name}.xml"
    return out


def _as_declared(exp: Any, cell: Any, *names: str) -> str:
    """A cell's XML in which the named tests behave exactly as declared."""
    cases = []
    for name in names:
        expected = pr.expected_for(pr.declaration_for(f"tests/test_mod.py::{name}", exp.declarations), cell)
        child = {"pass": "", "xfail": XFAIL.format(expected.bug), "na": '<skipped message="n/a" />'}
        cases.append(_case(name, child[expected.kind]))
    return _xml(*cases)


def test_report_all_as_declared_is_ok() -> None:
    exp = pr.load_expectations(
        _toml(
            [
                _entry(),
                _entry("tests/test_mod.py::test_pg", not_applicable=[{"dbs": ["sqlite"], "reason": "pg"}]),
            ]
        )
    )
    results = {c.name: pr.parse_junit(_as_declared(exp, c, "test_it", "test_pg")) for c in exp.cells}
    report = pr.build_report(exp, results)
    assert report.ok
    assert [row.node for row in report.rows] == [NODE, "tests/test_mod.py::test_pg"]
    assert pr.summary_counts(report) == {"pass": 9, "fail-on-stock": 3, "n/a": 4, "missing": 0, "FAIL": 0}
    assert "every cell as declared" in pr.render_markdown(report)
    assert json.loads(json.dumps(pr.to_json(report)))["ok"] is True


def test_report_flags_missing_cells_unexpected_results_and_undeclared_tests() -> None:
    exp = pr.load_expectations(_toml([_entry()]))
    stock_v1 = f"{V1}-sqlite-stock"
    results = _results(
        exp,
        {
            "*": _xml(_case("test_it")),
            stock_v1: _xml(_case("test_it"), _case("test_new")),  # passed where the bug must fail it
            f"{V2}-postgres-fixed": None,
        },
    )
    report = pr.build_report(exp, results)
    assert not report.ok
    assert report.undeclared == ["tests/test_mod.py::test_new"]
    row = report.rows[0]
    assert row.verdicts[stock_v1].value == "FAIL"
    assert row.verdicts[f"{V1}-postgres-stock"].value == "FAIL"
    assert row.verdicts[f"{V2}-postgres-fixed"] == pr.Verdict(
        "missing", False, f"no test-results/{V2}-postgres-fixed.xml"
    )
    lines = report.grouped_mismatches()
    assert f"{NODE} in {stock_v1}, {V1}-postgres-stock: FAIL: passed on stock" in lines[0]
    assert lines[-1].startswith(f"{V2}-postgres-fixed: no results")
    markdown = pr.render_markdown(report)
    assert "**FAIL**" in markdown and "tests/test_mod.py::test_new" in markdown


def test_declared_test_never_seen_is_a_missing_row() -> None:
    exp = pr.load_expectations(_toml([_entry(), _entry("tests/test_mod.py::test_gone")]))
    report = pr.build_report(exp, _results(exp, {"*": _xml(_case("test_it"))}))
    gone = next(row for row in report.rows if row.node.endswith("test_gone"))
    assert {v.value for v in gone.verdicts.values()} == {"missing"}


def test_base_entry_covers_observed_parametrizations_without_an_extra_row() -> None:
    exp = pr.load_expectations(_toml([_entry()]))
    report = pr.build_report(exp, _results(exp, {"*": _xml(_case("test_it[a]"), _case("test_it[b]"))}))
    assert [row.node for row in report.rows] == [f"{NODE}[a]", f"{NODE}[b]"]


def test_upstream_notes_are_listed_once_per_test() -> None:
    override = {"node": f"{NODE}[b]", "upstream_note": "differs for b"}
    exp = pr.load_expectations(_toml([_entry(upstream_note="same for all"), override]))
    results = _results(exp, {"*": _xml(_case("test_it[a]"), _case("test_it[b]"), _case("test_it[c]"))})
    markdown = pr.render_markdown(pr.build_report(exp, results))
    notes = markdown.split("## Notes on upstream ids")[1]
    assert notes.count("same for all") == 1 and "`test_mod.py::test_it`: same for all" in notes
    assert "`test_mod.py::test_it[b]`: differs for b" in notes


def test_main_writes_both_files_and_exits_by_the_result(tmp_path: Path) -> None:
    expectations = tmp_path / "expectations.toml"
    expectations.write_text(
        "\n".join(
            [
                'mirrored_modules = ["tests/test_mod.py"]',
                "[matrix]",
                f'versions = ["{V1}"]',
                'dbs = ["sqlite"]',
                'modes = ["fixed", "stock"]',
                f'[bugs.{PURGE}]\ntitle = "p"\nversions = ["{V1}"]',
                '[sources.s]\ntitle = "t"\nref = "r"',
                "[[test]]",
                f'node = "{NODE}"',
                'upstream = "u"',
                'source = "s"',
                f'stock = {{ "{V1}" = "{PURGE}" }}',
            ]
        )
    )
    results = tmp_path / "results"
    results.mkdir()
    (results / f"{V1}-sqlite-fixed.xml").write_text(_xml(_case("test_it")))
    (results / f"{V1}-sqlite-stock.xml").write_text(_xml(_case("test_it", XFAIL.format(PURGE))))
    out = tmp_path / "out"
    argv = ["--results", str(results), "--expectations", str(expectations), "--out", str(out)]

    assert pr.main([*argv, "--tested", "abc1234"]) == 0
    written = json.loads((out / "report.json").read_text())
    assert written["summary"]["fail-on-stock"] == 1
    assert written["provenance"] == {"Tested commit": "abc1234"}
    assert "| `test_mod.py::test_it` | `u` | s | pass | fail-on-stock |" in (out / "REPORT.md").read_text()

    (results / f"{V1}-sqlite-stock.xml").write_text(_xml(_case("test_it")))
    assert pr.main(argv) == 1
    expectations.write_text("not toml [")
    assert pr.main(argv) == 2
