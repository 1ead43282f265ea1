#!/usr/bin/env python3
"""
Parity report: every mirrored test, in every cell of the matrix, checked against parity/expectations.toml.

    python3 scripts/parity_report.py [--results test-results] [--expectations parity/expectations.toml]
                                     [--out parity]

Reads the junit XML that ``scripts/test.sh`` writes per cell (``test-results/<version>-<db>-<mode>.xml``)
and the declared expectations, writes ``parity/REPORT.md`` and ``parity/report.json``, and exits
0 if every cell is as declared, 1 if any cell differs (each one listed with the reason), 2 if the
expectations file is invalid. Standard library only.

Cell values: ``pass``; ``fail-on-stock`` (failed on stock Airflow, as declared: the suite's strict
xfail); ``n/a`` (declared not applicable, and skipped or not collected); ``missing`` (no result; unexpected);
``FAIL`` (anything else that differs from the declaration).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import tomllib

Outcome = Literal["passed", "failed", "error", "xfailed", "skipped", "missing"]
ExpectedKind = Literal["pass", "xfail", "na"]
Value = Literal["pass", "fail-on-stock", "n/a", "missing", "FAIL"]

#: The suite's xfail reason (tests/conftest.py): "stock Airflow needs <fix>: this test must catch the bug".
XFAIL_REASON = re.compile(r"stock Airflow needs (?P<fix>[A-Za-z0-9_]+)\b")
PASS = "pass"


class ExpectationsError(ValueError):
    """parity/expectations.toml is not valid."""


# ---------------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cell:
    version: str
    db: str
    mode: str

    @property
    def name(self) -> str:
        return f"{self.version}-{self.db}-{self.mode}"


@dataclass(frozen=True)
class NotApplicable:
    reason: str
    versions: frozenset[str] | None = None
    dbs: frozenset[str] | None = None
    modes: frozenset[str] | None = None

    def covers(self, cell: Cell) -> bool:
        return all(
            allowed is None or value in allowed
            for allowed, value in (
                (self.versions, cell.version),
                (self.dbs, cell.db),
                (self.modes, cell.mode),
            )
        )


@dataclass(frozen=True)
class Declaration:
    """What one mirrored test (or one parametrization of it) must do, as declared."""

    node: str
    upstream: str
    upstream_note: str
    source: str
    stock: dict[str, str]
    not_applicable: tuple[NotApplicable, ...] = ()


@dataclass(frozen=True)
class Expectations:
    versions: tuple[str, ...]
    dbs: tuple[str, ...]
    modes: tuple[str, ...]
    bugs: dict[str, dict[str, Any]]
    sources: dict[str, dict[str, str]]
    mirrored_modules: tuple[str, ...]
    #: keyed by node id: without parameters (base) or with them (override, already merged with its base)
    declarations: dict[str, Declaration]

    @property
    def cells(self) -> list[Cell]:
        return [Cell(v, d, m) for v in self.versions for d in self.dbs for m in self.modes]


@dataclass(frozen=True)
class Observed:
    outcome: Outcome
    message: str = ""


@dataclass(frozen=True)
class Expected:
    kind: ExpectedKind
    bug: str | None = None
    reason: str = ""

    def describe(self) -> str:
        if self.kind == "na":
            return f"not applicable ({self.reason})"
        if self.kind == "xfail":
            return f"fail on stock ({self.bug})"
        return "pass"


@dataclass(frozen=True)
class Verdict:
    value: Value
    ok: bool
    reason: str = ""


@dataclass
class Row:
    node: str
    declaration: Declaration
    verdicts: dict[str, Verdict] = field(default_factory=dict)
    expected: dict[str, Expected] = field(default_factory=dict)
    observed: dict[str, Observed] = field(default_factory=dict)


@dataclass
class Report:
    expectations: Expectations
    rows: list[Row]
    cell_notes: dict[str, str]
    undeclared: list[str]
    #: where the results come from (commit, when the cells ran): shown as is, not judged
    provenance: dict[str, str] = field(default_factory=dict)

    @property
    def mismatches(self) -> list[tuple[str, str, Verdict]]:
        return [
            (row.node, cell.name, row.verdicts[cell.name])
            for row in self.rows
            for cell in self.expectations.cells
            if not row.verdicts[cell.name].ok
        ]

    def grouped_mismatches(self) -> list[str]:
        """One line per differing cell of a test; a cell without any results is one line, not one per test."""
        same: dict[tuple[str, str, str], list[str]] = {}
        for node, cell, verdict in self.mismatches:
            if cell not in self.cell_notes:
                same.setdefault((node, verdict.value, verdict.reason), []).append(cell)
        lines = [
            f"{node} in {', '.join(cells)}: {value}: {why}" for (node, value, why), cells in same.items()
        ]
        for cell, note in self.cell_notes.items():
            n = sum(1 for _, name, _ in self.mismatches if name == cell)
            if n:
                lines.append(f"{cell}: no results ({note}): {n} test(s) missing")
        return lines

    @property
    def ok(self) -> bool:
        return not self.mismatches and not self.undeclared


# ---------------------------------------------------------------------------------------------------
# Pure decision logic
# ---------------------------------------------------------------------------------------------------


def node_id(classname: str, name: str) -> str:
    """Node id from junit: ("tests.test_x.TestY", "t[p]") -> "tests/test_x.py::TestY::t[p]"."""
    parts = classname.split(".") if classname else []
    classes: list[str] = []
    while parts and parts[-1][:1].isupper():
        classes.insert(0, parts.pop())
    module = "/".join(parts) + ".py" if parts else ""
    return "::".join(p for p in (module, *classes, name) if p)


def base_node(node: str) -> str:
    """The node id without its parameters: "m.py::t[a-b]" -> "m.py::t"."""
    bracket = node.find("[")
    return node if bracket < 0 else node[:bracket]


def module_of(node: str) -> str:
    return node.split("::", 1)[0]


def classify(children: list[tuple[str, dict[str, str]]]) -> Observed:
    """A junit <testcase>'s children as (tag, attributes) -> what happened to the test."""
    by_tag = {tag: attrs for tag, attrs in children}
    if "error" in by_tag:
        return Observed("error", by_tag["error"].get("message", ""))
    if "failure" in by_tag:
        return Observed("failed", by_tag["failure"].get("message", ""))
    if "skipped" in by_tag:
        skipped = by_tag["skipped"]
        outcome: Outcome = "xfailed" if skipped.get("type") == "pytest.xfail" else "skipped"
        return Observed(outcome, skipped.get("message", ""))
    return Observed("passed")


def parse_junit(text: str) -> dict[str, Observed]:
    """All test cases of one junit XML document, by node id (a node that occurs twice keeps the worst)."""
    results: dict[str, Observed] = {}
    rank = {"error": 0, "failed": 1, "skipped": 2, "xfailed": 3, "passed": 4, "missing": 5}
    for case in ET.fromstring(text).iter("testcase"):
        node = node_id(case.get("classname", ""), case.get("name", ""))
        observed = classify([(child.tag, dict(child.attrib)) for child in case])
        if node not in results or rank[observed.outcome] < rank[results[node].outcome]:
            results[node] = observed
    return results


def xfail_bug(message: str) -> str | None:
    """Which fix the suite's xfail reason names, if it is the suite's reason at all."""
    match = XFAIL_REASON.search(message)
    return match.group("fix") if match else None


def declaration_for(node: str, declarations: dict[str, Declaration]) -> Declaration | None:
    """The declaration that applies to a node: its own (parametrized) entry, else its base entry."""
    return declarations.get(node) or declarations.get(base_node(node))


def expected_for(declaration: Declaration, cell: Cell) -> Expected:
    for na in declaration.not_applicable:
        if na.covers(cell):
            return Expected("na", reason=na.reason)
    if cell.mode == "stock":
        stock = declaration.stock[cell.version]
        if stock != PASS:
            return Expected("xfail", bug=stock)
    return Expected("pass")


def _brief(message: str, limit: int = 160) -> str:
    line = " ".join(message.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def judge(expected: Expected, observed: Observed, cell: Cell) -> Verdict:
    """Compare one cell's result with its declaration."""
    got, msg = observed.outcome, _brief(observed.message)
    if expected.kind == "na":
        if got in ("skipped", "missing"):
            return Verdict("n/a", True)
        return Verdict("FAIL", False, f"declared not applicable ({expected.reason}) but it ran: {got}")
    if got == "missing":
        return Verdict("missing", False, "not in the cell's junit XML (not collected or not run)")
    if expected.kind == "pass":
        if got == "passed":
            return Verdict("pass", True)
        if got == "xfailed":
            return Verdict(
                "FAIL",
                False,
                f"failed on stock ({msg}), but declared: stock {cell.version} passes "
                "(the suite's feature detection and the declaration disagree)",
            )
        if got == "skipped":
            return Verdict("FAIL", False, f"skipped ({msg}) but not declared not applicable here")
        return Verdict("FAIL", False, f"{got}: {msg}" if msg else got)
    # expected.kind == "xfail": stock Airflow of this version has the bug; the test must fail here.
    if got == "xfailed":
        named = xfail_bug(observed.message)
        if named == expected.bug:
            return Verdict("fail-on-stock", True)
        return Verdict(
            "FAIL",
            False,
            f"failed on stock, but the suite attributes it to {named or 'an unknown reason'} ({msg}); "
            f"declared: {expected.bug}",
        )
    if got == "passed":
        return Verdict(
            "FAIL",
            False,
            f"passed on stock, but declared: stock {cell.version} has the {expected.bug} bug, so it must "
            "fail (the suite did not mark it xfail: feature detection and the declaration disagree)",
        )
    if got == "failed" and "XPASS" in observed.message:
        return Verdict(
            "FAIL",
            False,
            f"XPASS(strict): the suite expected the {expected.bug} bug to fail it on stock, but it passed "
            "(the test does not catch the bug here)",
        )
    if got == "skipped":
        return Verdict("FAIL", False, f"skipped ({msg}); declared to fail on stock ({expected.bug})")
    return Verdict(
        "FAIL", False, f"{got} on stock without the suite's xfail ({msg}); declared {expected.bug}"
    )


def load_expectations(data: dict[str, Any]) -> Expectations:
    """Validate the parsed TOML and merge parametrized overrides into their base entries."""
    try:
        matrix = data["matrix"]
        versions, dbs, modes = (tuple(matrix[key]) for key in ("versions", "dbs", "modes"))
        bugs: dict[str, dict[str, Any]] = dict(data["bugs"])
        sources: dict[str, dict[str, str]] = dict(data["sources"])
        entries: list[dict[str, Any]] = list(data["test"])
    except (KeyError, TypeError) as e:
        raise ExpectationsError(f"missing or malformed top-level key: {e}") from e
    if set(modes) != {"fixed", "stock"}:
        raise ExpectationsError(f"matrix.modes must be fixed and stock, not {list(modes)}")

    bases: dict[str, dict[str, Any]] = {}
    overrides: dict[str, dict[str, Any]] = {}
    for entry in entries:
        node = entry.get("node")
        if not isinstance(node, str) or "::" not in node:
            raise ExpectationsError(f"[[test]] without a valid node: {entry!r}")
        target = overrides if "[" in node else bases
        if node in target:
            raise ExpectationsError(f"{node}: declared twice")
        target[node] = entry

    declarations: dict[str, Declaration] = {}
    for node, entry in [*bases.items(), *overrides.items()]:
        base = bases.get(base_node(node), {}) if node in overrides else {}
        merged = {**base, **entry}
        declarations[node] = _declaration(node, merged, versions, dbs, modes, bugs, sources)
    return Expectations(
        versions=versions,
        dbs=dbs,
        modes=modes,
        bugs=bugs,
        sources=sources,
        mirrored_modules=tuple(data.get("mirrored_modules", ())),
        declarations=declarations,
    )


def _declaration(
    node: str,
    entry: dict[str, Any],
    versions: tuple[str, ...],
    dbs: tuple[str, ...],
    modes: tuple[str, ...],
    bugs: dict[str, dict[str, Any]],
    sources: dict[str, dict[str, str]],
) -> Declaration:
    for key in ("upstream", "source", "stock"):
        if key not in entry:
            raise ExpectationsError(f"{node}: no '{key}' (nor on its entry without parameters)")
    upstream, note = str(entry["upstream"]), str(entry.get("upstream_note", ""))
    if not upstream and not note:
        raise ExpectationsError(f"{node}: upstream is unknown, so upstream_note must say why")
    if entry["source"] not in sources:
        raise ExpectationsError(f"{node}: source '{entry['source']}' is not in [sources]")
    stock = dict(entry["stock"])
    if set(stock) != set(versions):
        raise ExpectationsError(
            f"{node}: stock must declare exactly the versions {list(versions)}, got {sorted(stock)}"
        )
    for version, value in stock.items():
        if value == PASS:
            continue
        if value not in bugs:
            raise ExpectationsError(
                f"{node}: stock[{version}] = '{value}' is neither 'pass' nor a [bugs] key"
            )
        if version not in bugs[value].get("versions", ()):
            raise ExpectationsError(
                f"{node}: stock[{version}] names {value}, which [bugs] says {version} lacks"
            )
    not_applicable = []
    for na in entry.get("not_applicable", ()):
        if not na.get("reason"):
            raise ExpectationsError(f"{node}: a not_applicable entry needs a reason")
        for key, allowed in (("versions", versions), ("dbs", dbs), ("modes", modes)):
            unknown = set(na.get(key, ())) - set(allowed)
            if unknown:
                raise ExpectationsError(f"{node}: not_applicable {key} {sorted(unknown)} not in the matrix")
        not_applicable.append(
            NotApplicable(
                reason=na["reason"],
                **{key: frozenset(na[key]) for key in ("versions", "dbs", "modes") if key in na},
            )
        )
    return Declaration(node, upstream, note, entry["source"], stock, tuple(not_applicable))


def build_report(expectations: Expectations, results: dict[str, dict[str, Observed] | str]) -> Report:
    """
    ``results``: per cell name, the parsed junit results, or a string saying why there are none.

    Rows: every observed node that a declaration covers, plus every declared node never observed
    (a base entry stands for its parametrizations only when none of them was observed).
    """
    # dicts keep insertion order: nodes in the order pytest ran them, first cell first
    parsed = [cell for cell in results.values() if isinstance(cell, dict)]
    observed_nodes = list({node: None for cell in parsed for node in cell})
    rows: dict[str, Row] = {}
    undeclared: list[str] = []
    for node in observed_nodes:
        declaration = declaration_for(node, expectations.declarations)
        if declaration is not None:
            rows[node] = Row(node, declaration)
        elif module_of(node) in expectations.mirrored_modules:
            undeclared.append(node)
    for node, declaration in expectations.declarations.items():
        covered = any(base_node(seen) == base_node(node) for seen in rows)
        if node not in rows and (("[" in node) or not covered):
            rows[node] = Row(node, declaration)

    cell_notes: dict[str, str] = {}
    for cell in expectations.cells:
        cell_results = results.get(cell.name, f"no test-results/{cell.name}.xml")
        if isinstance(cell_results, str):
            cell_notes[cell.name] = cell_results
        for row in rows.values():
            expected = expected_for(row.declaration, cell)
            if isinstance(cell_results, str):
                observed = Observed("missing", cell_results)
            else:
                observed = cell_results.get(row.node, Observed("missing"))
            verdict = judge(expected, observed, cell)
            if isinstance(cell_results, str) and verdict.value == "missing":
                verdict = Verdict("missing", False, cell_results)
            row.expected[cell.name], row.observed[cell.name], row.verdicts[cell.name] = (
                expected,
                observed,
                verdict,
            )
    # Rows in the order of expectations.toml; parametrizations of one test in the order pytest ran them.
    declared_order: dict[str, int] = {}
    for node in expectations.declarations:
        declared_order.setdefault(base_node(node), len(declared_order))
    run_order = {node: i for i, node in enumerate(observed_nodes)}
    ordered = sorted(
        rows.values(),
        key=lambda row: (declared_order[base_node(row.declaration.node)], run_order.get(row.node, 0)),
    )
    return Report(expectations, ordered, cell_notes, undeclared)


# ---------------------------------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------------------------------


def _short_node(node: str) -> str:
    return node.removeprefix("tests/")


def _upstream_cell(declaration: Declaration) -> str:
    if not declaration.upstream:
        return "unknown"
    return "`" + declaration.upstream.removeprefix("airflow-core/tests/unit/jobs/") + "`"


def summary_counts(report: Report) -> dict[str, int]:
    counts = {value: 0 for value in ("pass", "fail-on-stock", "n/a", "missing", "FAIL")}
    for row in report.rows:
        for verdict in row.verdicts.values():
            counts[verdict.value] += 1
    return counts


def render_markdown(report: Report) -> str:
    exp = report.expectations
    cells = exp.cells
    counts = summary_counts(report)
    lines = [
        "# Parity report",
        "",
        "Generated by `bash scripts/parity.sh` (`scripts/parity_report.py`) from the junit XML of one",
        "`scripts/test.sh` matrix run and the declarations in [`expectations.toml`](expectations.toml).",
        "Do not edit by hand.",
        "",
        *[f"- {key}: {value}" for key, value in report.provenance.items()],
        "",
        f"**Result: {'every cell as declared' if report.ok else 'CELLS DIFFER FROM THE DECLARATION'}** — "
        f"{len(report.rows)} mirrored tests x {len(cells)} cells: "
        + ", ".join(f"{n} {value}" for value, n in counts.items()),
        "",
        "Values: `pass`; `fail-on-stock` = failed on stock Airflow where that version has the bug, as "
        "declared (the suite's strict xfail, attributed to the declared bug); `n/a` = declared not "
        "applicable and skipped or not collected there; `missing` = no result; **FAIL** = differs from "
        "the declaration (see below).",
        "Fixed mode must pass in every applicable cell.",
        "",
        "Bugs (stock):",
        "",
    ]
    for name, bug in exp.bugs.items():
        lines.append(f"- `{name}`: {bug.get('title', '')} — stock {', '.join(bug.get('versions', ()))}")
    lines += ["", "Sources:", ""]
    for key, source in exp.sources.items():
        lines.append(f"- `{key}`: {source.get('title', '')} ({source.get('ref', '')})")

    head = ["Test (ours)", "Upstream test", "Source"] + [f"{c.version}<br>{c.db}<br>{c.mode}" for c in cells]
    lines += ["", "## Matrix", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in report.rows:
        values = [
            "**FAIL**" if row.verdicts[c.name].value == "FAIL" else row.verdicts[c.name].value for c in cells
        ]
        lines.append(
            "| "
            + " | ".join(
                [
                    f"`{_short_node(row.node)}`",
                    _upstream_cell(row.declaration),
                    row.declaration.source,
                    *values,
                ]
            )
            + " |"
        )

    lines += ["", "## Cells that differ from the declaration", ""]
    if report.mismatches:
        lines += [f"- {line}" for line in report.grouped_mismatches()]
    else:
        lines.append("None.")
    if report.undeclared:
        lines += ["", "## Tests in mirrored modules without a declaration", ""]
        lines += [f"- `{node}`" for node in report.undeclared]

    notes = [row for row in report.rows if row.declaration.upstream_note]
    if notes:
        lines += ["", "## Notes on upstream ids", ""]
        seen: set[tuple[str, str]] = set()
        for row in notes:
            base, note = base_node(row.node), row.declaration.upstream_note
            if (base, note) in seen:
                continue
            seen.add((base, note))
            base_decl = exp.declarations.get(base)
            shown = base if base_decl is not None and base_decl.upstream_note == note else row.node
            lines.append(f"- `{_short_node(shown)}`: {note}")
    return "\n".join(lines) + "\n"


def to_json(report: Report) -> dict[str, Any]:
    exp = report.expectations
    return {
        "ok": report.ok,
        "provenance": report.provenance,
        "matrix": {"versions": list(exp.versions), "dbs": list(exp.dbs), "modes": list(exp.modes)},
        "cells": [c.name for c in exp.cells],
        "summary": summary_counts(report),
        "bugs": exp.bugs,
        "sources": exp.sources,
        "rows": [
            {
                "node": row.node,
                "upstream": row.declaration.upstream or None,
                "upstream_note": row.declaration.upstream_note or None,
                "source": row.declaration.source,
                "declared_stock": row.declaration.stock,
                "cells": {
                    c.name: {
                        "value": row.verdicts[c.name].value,
                        "ok": row.verdicts[c.name].ok,
                        "expected": row.expected[c.name].describe(),
                        "observed": row.observed[c.name].outcome,
                        **({"reason": row.verdicts[c.name].reason} if row.verdicts[c.name].reason else {}),
                    }
                    for c in exp.cells
                },
            }
            for row in report.rows
        ],
        "mismatches": [
            {"node": node, "cell": cell, "value": verdict.value, "reason": verdict.reason}
            for node, cell, verdict in report.mismatches
        ],
        "undeclared": report.undeclared,
        "cells_without_results": report.cell_notes,
    }


# ---------------------------------------------------------------------------------------------------
# I/O
# ---------------------------------------------------------------------------------------------------


def junit_timestamps(results_dir: Path) -> list[str]:
    """The start timestamps of the junit test suites in a results directory, sorted."""
    stamps = []
    for path in results_dir.glob("*.xml"):
        try:
            stamps += [s.get("timestamp", "") for s in ET.parse(path).getroot().iter("testsuite")]
        except ET.ParseError:
            continue
    return sorted(stamp for stamp in stamps if stamp)


def git_state(root: Path) -> str:
    """The checkout's commit, and whether it had uncommitted changes (best effort)."""
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return f"{commit} (with uncommitted changes)" if dirty else commit


def read_results(results_dir: Path, cells: list[Cell]) -> dict[str, dict[str, Observed] | str]:
    results: dict[str, dict[str, Observed] | str] = {}
    for cell in cells:
        path = results_dir / f"{cell.name}.xml"
        try:
            results[cell.name] = parse_junit(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            results[cell.name] = f"no {results_dir.name}/{path.name}"
        except ET.ParseError as e:
            results[cell.name] = f"{results_dir.name}/{path.name} is not valid junit XML: {e}"
    return results


def main(argv: list[str] | None = None) -> int:
    root = Path(__file__).resolve().parent.parent
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].strip())
    parser.add_argument("--results", type=Path, default=root / "test-results")
    parser.add_argument("--expectations", type=Path, default=root / "parity" / "expectations.toml")
    parser.add_argument("--out", type=Path, default=root / "parity", help="where REPORT.md/report.json go")
    parser.add_argument(
        "--tested", help="the commit the results were produced from (default: this checkout's, now)"
    )
    args = parser.parse_args(argv)

    try:
        with args.expectations.open("rb") as f:
            expectations = load_expectations(tomllib.load(f))
    except (OSError, tomllib.TOMLDecodeError, ExpectationsError) as e:
        print(f"parity: invalid expectations {args.expectations}: {e}", file=sys.stderr)
        return 2

    report = build_report(expectations, read_results(args.results, expectations.cells))
    stamps = junit_timestamps(args.results)
    report.provenance = {"Tested commit": args.tested or git_state(root)}
    if stamps:
        report.provenance["Cells ran"] = f"{stamps[0]} to {stamps[-1]} (junit start timestamps)"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "REPORT.md").write_text(render_markdown(report), encoding="utf-8")
    (args.out / "report.json").write_text(json.dumps(to_json(report), indent=2) + "\n", encoding="utf-8")

    counts = summary_counts(report)
    print(
        f"parity: {len(report.rows)} mirrored tests x {len(expectations.cells)} cells: "
        + ", ".join(f"{n} {value}" for value, n in counts.items())
    )
    for line in report.grouped_mismatches():
        print(f"parity: UNEXPECTED {line}", file=sys.stderr)
    for node in report.undeclared:
        print(f"parity: UNDECLARED {node}: in a mirrored module, not declared", file=sys.stderr)
    print(f"parity: wrote {args.out / 'REPORT.md'} and {args.out / 'report.json'}")
    if not report.ok:
        n = len(report.mismatches) + len(report.undeclared)
        print(f"parity: FAILED: {n} difference(s) from the declaration", file=sys.stderr)
        return 1
    print("parity: every cell as declared")
    return 0


if __name__ == "__main__":
    sys.exit(main())
