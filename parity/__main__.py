"""
python -m parity --results DIR [--out parity/REPORT.md] [--json PATH] [--tested COMMIT]
                 [--compatibility docs/compatibility.md]

Reads every ``<version>-<db>-<mode>.xml`` junit file under DIR (subfolders too), checks each declared
test in each cell against ``parity/expectations.toml``, and each ``status-<version>.json`` (what
``airflow-heartbeat-fix status -o json`` reported next to that release) against the same declaration;
writes REPORT.md (and the JSON if asked).
Exit status: 0 every cell as declared, 1 any difference (listed), 2 invalid expectations or no results.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from airflow_heartbeat_fix.detection import FIXES
from parity import expectations as expectations_module
from parity.check import Cell, Result, build_report, parse_junit
from parity.render import as_json, markdown, summary, with_compatibility

HERE = Path(__file__).resolve().parent


def read_results(
    results_dir: Path,
) -> tuple[dict[Cell, dict[str, Result]], dict[Cell, str], list[str]]:
    """Per cell its parsed test cases; cells whose XML is unreadable, and why; junit start timestamps."""
    results: dict[Cell, dict[str, Result]] = {}
    unusable: dict[Cell, str] = {}
    stamps: list[str] = []
    for path in sorted(results_dir.glob("**/*.xml")):
        cell = Cell.from_name(path.stem)
        if cell is None:
            continue
        try:
            root = ET.parse(path).getroot()
        except ET.ParseError as e:
            unusable[cell] = f"{path} is not valid XML: {e}"
            continue
        for node, result in parse_junit(root).items():  # a cell split over several files: merged
            results.setdefault(cell, {})[node] = result
        stamps += [suite.get("timestamp", "") for suite in root.iter("testsuite")]
    return results, unusable, sorted(filter(None, stamps))


def read_statuses(results_dir: Path) -> dict[str, dict[str, str]]:
    """Per release, each fix's state from ``status-<version>.json``; an unreadable file is a state too."""
    statuses: dict[str, dict[str, str]] = {}
    for path in sorted(results_dir.glob("**/status-*.json")):
        version = path.stem.removeprefix("status-")
        try:
            rows = json.loads(path.read_text(encoding="utf-8"))["fixes"]
            statuses[version] = {row["fix"]: row["state"] for row in rows}
        except (OSError, ValueError, KeyError, TypeError) as e:
            statuses[version] = dict.fromkeys(FIXES, f"unreadable {path.name}: {type(e).__name__}")
    return statuses


def read_pythons(results_dir: Path) -> dict[str, str]:
    """
    Per release, the Python each ``status-<version>.json`` of it reports (``python_version``): the
    release's own, then its dependency sets' (``3.10.13 (python3.10)``).
    """
    found: dict[str, list[str]] = {}
    for path in sorted(results_dir.glob("**/status-*.json"), key=lambda path: ("-" in path.stem[7:], path)):
        release, _, dependency_set = path.stem.removeprefix("status-").partition("-")
        try:
            python = str(json.loads(path.read_text(encoding="utf-8"))["python_version"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        found.setdefault(release, []).append(f"{python} ({dependency_set})" if dependency_set else python)
    return {release: ", ".join(pythons) for release, pythons in found.items()}


def checkout_commit() -> str:
    """This checkout's commit: the best guess of what was tested when --tested is not given."""
    try:
        out = subprocess.run(
            ["git", "-C", str(HERE), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return out.stdout.strip() + " (this checkout; not given with --tested)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m parity", description=(__doc__ or "").split("\n\n")[1])
    parser.add_argument("--results", type=Path, required=True, help="directory with the cells' junit XML")
    parser.add_argument("--out", type=Path, default=HERE / "REPORT.md")
    parser.add_argument("--json", type=Path, help="also write the report as JSON here")
    parser.add_argument("--tested", help="the commit the results come from")
    parser.add_argument("--expectations", type=Path, default=expectations_module.DEFAULT_PATH)
    parser.add_argument(
        "--compatibility", type=Path, help="rewrite this file's compatibility block from the run"
    )
    args = parser.parse_args(argv)

    try:
        expectations = expectations_module.load(args.expectations)
    except (OSError, ValueError) as e:  # ValueError: ExpectationsError and tomllib.TOMLDecodeError
        print(f"parity: invalid expectations {args.expectations}: {e}", file=sys.stderr)
        return 2
    results, unusable, stamps = read_results(args.results)
    if not results and not unusable:
        print(f"parity: no <version>-<db>-<mode>.xml junit results under {args.results}", file=sys.stderr)
        return 2

    statuses, pythons = read_statuses(args.results), read_pythons(args.results)
    report = build_report(expectations, results, unusable, statuses, pythons)
    provenance = {"Tested commit": args.tested or checkout_commit()}
    if stamps:
        provenance["Cells ran"] = f"{stamps[0]} to {stamps[-1]} (junit start timestamps)"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(markdown(report, expectations, provenance), encoding="utf-8")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(as_json(report, provenance), indent=2) + "\n", encoding="utf-8")

    if args.compatibility:
        try:
            page = args.compatibility.read_text(encoding="utf-8")
            updated = with_compatibility(page, report, expectations, provenance["Tested commit"])
        except (OSError, ValueError) as e:
            print(f"parity: cannot update {args.compatibility}: {e}", file=sys.stderr)
            return 2
        args.compatibility.write_text(updated, encoding="utf-8")
    print(f"parity: {summary(report)}; wrote {args.out}")
    for line in report.differences():
        print(f"parity: DIFFERS: {line}", file=sys.stderr)
    if not report.ok:
        print(f"parity: {len(report.differences())} difference(s) from the declaration", file=sys.stderr)
        return 1
    print("parity: every cell as declared")
    return 0


if __name__ == "__main__":
    sys.exit(main())
