"""The loader of ``parity/expectations.toml``: schema checks, inheritance, and the detection cross-check."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from airflow_heartbeat_fix.detection import PURGE_FIX, SINK_FIX
from parity.expectations import SWEEP_RULE, ExpectationsError, disagreements_with_detection, load, parse

NODE = "tests/unit/jobs/test_scheduler_job.py::TestSchedulerJob::test_x"


def _file() -> dict[str, Any]:
    """A small valid file: two bugs of different fixes, one test with one parametrized override."""
    return {
        "mirrored_modules": ["tests/unit/jobs/test_scheduler_job.py"],
        "matrix": {
            "versions": ["3.3.2", "3.4.0b2"],
            "dbs": ["sqlite", "postgres"],
            "modes": ["fixed", "stock"],
        },
        "bugs": {
            "old_purge": {"fix": PURGE_FIX, "title": "purge", "versions": ["3.3.2"]},
            "crash": {"fix": SINK_FIX, "title": "crash", "versions": ["3.4.0b2"]},
        },
        "sources": {"seed": {"title": "t", "ref": "r"}},
        "test": [
            {
                "node": NODE,
                "upstream": "",
                "upstream_note": "none known",
                "source": "seed",
                "catches": ["old_purge"],
                "not_applicable": [{"dbs": ["sqlite"], "reason": "row locks"}],
            },
            {"node": f"{NODE}[retry]", "catches": ["old_purge", "crash"]},
        ],
    }


def test_repository_file_is_valid() -> None:
    expectations = load()
    assert expectations.mirrored_modules == ("tests/unit/jobs/test_scheduler_job.py",)
    # Non-mirrored tests that catch a stock bug are declared too (EXPECTATIONS_SCHEMA: e.g. the row-lock
    # and sink contract tests); every entry must name a test module of this repository.
    root = Path(__file__).resolve().parent.parent
    assert all((root / entry.node.split("::", 1)[0]).is_file() for entry in expectations.tests.values())


def test_sweep_releases_can_carry_bugs_and_be_checked() -> None:
    data = copy.deepcopy(_file())
    data["matrix"]["sweep"] = ["3.3.0"]
    data["bugs"]["old_purge"]["versions"] = ["3.3.0", "3.3.2"]
    data["test"][0]["not_applicable"] = [{"versions": ["3.3.0"], "dbs": ["postgres"], "reason": "swept"}]
    expectations = parse(data)
    assert expectations.sweep == ("3.3.0",)
    assert expectations.all_versions == ("3.3.2", "3.4.0b2", "3.3.0")
    assert [bug.name for bug in expectations.bugs_caught(NODE, "3.3.0")] == ["old_purge"]
    assert disagreements_with_detection(expectations, "3.3.0", {SINK_FIX}) == []
    assert parse(_file()).sweep == ()


def test_parametrized_entry_inherits_what_it_does_not_set() -> None:
    expectations = parse(_file())
    override = expectations.for_node(f"{NODE}[retry]")
    assert override is not None
    assert (override.source, override.upstream_note, override.catches) == (
        "seed",
        "none known",
        ("old_purge", "crash"),
    )
    other = expectations.for_node(f"{NODE}[no_retries]")
    assert other is not None and other.catches == ("old_purge",)
    assert expectations.for_node("tests/test_activation.py::test_y") is None


def test_bugs_caught_are_those_present_in_the_version() -> None:
    expectations = parse(_file())
    assert [bug.name for bug in expectations.bugs_caught(f"{NODE}[retry]", "3.3.2")] == ["old_purge"]
    assert [bug.name for bug in expectations.bugs_caught(f"{NODE}[retry]", "3.4.0b2")] == ["crash"]
    assert expectations.bugs_caught(f"{NODE}[no_retries]", "3.4.0b2") == ()
    assert expectations.bugs_caught("tests/test_activation.py::test_y", "3.3.2") == ()


def test_not_applicable_matches_cells() -> None:
    expectations = parse(_file())
    assert expectations.not_applicable(NODE, "3.3.2", "sqlite", "stock") == "row locks"
    assert expectations.not_applicable(f"{NODE}[retry]", "3.4.0b2", "sqlite", "fixed") == "row locks"
    assert expectations.not_applicable(NODE, "3.3.2", "postgres", "stock") is None


def test_a_test_without_its_extra_is_not_applicable() -> None:
    """``without_extra``: not applicable where that extra is missing, as in every cell of the report."""
    data = copy.deepcopy(_file())
    data["test"][1]["not_applicable"] = [{"without_extra": "kubernetes", "reason": "needs the provider"}]
    expectations = parse(data)
    retry = f"{NODE}[retry]"
    assert expectations.not_applicable(retry, "3.4.0b2", "postgres", "stock") == "needs the provider"
    assert (
        expectations.not_applicable(retry, "3.4.0b2", "postgres", "stock", frozenset({"kubernetes"})) is None
    )
    assert expectations.not_applicable(NODE, "3.4.0b2", "postgres", "stock") is None


def _broken(change: str) -> dict[str, Any]:
    data = copy.deepcopy(_file())
    base, override = data["test"]
    if change == "unknown bug":
        override["catches"] = ["no_such_bug"]
    elif change == "unknown source":
        base["source"] = "nowhere"
    elif change == "bug version outside the matrix":
        data["bugs"]["crash"]["versions"] = ["3.9.0"]
    elif change == "unknown fix":
        data["bugs"]["crash"]["fix"] = "no_such_fix"
    elif change == "override without base":
        data["test"] = [override]
    elif change == "no upstream and no note":
        base["upstream_note"] = ""
    elif change == "declared twice":
        data["test"].append(dict(base))
    elif change == "unknown key":
        base["stock"] = {"3.3.2": "pass"}
    elif change == "not_applicable without reason":
        base["not_applicable"] = [{"dbs": ["sqlite"]}]
    elif change == "without_extra not a name":
        base["not_applicable"] = [{"without_extra": ["kubernetes"], "reason": "x"}]
    elif change == "release both in the full matrix and the sweep":
        data["matrix"]["sweep"] = ["3.3.2"]
    return data


@pytest.mark.parametrize(
    "change",
    [
        "unknown bug",
        "unknown source",
        "bug version outside the matrix",
        "unknown fix",
        "override without base",
        "no upstream and no note",
        "declared twice",
        "unknown key",
        "not_applicable without reason",
        "without_extra not a name",
        "release both in the full matrix and the sweep",
    ],
)
def test_inconsistent_files_are_rejected(change: str) -> None:
    with pytest.raises(ExpectationsError):
        parse(_broken(change))


@pytest.mark.parametrize(
    ("version", "not_needed", "problems"),
    [
        pytest.param("3.3.2", {SINK_FIX}, 0, id="agree on 3.3"),
        pytest.param("3.4.0b2", {PURGE_FIX}, 0, id="agree on 3.4"),
        pytest.param("3.3.2", set(), 1, id="no sink bug listed, detection says the sink fix is needed"),
        pytest.param("3.3.2", {SINK_FIX, PURGE_FIX}, 1, id="purge bug listed, detection says not needed"),
        pytest.param("3.4.0b2", {SINK_FIX, PURGE_FIX}, 1, id="sink bug listed, detection says not needed"),
        pytest.param("9.9.9", set(), 1, id="release outside the matrix"),
    ],
)
def test_disagreements_with_detection(version: str, not_needed: set[str], problems: int) -> None:
    expectations = parse(_file())
    assert len(disagreements_with_detection(expectations, version, not_needed)) == problems


def test_sweep_rule_is_lifted_for_cells_that_run_the_whole_suite() -> None:
    """A test that catches no bug is left out of a sweep release's cells, unless they run everything."""
    data = copy.deepcopy(_file())
    data["matrix"]["sweep"] = ["3.3.0"]
    data["test"][0]["catches"] = []
    data["test"][1]["catches"] = []
    expectations = parse(data)
    assert expectations.not_applicable(NODE, "3.3.0", "sqlite", "fixed") == SWEEP_RULE
    assert expectations.not_applicable(NODE, "3.3.0", "postgres", "fixed", sweep=False) is None


def test_python_of_a_release_and_of_its_dependency_sets() -> None:
    data = copy.deepcopy(_file())
    data["matrix"]["python"] = {"3.3.2": "3.12", "3.3.2-python3.10": "3.10"}
    expectations = parse(data)
    assert expectations.python_of("3.3.2") == "3.12"
    assert expectations.python_of("3.3.2-sqlalchemy1.4") == "3.12"
    assert expectations.python_of("3.3.2-python3.10") == "3.10"
    assert expectations.python_of("3.4.0b2") == "3.11"
    data["matrix"]["python"] = {"9.9.9": "3.12"}
    with pytest.raises(ExpectationsError, match="not in the matrix"):
        parse(data)
