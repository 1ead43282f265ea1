"""The verdicts: which bug stock must show, and what a fixed run got wrong."""

from __future__ import annotations

import pytest

from airflow_heartbeat_fix.demo import logs, result, verdicts
from airflow_heartbeat_fix.demo.result import DagOutcome, SchedulerOutcome, TryRow
from airflow_heartbeat_fix.detection import CLAIMED_FIX, HEARTBEAT_EVENTS_FIX, NESTED_FIX, PURGE_FIX, SINK_FIX
from tests.demo._results import (
    ACTIVE,
    CB,
    CRASH_NEEDS,
    DUPLICATES_NEEDS,
    NOT_NEEDED,
    REDELIVERED,
    RETRY,
    UNSUPPORTED,
    converged_result,
    redelivery_result,
)


@pytest.mark.parametrize(
    ("needed", "bug"),
    [
        pytest.param(
            {SINK_FIX: ACTIVE, PURGE_FIX: NOT_NEEDED}, verdicts.CRASH, id="converged-purge-old-sink"
        ),
        pytest.param({SINK_FIX: ACTIVE, PURGE_FIX: ACTIVE}, verdicts.DUPLICATES, id="unconverged-purge"),
        pytest.param({SINK_FIX: NOT_NEEDED, PURGE_FIX: NOT_NEEDED}, None, id="both-upstream"),
        pytest.param({SINK_FIX: UNSUPPORTED, PURGE_FIX: UNSUPPORTED}, None, id="unrecognised"),
        pytest.param({}, None, id="not-probed"),
    ],
)
def test_expected_stock_bug_follows_detection(needed: dict[str, str], bug: str | None) -> None:
    assert verdicts.expected_stock_bug(needed) == bug


def test_fixed_run_that_converged_has_no_problems() -> None:
    assert verdicts.fixed_problems(converged_result()) == []


def test_fixed_problems_duplicates_crash_missing_retry_and_leftovers() -> None:
    result = converged_result(
        scheduler=SchedulerOutcome(crashed=True, error="UniqueViolation: ..."),
        converged=False,
        stop_reason="scheduler crashed",
        leftover_pids=[123],
    )
    result.dags[CB].callbacks[1]["on_retry_callback"] = 2
    result.dags[RETRY].tries = [TryRow("stall", 1, "running", "current")]
    problems = "\n".join(verdicts.fixed_problems(result))
    assert "scheduler did not survive: UniqueViolation" in problems
    assert f"{CB}: duplicate callbacks/emails for try 1" in problems
    assert f"{CB}: try 1 did not get exactly one on_retry_callback" in problems
    assert f"{RETRY}: try 1 is running, expected failed" in problems
    assert f"{RETRY}: try 2 was not created" in problems
    assert "did not converge: scheduler crashed" in problems
    assert "processes left running: [123]" in problems


def test_fixed_problems_email_only_counted_where_the_backend_is_used() -> None:
    result = converged_result(version="3.2.2", emails_via_backend=False)
    result.dags[CB].emails = {}
    assert verdicts.fixed_problems(result) == []
    result.emails_via_backend = True
    assert verdicts.fixed_problems(result) == [f"{CB}: try 1 did not get exactly one email"]


def test_callbacks_complete_waits_for_each_failed_try() -> None:
    result = converged_result()
    assert verdicts.callbacks_complete(result.dags, emails_via_backend=True)
    del result.dags[CB].emails[2]
    assert not verdicts.callbacks_complete(result.dags, emails_via_backend=True)
    assert verdicts.callbacks_complete(result.dags, emails_via_backend=False)  # no emails counted there
    del result.dags[CB].callbacks[2]
    assert not verdicts.callbacks_complete(result.dags, emails_via_backend=False)
    result.dags[CB].tries[1] = TryRow("stall", 2, "running", "current")
    assert verdicts.callbacks_complete(result.dags, emails_via_backend=False)


def test_stock_reproduced_crash_and_duplicates() -> None:
    crashed = converged_result(fix_enabled=False, scheduler=SchedulerOutcome(crashed=True))
    assert verdicts.stock_reproduced(crashed) is True
    assert verdicts.stock_reproduced(converged_result(fix_enabled=False)) is False
    duplicated = converged_result(version="3.3.2", fix_enabled=False, needed_fixes=DUPLICATES_NEEDS)
    assert verdicts.stock_reproduced(duplicated) is False
    duplicated.dags[CB].callbacks[2]["on_failure_callback"] = 2
    assert verdicts.stock_reproduced(duplicated) is True
    upstream = {SINK_FIX: NOT_NEEDED, PURGE_FIX: NOT_NEEDED}
    assert verdicts.stock_reproduced(converged_result(fix_enabled=False, needed_fixes=upstream)) is None


def test_many_scenario_counts_one_callback_per_map_index() -> None:
    lines = [{"dag_id": result.MANY_DAG_ID, "map_index": i, "try_number": 1} for i in (0, 1, 1)]
    per_index = logs.count_per_map_index([*lines, {"dag_id": CB, "try_number": 1}], result.MANY_DAG_ID)
    assert per_index == {0: 1, 1: 2}
    tries = [TryRow(f"stall[{i}]", 1, "failed", "current") for i in range(3)]
    outcome = DagOutcome(result.MANY_DAG_ID, "failed", tries, per_map_index=per_index)
    assert (
        verdicts.many_summary(outcome, 3) == "3/3 failed; callbacks: 1 x1, 1 x2+, 1 none (expected 1 per try)"
    )
    assert verdicts.many_problems(outcome, 3) == [
        f"{result.MANY_DAG_ID}: 2 task instances without exactly one callback"
    ]
    outcome.per_map_index = {0: 1, 1: 1, 2: 1}
    assert verdicts.many_problems(outcome, 3) == []
    assert verdicts.many_problems(None, 3) == [f"{result.MANY_DAG_ID}: no Dag run"]


def test_expectation_notice_names_the_bug_the_probe_expects() -> None:
    assert verdicts.expectation_notice(DUPLICATES_NEEDS).startswith("stock should show duplicate callbacks")
    assert verdicts.expectation_notice(CRASH_NEEDS).startswith("stock should show a scheduler crash")
    assert verdicts.expectation_notice({}).startswith("stock should show no bug of this demo's")
    with_listener = verdicts.expectation_notice({**DUPLICATES_NEEDS, NESTED_FIX: ACTIVE}, listener=True)
    assert with_listener.startswith("stock should show a scheduler crash (DetachedInstanceError)")


def _killed(
    *, fix_enabled: bool, done: dict[str, int], started: dict[str, int] | None = None
) -> result.RunResult:
    run = converged_result(fix_enabled=fix_enabled, needed_fixes={CLAIMED_FIX: ACTIVE})
    run.scenario = result.KILL_DAG_PROCESSOR_SCENARIO
    run.killed_runs = dict.fromkeys(result.KILLED_RUNS, "failed")
    run.dag_callbacks_done, run.dag_callbacks_started = done, started or done
    run.injected = ["SIGKILL dag-processor at 12 s", "restarted dag-processor as dag-processor-2"]
    return run


def test_kill_dag_processor_verdicts() -> None:
    once = dict.fromkeys(result.KILLED_RUNS, 1)
    lost = _killed(fix_enabled=False, done={}, started={"incident-1": 1})
    assert verdicts.expected_bug(lost) == verdicts.LOST
    lost.reproduced = verdicts.stock_reproduced(lost)
    assert lost.reproduced is True
    assert "3 of 3 failure alerts never ran" in verdicts.verdict_cell(lost)
    assert verdicts.stock_reproduced(_killed(fix_enabled=False, done=once)) is False
    rerun = _killed(fix_enabled=True, done=once, started={**once, "incident-1": 2})
    assert verdicts.fixed_problems(rerun) == []
    twice = _killed(fix_enabled=True, done={**once, "incident-2": 2})
    assert verdicts.fixed_problems(twice) == [
        "Dag run incident-2: its failure alert finished 2 times, expected once"
    ]
    missing = _killed(fix_enabled=True, done={"incident-1": 1})
    assert len(verdicts.fixed_problems(missing)) == 2
    notice = verdicts.expectation_notice({CLAIMED_FIX: ACTIVE}, scenario=result.KILL_DAG_PROCESSOR_SCENARIO)
    assert notice.startswith("stock should show lost callbacks")


@pytest.mark.parametrize(
    ("needed", "bug"),
    [
        pytest.param(
            {SINK_FIX: ACTIVE, PURGE_FIX: NOT_NEEDED, HEARTBEAT_EVENTS_FIX: ACTIVE},
            verdicts.CRASH,
            id="3.4: the retry crashes",
        ),
        pytest.param(
            {SINK_FIX: ACTIVE, PURGE_FIX: ACTIVE, HEARTBEAT_EVENTS_FIX: ACTIVE},
            verdicts.LIVE_TRY_FAILED,
            id="3.0-3.3: the live try fails",
        ),
        pytest.param(
            {SINK_FIX: NOT_NEEDED, PURGE_FIX: NOT_NEEDED, HEARTBEAT_EVENTS_FIX: ACTIVE},
            verdicts.LIVE_TRY_FAILED,
            id="sink fixed upstream: the live try fails",
        ),
        pytest.param(
            {SINK_FIX: ACTIVE, HEARTBEAT_EVENTS_FIX: NOT_NEEDED}, None, id="upstream reads the heartbeat"
        ),
    ],
)
def test_expected_stock_bug_of_a_redelivery(needed: dict[str, str], bug: str | None) -> None:
    assert verdicts.expected_stock_bug(needed, result.REDELIVERY_SCENARIO) == bug


def test_redelivery_fixed_run_lets_the_live_try_succeed() -> None:
    assert verdicts.fixed_problems(redelivery_result()) == []
    failed = redelivery_result(fixed=True)
    failed.dags[REDELIVERED] = redelivery_result(fixed=False).dags[REDELIVERED]
    problems = "\n".join(verdicts.fixed_problems(failed))
    assert f"{REDELIVERED}: try 1 failed, try 2 failed; expected try 1 success and no try 2" in problems
    assert "callbacks" in problems
    nothing_refused = redelivery_result(events_set_aside=0)
    assert verdicts.fixed_problems(nothing_refused) == [
        "no executor event was set aside: no redelivered copy was refused (yet)"
    ]


def test_redelivery_stock_run_reproduces_by_the_failed_live_try_or_the_crash() -> None:
    stock = redelivery_result(fixed=False)
    assert verdicts.stock_reproduced(stock) is True
    untouched = redelivery_result(
        fixed=False, needed_fixes=stock.needed_fixes, running_tries_failed_by_event=0
    )
    untouched.dags = redelivery_result().dags
    assert verdicts.stock_reproduced(untouched) is False
    crashed = redelivery_result(
        fixed=False,
        scheduler=SchedulerOutcome(crashed=True, error="UniqueViolation"),
        needed_fixes={SINK_FIX: ACTIVE, PURGE_FIX: NOT_NEEDED, HEARTBEAT_EVENTS_FIX: ACTIVE},
    )
    assert verdicts.stock_reproduced(crashed) is True
    crashed.reproduced = True
    assert verdicts.verdict_cell(crashed) == "bug reproduced (crash)"


def test_expectation_notice_of_a_redelivery_names_the_live_try() -> None:
    needed = {SINK_FIX: ACTIVE, PURGE_FIX: ACTIVE, HEARTBEAT_EVENTS_FIX: ACTIVE}
    notice = verdicts.expectation_notice(needed, scenario=result.REDELIVERY_SCENARIO)
    assert notice.startswith("stock should show the live try failed")
    assert notice.endswith("fixed, the try succeeds in its first try, with no callback")
    crash = {**needed, PURGE_FIX: NOT_NEEDED}
    assert "a scheduler crash" in verdicts.expectation_notice(crash, scenario=result.REDELIVERY_SCENARIO)
