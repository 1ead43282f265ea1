"""What the demo tests share: the Dag ids, recorded results, and the Celery topology they use."""

from __future__ import annotations

from pathlib import Path

from airflow_heartbeat_fix.demo import result, topology
from airflow_heartbeat_fix.demo.result import DagOutcome, RunResult, SchedulerOutcome, TryRow
from airflow_heartbeat_fix.detection import HEARTBEAT_EVENTS_FIX, PURGE_FIX, SINK_FIX, FixState

CB = result.CALLBACK_DAG_ID


RETRY = result.RETRY_DAG_ID


ACTIVE, NOT_NEEDED = FixState.ACTIVE.value, FixState.NOT_NEEDED.value


UNSUPPORTED = FixState.UNSUPPORTED.value


CRASH_NEEDS = {SINK_FIX: ACTIVE, PURGE_FIX: NOT_NEEDED}


DUPLICATES_NEEDS = {SINK_FIX: ACTIVE, PURGE_FIX: ACTIVE}


def converged_result(version: str = "3.4.0b2", **changes: object) -> RunResult:
    tries = [TryRow("stall", 1, "failed", "archived", "retry"), TryRow("stall", 2, "failed", "current")]
    result = RunResult(
        label="fixed",
        fix_enabled=True,
        airflow_version=version,
        database="sqlite",
        home="/demo/fixed",
        dags={
            RETRY: DagOutcome(RETRY, "failed", list(tries)),
            CB: DagOutcome(
                CB,
                "failed",
                list(tries),
                callbacks={1: {"on_retry_callback": 1}, 2: {"on_failure_callback": 1}},
                emails={1: 1, 2: 1},
            ),
        },
        converged=True,
        converge_seconds=27.0,
        elapsed_seconds=70.0,
        stop_reason="Dag runs finished, callbacks settled",
        needed_fixes=dict(CRASH_NEEDS),
    )
    for name, value in changes.items():
        setattr(result, name, value)
    return result


PG = "postgresql+psycopg://u:p@h/db"


CELERY = topology.Topology(executor=topology.CELERY, schedulers=2, broker_url="redis://127.0.0.1:6389/0")


SCHEDULER_LOGS = {
    # 3.1 logs the task instance without its id; later releases add it: both end with the Celery task id.
    "scheduler-1": "Setting external_executor_id for <TaskInstance: x.stall run [queued]> to c-1 [airflow]\n",
    "scheduler-2": "Setting external_executor_id for TaskInstance(id=ti-b, dag_id=y) to c-2\n",
    "celery-worker-1": "Task execute_workload[c-2] received\n",
    "celery-worker-2": "Task execute_workload[c-1] received\n",
}


def recorded_results() -> list[RunResult]:
    """A stock 3.4.0b2 run that crashed and a fixed one that converged, as the demo records them."""
    stock = converged_result(
        label="stock",
        fix_enabled=False,
        scheduler=SchedulerOutcome(crashed=True, error="IntegrityError: UNIQUE constraint failed"),
        converged=False,
        converge_seconds=None,
        reproduced=True,
        crashed_after=21.0,
        watched_seconds=27.0,
    )
    for dag_id in (RETRY, CB):
        stock.dags[dag_id].tries = [TryRow("stall", 1, "running", "current")]
        stock.dags[dag_id].run_state = "running"
        stock.timeline += [
            result.StateChange(0.5, dag_id, 1, "queued"),
            result.StateChange(2.0, dag_id, 1, "running"),
        ]
    stock.dags[CB].callbacks = {1: {"on_retry_callback": 1}}
    stock.dags[CB].emails = {1: 1}
    stock.marks = [result.Mark(22.0, CB, 1, "on_retry_callback"), result.Mark(22.5, CB, 1, result.EMAIL)]
    fixed = converged_result(watched_seconds=40.0)
    for dag_id in (RETRY, CB):
        fixed.timeline += [
            result.StateChange(1.0, dag_id, 1, "running"),
            result.StateChange(16.0, dag_id, 1, "failed"),
            result.StateChange(16.0, dag_id, 2, "up_for_retry"),
            result.StateChange(18.0, dag_id, 2, "running"),
            result.StateChange(29.0, dag_id, 2, "failed"),
        ]
    fixed.marks = [
        result.Mark(17.0, CB, 1, "on_retry_callback"),
        result.Mark(17.2, CB, 1, result.EMAIL),
        result.Mark(30.0, CB, 2, "on_failure_callback"),
        result.Mark(30.1, CB, 2, result.EMAIL),
    ]
    return [stock, fixed]


#: The checkout (tests/demo/ is two levels below it).
ROOT = Path(__file__).resolve().parents[2]
RECORDED = ROOT / "tests" / "data" / "demo-3.3.2-sqlite.json"


REDELIVERED = result.REDELIVERY_DAG_ID


def redelivery_result(*, fixed: bool = True, version: str = "3.3.2", **changes: object) -> RunResult:
    """``--scenario redelivery``: fixed, the live try succeeded with one event set aside; stock, it was failed
    (a retry callback, try 2 failed by the next redelivery)."""
    if fixed:
        outcome = DagOutcome(REDELIVERED, "success", [TryRow("work", 1, "success", "current")])
    else:
        tries = [TryRow("work", 1, "failed", "history"), TryRow("work", 2, "failed", "current")]
        callbacks = {1: {"on_retry_callback": 1}, 2: {"on_failure_callback": 1}}
        outcome = DagOutcome(REDELIVERED, "failed", tries, callbacks=callbacks)
    run = RunResult(
        label="fixed" if fixed else "stock",
        fix_enabled=fixed,
        airflow_version=version,
        database="postgresql",
        home="/demo/x",
        topology="CeleryExecutor, 2 schedulers, 2 Celery workers, redelivery",
        scenario=result.REDELIVERY_SCENARIO,
        dags={REDELIVERED: outcome},
        converged=True,
        stop_reason="Dag runs finished, callbacks settled",
        needed_fixes={SINK_FIX: ACTIVE, PURGE_FIX: ACTIVE, HEARTBEAT_EVENTS_FIX: ACTIVE},
        events_set_aside=1 if fixed else 0,
        running_tries_failed_by_event=0 if fixed else 2,
    )
    for name, value in changes.items():
        setattr(run, name, value)
    return run
