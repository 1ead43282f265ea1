"""The HTML timeline report."""

from __future__ import annotations

import json

from airflow_heartbeat_fix.demo import html_report, result
from tests.demo._results import CB, DUPLICATES_NEEDS, RECORDED, recorded_results, redelivery_result


def test_html_report_is_self_contained_with_a_timeline_per_run() -> None:
    page = html_report.render_html(recorded_results())

    assert page.startswith("<!doctype html>") and page.rstrip().endswith("</html>")
    assert page.count("<svg xmlns=") == 2  # one timeline per run
    for fetch in ("src=", "href=", "url(", "@import", "<script"):
        assert fetch not in page  # nothing to load: it opens offline, from a CI artefact or an email
    assert "scheduler crashed at 21 s" in page
    assert "IntegrityError: UNIQUE constraint failed" in page
    assert "Expected: 1 callback per try and 1 email per try." in page
    assert page.count("(expected 1 per try)") == 2 * 2 * 2  # 2 runs x tries 1-2 x (callbacks, emails)
    assert "bug reproduced (crash)" in page and "OK: converged as expected" in page
    # every callback and email is one mark with its time; every state a coloured span of its lane
    assert page.count("on_retry_callback for try 1 at") == 2
    assert page.count("email for try") == 3
    assert "on_failure_callback for try 2 at 30.0 s" in page
    assert "try 2: up_for_retry from 16 s to 18 s" in page


def test_html_report_shows_each_duplicate_mark_and_flags_the_count() -> None:
    stock = recorded_results()[1]
    stock.label, stock.fix_enabled = "stock", False
    stock.needed_fixes, stock.reproduced = dict(DUPLICATES_NEEDS), True
    stock.dags[CB].callbacks[1]["on_retry_callback"] = 2
    stock.marks.append(result.Mark(19.0, CB, 1, "on_retry_callback"))

    page = html_report.render_html([stock])

    assert page.count("on_retry_callback for try 1 at") == 2
    assert '<td class="off">retry x2 (expected 1 per try)</td>' in page
    assert "bug reproduced (duplicates)" in page
    assert page.count("2 callbacks (expected 1)") == 1  # try 1's lane says it; try 2's does not


def test_html_report_keeps_two_callbacks_of_different_kinds_apart() -> None:
    """Before 3.3.1 a try gets a retry and a failure callback in the same pass: two marks, not one."""
    stock = recorded_results()[1]
    stock.label, stock.fix_enabled = "stock", False
    stock.marks = [
        result.Mark(17.0, CB, 1, result.RETRY_CALLBACK),
        result.Mark(17.0, CB, 1, result.FAILURE_CALLBACK),
    ]

    svg = html_report._marks_svg(stock.marks, CB, 1, 100, lambda seconds: seconds)
    page = html_report.render_html([stock])

    triangles = [part for part in svg if part.startswith("<path")]
    assert len(triangles) == 2 and triangles[0].split('"')[1] != triangles[1].split('"')[1]
    assert sum(part.startswith("<circle") for part in svg) == 1  # the second is ringed
    assert "2 callbacks (expected 1)" in page


def test_html_report_of_a_recorded_3_3_run_shows_the_duplicates() -> None:
    """``--json`` of ``bash scripts/demo.sh --airflow 3.3.2``: stock called each try back twice."""
    data = json.loads(RECORDED.read_text(encoding="utf-8"))
    results = [result.run_from_json(r) for r in data["runs"].values()]
    stock, fixed = results

    page = html_report.render_html(results)

    assert page.count("<svg xmlns=") == 2
    assert page.count('<td class="off">') == 2  # stock: retry x2 for try 1, failure x2 for try 2
    assert '<td class="off">retry x2 (expected 1 per try)</td>' in page
    assert '<td class="off">failure x2 (expected 1 per try)</td>' in page
    for run_result in results:
        for mark in run_result.marks:
            assert f"for try {mark.try_number} at {mark.seconds:.1f} s" in page
    assert len([m for m in stock.marks if m.kind != result.EMAIL]) == 4
    assert page.count("2 callbacks (expected 1)") == 2  # stock's two lanes; none of fixed's
    assert len([m for m in fixed.marks if m.kind != result.EMAIL]) == 2
    assert "scheduler crashed" not in page


def test_html_report_of_a_redelivery_has_one_lane_per_try_of_its_dag() -> None:
    page = html_report.render_html([redelivery_result(fixed=False), redelivery_result()])
    assert page.count(">redelivered_task</text>") == 2  # the Dag's label, once per run
    assert CB not in page
    assert "Redis redelivers it meanwhile with an expired token" in page
