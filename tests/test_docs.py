"""
The operator's pages render, and say what the package is: every Markdown table in the README and in
``docs/`` is a table GitHub renders (a header, its separator, every row with the header's cells: a blank
line or a stray ``|`` inside one leaves the rest as raw text), and the README's sample of ``status`` shows
the package's own version and fixes.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from packaging.version import Version

from airflow_heartbeat_fix import __version__
from airflow_heartbeat_fix.detection import FIXES

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
_SEPARATOR = re.compile(r"^\|(\s*:?-+:?\s*\|)+\s*$")


def _cells(row: str) -> int:
    """The cells GitHub sees in a table row: pipes split it wherever they are, unless escaped (``\\|``)."""
    return len(re.split(r"(?<!\\)\|", row.strip().strip("|")))


def _pipe_blocks(text: str) -> list[tuple[int, list[str]]]:
    """Runs of lines that start with ``|``, outside code blocks: ``(first line number, lines)``."""
    blocks: list[tuple[int, list[str]]] = []
    in_code, current, start = False, [], 0
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            in_code = not in_code
        if not in_code and line.lstrip().startswith("|"):
            if not current:
                start = number
            current.append(line.strip())
            continue
        if current:
            blocks.append((start, current))
            current = []
    if current:
        blocks.append((start, current))
    return blocks


def table_problems(text: str) -> list[str]:
    """Where ``text`` has a Markdown table GitHub would not render as the writer meant."""
    problems = []
    for start, rows in _pipe_blocks(text):
        if len(rows) < 2 or not _SEPARATOR.match(rows[1]):
            problems.append(f"line {start}: rows starting with '|' without a header and separator (raw text)")
            continue
        width = _cells(rows[0])
        problems += [
            f"line {start + offset}: {_cells(row)} cells, the header has {width}"
            for offset, row in enumerate(rows)
            if _cells(row) != width
        ]
    return problems


def test_the_table_check_sees_a_broken_table() -> None:
    good = "| a | b |\n|---|---|\n| 1 | 2 |\n"
    assert table_problems(good) == []
    assert table_problems(good + "\n| 3 | 4 |\n")  # a blank line ended the table: raw text
    assert table_problems("| a | b |\n|---|---|\n| `x|y` | 2 |\n")  # an unescaped pipe in a cell
    assert table_problems("| a | b |\n|---|---|\n| `x\\|y` | 2 |\n") == []


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_table_renders(page: Path) -> None:
    assert table_problems(page.read_text(encoding="utf-8")) == []


def _status_sample() -> list[str]:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    sample = readme.split("$ airflow-heartbeat-fix status\n", 1)[1].split("```", 1)[0]
    return sample.splitlines()


def test_the_readme_shows_the_packages_own_version_and_fixes() -> None:
    sample = _status_sample()
    shown_version = re.match(r"airflow-heartbeat-fix (\S+) on Airflow", sample[0])
    assert shown_version is not None, sample[0]
    assert shown_version.group(1) == Version(__version__).base_version
    rows = [line.split("|")[0].strip() for line in sample if "|" in line][1:]  # below the header
    assert rows == list(FIXES)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    fixes_table = readme.split("## What it fixes", 1)[1].split("\n\n", 2)[1]
    named = {fix for row in fixes_table.splitlines()[2:] for fix in re.findall(r"`(\w+)` \|$", row)}
    assert named == set(FIXES), (
        "the README's table of bugs names a fix the package does not have, or misses one"
    )


def test_the_readme_is_an_operators_page() -> None:
    """Under 200 lines; install, verify and the off switch (both its forms) on its first 80."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    first = "\n".join(lines[:80])
    assert len(lines) < 200
    for needed in (
        "## Install",
        "pip install airflow-heartbeat-fix",
        "## Verify",
        "airflow-heartbeat-fix status",
    ):
        assert needed in first, needed
    assert "## Turn it off" in first
    assert "enabled = False" in first and "AIRFLOW__HEARTBEAT_FIX__ENABLED=False" in first
