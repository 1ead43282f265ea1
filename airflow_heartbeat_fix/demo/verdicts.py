"""
What a run's result means: which bug stock should show on this Airflow, whether it did, what the fixed
run got wrong, and the same judgements as the words both reports print. Pure: results in, verdicts out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_heartbeat_fix.demo.alerts import lost_runs
from airflow_heartbeat_fix.demo.result import (
    CALLBACK_DAG_ID,
    DAG_IDS,
    KILL_DAG_PROCESSOR_SCENARIO,
    KILLED_RUNS,
    MANY_DAG_ID,
    MANY_SCENARIO,
    REDELIVERY_DAG_ID,
    REDELIVERY_SCENARIO,
    RETRY_CALLBACK,
    TERMINAL_RUN_STATES,
    DagOutcome,
    RunResult,
    find_try,
    total_callbacks,
)
from airflow_heartbeat_fix.detection import (
    CLAIMED_FIX,
    HEARTBEAT_EVENTS_FIX,
    NESTED_FIX,
    PURGE_FIX,
    SINK_FIX,
    FixState,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

CRASH = "crash"
DUPLICATES = "duplicates"
#: ``--scenario kill-dag-processor``: failure callbacks the killed Dag processor had fetched never run.
LOST = "lost callbacks"
#: ``--scenario redelivery``: the live try failed (a retry callback, its worker killed).
LIVE_TRY_FAILED = "live try failed"
#: What a correct scheduler does for each finished try: one callback, one email.
EXPECTED_PER_TRY = "expected 1 per try"


def expected_stock_bug(needed_fixes: Mapping[str, str], scenario: str = "hung") -> str | None:
    """
    Which bug stock Airflow shows in this demo, from what the package's detection says it needs.

    ``needed_fixes`` maps each fix to its state with the fixes enabled. Where the heartbeat purge does
    not converge, the same try is called back again (duplicates); where it does converge but the callback
    sink still commits the scheduler's session, the retry of the detached task instance crashes the loop.
    ``--scenario redelivery``: the redelivered copy's FAILED fails the live try; where the purge converges
    but the sink still commits the scheduler's session (the releases that archive each try), that try's
    retry crashes the loop instead. ``--scenario kill-dag-processor``: the callbacks a killed Dag
    processor had fetched are lost wherever the fetch deletes them.
    """
    active = FixState.ACTIVE.value
    if scenario == KILL_DAG_PROCESSOR_SCENARIO:
        return LOST if needed_fixes.get(CLAIMED_FIX) == active else None
    if scenario == REDELIVERY_SCENARIO:
        if needed_fixes.get(HEARTBEAT_EVENTS_FIX) != active:
            return None
        crashes = needed_fixes.get(PURGE_FIX) != active and needed_fixes.get(SINK_FIX) == active
        return CRASH if crashes else LIVE_TRY_FAILED
    if needed_fixes.get(PURGE_FIX) == active:
        return DUPLICATES
    if needed_fixes.get(SINK_FIX) == active:
        return CRASH
    return None


def expected_bug(result: RunResult) -> str | None:
    """:func:`expected_stock_bug` of a run's probe and scenario."""
    return expected_stock_bug(result.needed_fixes, result.scenario)


#: What each bug looks like in the demo, said before it starts.
STOCK_BUG_WORDS = {
    DUPLICATES: "duplicate callbacks: the scheduler calls each heartbeat-timed-out try back at every scan "
    "until it leaves running (2 or more per try; before 3.3.1 of the wrong kind)",
    CRASH: "a scheduler crash: the callback sink ends the scheduler's session, and the timed-out try's "
    "retry then fails on a UNIQUE constraint",
    LOST: "lost callbacks: the failure alerts the killed Dag processor had fetched never run, and nothing "
    "says so",
    LIVE_TRY_FAILED: "the live try failed: the refused copy's FAILED fails the try that is running (a retry "
    "callback, its worker SIGKILLed at its next heartbeat)",
}
#: ``--scenario redelivery`` where the sink still ends the scheduler's session.
REDELIVERY_CRASH_WORDS = (
    "a scheduler crash: the refused copy's FAILED fails the live try, whose retry then fails on a UNIQUE "
    "constraint (a false retry callback at each restart)"
)
#: ``--listener``: the audit listener's Variable read ends the loop's session first.
LISTENER_CRASH_WORDS = (
    "a scheduler crash (DetachedInstanceError) as it starts the first Dag run: the listener's own "
    "session ends the scheduler's"
)
#: What the fixed run must show, whatever stock shows: by scenario, else the hung tries'.
FIXED_WORDS = "one callback of the right kind per try"
FIXED_WORDS_OF_SCENARIO = {
    REDELIVERY_SCENARIO: "the try succeeds in its first try, with no callback",
    KILL_DAG_PROCESSOR_SCENARIO: "each failure alert finished once",
}


def expectation_notice(
    needed_fixes: Mapping[str, str], *, listener: bool = False, scenario: str = "hung"
) -> str:
    """Which bug stock should show here and what the fixed run should do instead: said before it starts."""
    if listener and needed_fixes.get(NESTED_FIX) == FixState.ACTIVE.value:
        stock = LISTENER_CRASH_WORDS
    elif (bug := expected_stock_bug(needed_fixes, scenario)) is None:
        stock = "no bug of this demo's (this Airflow has it fixed upstream)"
    elif bug == CRASH and scenario == REDELIVERY_SCENARIO:
        stock = REDELIVERY_CRASH_WORDS
    else:
        stock = STOCK_BUG_WORDS[bug]
    return f"stock should show {stock}; fixed, {FIXED_WORDS_OF_SCENARIO.get(scenario, FIXED_WORDS)}"


def killed_dag_processor_problems(result: RunResult) -> list[str]:
    """Each Dag run failed, and its failure alert finished exactly once (the interrupted one ran again)."""
    problems = []
    for run_id in KILLED_RUNS:
        state, done = result.killed_runs.get(run_id), result.dag_callbacks_done.get(run_id, 0)
        if state != "failed":
            problems.append(f"Dag run {run_id} is {state or 'missing'}, expected failed")
        elif done != 1:
            problems.append(f"Dag run {run_id}: its failure alert finished {done} times, expected once")
    if not any(line.startswith("SIGKILL") for line in result.injected):
        problems.append("the Dag processor was never killed: nothing was tested")
    return problems


def all_runs_terminal(dags: Mapping[str, DagOutcome]) -> bool:
    return bool(dags) and all(d.run_state in TERMINAL_RUN_STATES for d in dags.values())


def duplicate_tries(outcome: DagOutcome) -> list[int]:
    """Tries that got more than one callback, or more than one email."""
    dup = {t for t in outcome.callbacks if total_callbacks(outcome, t) > 1}
    dup |= {t for t, n in outcome.emails.items() if n > 1}
    return sorted(dup)


def failed_tries(outcome: DagOutcome) -> int:
    """How many of ``outcome``'s tries ended failed (the mapped Dag: one try per task instance)."""
    return sum(1 for t in outcome.tries if t.state == "failed")


def many_problems(outcome: DagOutcome | None, expected: int) -> list[str]:
    """What a correct scheduler pair must do with the fifty hung task instances of ``--scenario many``."""
    if outcome is None:
        return [f"{MANY_DAG_ID}: no Dag run"]
    problems = []
    failed = failed_tries(outcome)
    if failed != expected:
        problems.append(f"{MANY_DAG_ID}: {failed} of {expected} task instances failed")
    wrong = [i for i in range(expected) if outcome.per_map_index.get(i, 0) != 1]
    if wrong:
        problems.append(f"{MANY_DAG_ID}: {len(wrong)} task instances without exactly one callback")
    return problems


def _hung_dag_problems(result: RunResult) -> list[str]:
    """Each reproduction Dag must have failed its first try and created the second."""
    problems: list[str] = []
    for dag_id in DAG_IDS:
        outcome = result.dags.get(dag_id)
        if outcome is None:
            problems.append(f"{dag_id}: no Dag run")
            continue
        first = find_try(outcome, 1)
        if first is None or first.state != "failed":
            problems.append(f"{dag_id}: try 1 is {first.state if first else 'missing'}, expected failed")
        if find_try(outcome, 2) is None:
            problems.append(f"{dag_id}: try 2 was not created")
    return problems


def _callback_problems(outcome: DagOutcome, emails_via_backend: bool) -> list[str]:
    """The callback Dag's tries must each get exactly one callback (and one email, where counted)."""
    problems = [
        f"{CALLBACK_DAG_ID}: duplicate callbacks/emails for try {try_number}"
        for try_number in duplicate_tries(outcome)
    ]
    if outcome.callbacks.get(1, {}).get(RETRY_CALLBACK, 0) != 1:
        problems.append(f"{CALLBACK_DAG_ID}: try 1 did not get exactly one {RETRY_CALLBACK}")
    second = find_try(outcome, 2)
    if second is not None and second.state == "failed" and total_callbacks(outcome, 2) != 1:
        problems.append(f"{CALLBACK_DAG_ID}: failed try 2 did not get exactly one callback")
    if emails_via_backend and outcome.emails.get(1, 0) != 1:
        problems.append(f"{CALLBACK_DAG_ID}: try 1 did not get exactly one email")
    return problems


def redelivery_problems(result: RunResult) -> list[str]:
    """``--scenario redelivery``: a redelivered copy was refused and set aside; the live try succeeded."""
    outcome = result.dags.get(REDELIVERY_DAG_ID)
    if outcome is None:
        return [f"{REDELIVERY_DAG_ID}: no Dag run"]
    problems = []
    if result.events_set_aside < 1:
        problems.append("no executor event was set aside: no redelivered copy was refused (yet)")
    first = find_try(outcome, 1)
    if first is None or first.state != "success" or find_try(outcome, 2) is not None:
        tries = ", ".join(f"try {t.try_number} {t.state}" for t in outcome.tries) or "no try"
        problems.append(f"{REDELIVERY_DAG_ID}: {tries}; expected try 1 success and no try 2")
    if any(outcome.callbacks.values()):
        problems.append(f"{REDELIVERY_DAG_ID}: callbacks {outcome.callbacks}, expected none")
    return problems


def fixed_problems(result: RunResult) -> list[str]:
    """What the fixed run got wrong; empty when it converged as expected."""
    problems: list[str] = []
    if result.scheduler.crashed or not result.scheduler.alive:
        problems.append(f"scheduler did not survive: {result.scheduler.error or 'exited'}")
    if result.scenario == KILL_DAG_PROCESSOR_SCENARIO:
        problems += killed_dag_processor_problems(result)
    elif result.scenario == REDELIVERY_SCENARIO:
        problems += redelivery_problems(result)
    else:
        problems += _hung_dag_problems(result)
        outcome = result.dags.get(CALLBACK_DAG_ID)
        if outcome is not None:
            problems += _callback_problems(outcome, result.emails_via_backend)
        if result.scenario == MANY_SCENARIO:
            problems += many_problems(result.dags.get(MANY_DAG_ID), result.many_expected)
    if not result.converged:
        problems.append(f"did not converge: {result.stop_reason}")
    if result.leftover_pids:
        problems.append(f"processes left running: {result.leftover_pids}")
    return problems


def callbacks_complete(dags: Mapping[str, DagOutcome], emails_via_backend: bool) -> bool:
    """Whether every finished try of the callback Dag has its callback (and email, where counted)."""
    outcome = dags.get(CALLBACK_DAG_ID)
    if outcome is None:
        return True
    for row in outcome.tries:
        if row.state != "failed":
            continue
        if total_callbacks(outcome, row.try_number) < 1:
            return False
        if emails_via_backend and outcome.emails.get(row.try_number, 0) < 1:
            return False
    return True


def stock_reproduced(result: RunResult) -> bool | None:
    """Whether the stock run shows the bug this Airflow has (None: detection says it needs no fix)."""
    bug = expected_bug(result)
    if bug == LOST:
        return bool(lost_runs(result.killed_runs, result.dag_callbacks_done))
    if bug == CRASH:
        return result.scheduler.crashed
    if bug == LIVE_TRY_FAILED:
        outcome = result.dags.get(REDELIVERY_DAG_ID)
        first = find_try(outcome, 1) if outcome else None
        failed = first is not None and first.state not in ("running", "success")
        return failed or result.running_tries_failed_by_event > 0
    if bug == DUPLICATES:
        outcome = result.dags.get(CALLBACK_DAG_ID)
        return bool(outcome and duplicate_tries(outcome))
    return None


# --- the same judgements in words, for the text table and the HTML report --------------------------


def verdict_cell(result: RunResult) -> str:
    if not result.fix_enabled:
        bug = expected_bug(result)
        if result.reproduced is None:
            return "no known bug in this version"
        if bug == LOST:
            lost = lost_runs(result.killed_runs, result.dag_callbacks_done)
            failed = sum(1 for state in result.killed_runs.values() if state == "failed")
            return (
                f"bug reproduced ({bug}: {len(lost)} of {failed} failure alerts never ran)"
                if lost
                else (f"bug NOT reproduced ({bug} expected)")
            )
        return f"bug reproduced ({bug})" if result.reproduced else f"bug NOT reproduced ({bug} expected)"
    return (
        "OK: converged as expected" if not result.problems else f"FAILED: {len(result.problems)} problem(s)"
    )


def callbacks_cell(per_kind: Mapping[str, int]) -> str:
    """``retry x1 (expected 1 per try)``: each kind's count, short names, and what is expected."""
    counts = ", ".join(f"{_short(kind)} x{n}" for kind, n in sorted(per_kind.items())) or "0"
    return f"{counts} ({EXPECTED_PER_TRY})"


def _short(kind: str) -> str:
    return kind.removeprefix("on_").removesuffix("_callback")


def emails_cell(count: int, via_backend: bool) -> str:
    if not via_backend:
        return f"{count} (not counted on this Airflow)"
    return f"{count} ({EXPECTED_PER_TRY})"


def many_summary(outcome: DagOutcome, expected: int) -> str:
    """``50/50 failed; callbacks: 50 x1, 0 x2+, 0 none``: the mapped Dag's task instances in one line."""
    failed = failed_tries(outcome)
    counts = [outcome.per_map_index.get(i, 0) for i in range(expected)]
    once, more, none = counts.count(1), sum(1 for n in counts if n > 1), counts.count(0)
    return f"{failed}/{expected} failed; callbacks: {once} x1, {more} x2+, {none} none ({EXPECTED_PER_TRY})"
