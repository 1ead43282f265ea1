"""Executors, schedulers, scenarios: what a run starts and when it kills."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import pytest

from airflow_heartbeat_fix.demo import result, topology
from tests.demo._results import CB, CELERY, PG, RETRY, SCHEDULER_LOGS

if TYPE_CHECKING:
    from pathlib import Path


@pytest.mark.parametrize(
    ("shape", "database", "refusal"),
    [
        (topology.Topology(), None, None),
        (CELERY, PG, None),
        (topology.Topology(schedulers=2), PG, None),
        (CELERY, None, "Airflow's CeleryExecutor cannot use SQLite"),
        (topology.Topology(schedulers=2), None, "SQLite allows only one scheduler"),
        (topology.Topology(executor=topology.CELERY), PG, "needs --broker-url"),
        (topology.Topology(schedulers=0), PG, "--schedulers takes 1 or more"),
    ],
)
def test_topology_refusal(shape: topology.Topology, database: str | None, refusal: str | None) -> None:
    found = topology.topology_refusal(shape, database)
    assert found == refusal if refusal is None else refusal in (found or "")


def test_executor_env_celery_uses_the_runs_queue_and_database_for_results() -> None:
    assert topology.executor_env(topology.Topology(), database_url=PG, queue="q") == {
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor"
    }
    env = topology.executor_env(CELERY, database_url=PG, queue="hbfix-demo-stock-1")
    assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    assert env["AIRFLOW__CELERY__BROKER_URL"] == "redis://127.0.0.1:6389/0"
    assert env["AIRFLOW__CELERY__RESULT_BACKEND"] == f"db+{PG}"
    assert env["AIRFLOW__OPERATORS__DEFAULT_QUEUE"] == "hbfix-demo-stock-1"


def test_component_commands_per_topology(tmp_path: Path) -> None:
    local = topology.component_commands(topology.Topology(), "airflow", port=1, home=tmp_path, queue="q")
    assert [name for name, _ in local] == ["api-server", "dag-processor", "scheduler"]
    celery = topology.component_commands(CELERY, "airflow", port=1, home=tmp_path, queue="q")
    names = [name for name, _ in celery]
    assert names == [
        "api-server",
        "dag-processor",
        "scheduler-1",
        "scheduler-2",
        "celery-worker-1",
        "celery-worker-2",
    ]
    assert [n for n in names if topology.is_scheduler(n)] == ["scheduler-1", "scheduler-2"]
    workers = [argv for name, argv in celery if name.startswith("celery-worker")]
    hostnames = {argv[argv.index("--celery-hostname") + 1] for argv in workers}
    pid_files = {argv[argv.index("--pid") + 1] for argv in workers}
    assert len(hostnames) == len(pid_files) == 2
    assert all(argv[argv.index("--queues") + 1] == "q" and "--skip-serve-logs" in argv for argv in workers)
    assert CELERY.label == "CeleryExecutor, 2 schedulers, 2 Celery workers"
    assert topology.Topology().label == "LocalExecutor, 1 scheduler"


def test_kill_target_waits_until_both_first_tries_run() -> None:
    tis = [
        {"dag_id": CB, "try_number": 1, "state": "running", "id": "ti-a", "external_executor_id": "c-1"},
        {"dag_id": RETRY, "try_number": 1, "state": "queued", "id": "ti-b", "external_executor_id": "c-2"},
    ]
    assert topology.kill_target(topology.KILL_SCHEDULER, tis, SCHEDULER_LOGS) is None
    tis[1]["state"] = "running"
    assert topology.kill_target(topology.HUNG, tis, SCHEDULER_LOGS) is None
    assert topology.kill_target(topology.KILL_SCHEDULER, tis, SCHEDULER_LOGS) == "scheduler-1"
    assert topology.kill_target(topology.KILL_WORKER, tis, SCHEDULER_LOGS) == "celery-worker-2"


@pytest.mark.parametrize(
    ("shape", "refusal"),
    [
        (topology.Topology(scenario=topology.KILL_WORKER), "--scenario kill-worker needs --executor celery"),
        (dataclasses.replace(CELERY, schedulers=1, scenario=topology.KILL_SCHEDULER), "needs --schedulers 2"),
        (dataclasses.replace(CELERY, scenario=topology.KILL_SCHEDULER), None),
        (topology.Topology(scenario=topology.KILL_DAG_PROCESSOR), None),
    ],
)
def test_scenario_refusal(shape: topology.Topology, refusal: str | None) -> None:
    found = topology.topology_refusal(shape, PG)
    assert found == refusal if refusal is None else refusal in (found or "")


def test_many_scenario_deploys_the_mapped_dag_with_a_worker_slot_per_hung_try() -> None:
    many = dataclasses.replace(CELERY, scenario=topology.MANY)
    assert result.scenario_dag_ids(many.scenario) == (*result.DAG_IDS, result.MANY_DAG_ID)
    env = topology.executor_env(many, database_url=PG, queue="q")
    assert int(env["AIRFLOW__CELERY__WORKER_CONCURRENCY"]) * many.workers >= result.MANY_TASKS + 4
    assert int(env["AIRFLOW__CORE__PARALLELISM"]) >= result.MANY_TASKS + 4
    assert topology.kill_target(topology.MANY, [], {}) is None  # nothing is killed in this scenario


def test_duration_notice_gives_the_typical_time_and_the_bound() -> None:
    celery_kill = topology.Topology(executor=topology.CELERY, schedulers=2, scenario=topology.KILL_SCHEDULER)
    assert topology.duration_notice(topology.Topology(), 2, 120) == (
        "about 2 minutes (2 runs of about 65 s; at most about 5 minutes with --timeout 120 s)"
    )
    assert topology.duration_notice(celery_kill, 1, 300).startswith("about 3 minutes (1 run of about 180 s;")
    untimed = topology.Topology(executor=topology.LOCAL, scenario=topology.MANY)
    assert (
        topology.duration_notice(untimed, 2, 120) == "at most about 5 minutes (2 runs, --timeout 120 s each)"
    )


def test_kill_dag_processor_waits_for_every_failed_run_and_the_first_alert() -> None:
    """The Dag processor is killed once every run's failure callback was sent and one alert runs."""
    scenario, runs = topology.KILL_DAG_PROCESSOR, dict.fromkeys(result.KILLED_RUNS, "failed")
    assert result.scenario_dag_ids(scenario) == (result.KILLED_DAG_ID,)
    assert topology.kill_target(scenario, [], {}, runs=runs, alerts_started=0) is None
    assert (
        topology.kill_target(scenario, [], {}, runs={**runs, "incident-3": "running"}, alerts_started=1)
        is None
    )
    assert topology.kill_target(scenario, [], {}, runs=runs, alerts_started=1) == topology.DAG_PROCESSOR


def test_redelivery_scenario_deploys_its_own_dag_with_a_short_visibility_timeout_and_token() -> None:
    redelivery = dataclasses.replace(CELERY, scenario=topology.REDELIVERY)
    assert result.scenario_dag_ids(redelivery.scenario) == (result.REDELIVERY_DAG_ID,)
    env = topology.executor_env(redelivery, database_url=PG, queue="q")
    visibility = int(env["AIRFLOW__CELERY_BROKER_TRANSPORT_OPTIONS__VISIBILITY_TIMEOUT"])
    token_lifetime = int(env["AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT"])
    # kombu looks every 100 s: the copy comes at most visibility + 100 s in, while the task still runs.
    assert token_lifetime < visibility < visibility + 100 < result.REDELIVERY_TASK_SECONDS
    assert "VISIBILITY_TIMEOUT" not in str(topology.executor_env(CELERY, database_url=PG, queue="q"))
    assert topology.kill_target(topology.REDELIVERY, [], {}) is None
    local = topology.Topology(scenario=topology.REDELIVERY)
    assert "--scenario redelivery needs --executor celery" in (topology.topology_refusal(local, PG) or "")
