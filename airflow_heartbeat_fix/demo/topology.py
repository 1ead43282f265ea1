"""
Where one demo run runs: the database kind, the executor, how many schedulers and Celery workers, and
the scenario (hung tries, plus a SIGKILL or fifty more hung tries). Pure decisions only; :mod:`.run`
starts what they name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_heartbeat_fix.demo.logs import scheduler_owning, worker_owning
from airflow_heartbeat_fix.demo.result import (
    CALLBACK_DAG_ID,
    DAG_IDS,
    KILL_DAG_PROCESSOR_SCENARIO,
    KILLED_RUNS,
    MANY_SCENARIO,
    MANY_TASKS,
    REDELIVERY_SCENARIO,
    state_name,
)

if TYPE_CHECKING:
    from pathlib import Path

SQLITE = "sqlite"
LOCAL, CELERY = "local", "celery"
#: ``--executor`` -> ``[core] executor``.
EXECUTORS = {LOCAL: "LocalExecutor", CELERY: "CeleryExecutor"}
#: ``--scenario``: what happens besides the frozen supervisors. The kills come once both Dags' first
#: tries run (frozen), and hit the component that owns the callback Dag's first try. ``redelivery`` runs
#: its own Dag instead: a live task, not a hung one.
HUNG, KILL_SCHEDULER, KILL_WORKER, MANY = "hung", "kill-scheduler", "kill-worker", MANY_SCENARIO
KILL_DAG_PROCESSOR = KILL_DAG_PROCESSOR_SCENARIO
REDELIVERY = REDELIVERY_SCENARIO
SCENARIOS = {
    HUNG: "the tasks freeze their own supervisor (default)",
    KILL_SCHEDULER: "hung, then the scheduler that queued them is SIGKILLed; the other must adopt them",
    KILL_WORKER: "hung, then the Celery worker running them is SIGKILLed (the OOM-kill case)",
    MANY: f"hung, plus {MANY_TASKS} mapped task instances that freeze at once",
    KILL_DAG_PROCESSOR: f"{len(KILLED_RUNS)} Dag runs fail at once; the Dag processor is SIGKILLed while "
    "their failure alerts run, then restarted (any executor)",
    REDELIVERY: "instead of the hung tasks, a live task that Redis redelivers with an expired token; the "
    "refused copy's FAILED must not fail the running try",
}
#: ``--scenario redelivery``: Redis redelivers an unacknowledged message after this many seconds, and the
#: redelivered copy's workload token (it lives ``[scheduler] task_queued_timeout``) has expired by then.
#: At the defaults (86,400 s and 600 s) every redelivery carries an expired token; shortened to see one.
REDELIVERY_ENV = {
    "AIRFLOW__CELERY_BROKER_TRANSPORT_OPTIONS__VISIBILITY_TIMEOUT": "20",
    "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT": "10",
    "AIRFLOW__API_AUTH__JWT_LEEWAY": "0",
}
KILLS = (KILL_SCHEDULER, KILL_WORKER, KILL_DAG_PROCESSOR)
#: The Dag processor's component name (:func:`component_commands`); a restarted one is ``dag-processor-2``.
DAG_PROCESSOR = "dag-processor"
#: About how long one run takes, start to stop, by executor and scenario: the runs of tests/e2e/
#: TOPOLOGIES.md and docs/demo.md on 2 cores (LocalExecutor hung: 63-64 s on 3.3.2; Celery: 75-90 s
#: hung, 110-260 s with a killed scheduler, 115-175 s with a killed worker, 260-320 s for many).
TYPICAL_RUN_SECONDS = {
    (LOCAL, HUNG): 65,
    (CELERY, HUNG): 90,
    (CELERY, KILL_SCHEDULER): 180,
    (CELERY, KILL_WORKER): 150,
    (CELERY, MANY): 290,
    (LOCAL, KILL_DAG_PROCESSOR): 70,
    (CELERY, REDELIVERY): 200,
}
#: Before the trigger (database, components, Dag parse) and after the runs settle (stopping them).
SETUP_SECONDS = 30


@dataclass(frozen=True)
class Topology:
    """Which executor and how many schedulers one run starts (Celery: ``workers`` workers on Redis)."""

    executor: str = LOCAL
    schedulers: int = 1
    broker_url: str | None = None
    workers: int = 2
    #: A frozen try holds its worker slot for good: 4 tries in all, on one worker if the other is killed.
    worker_concurrency: int = 4
    scenario: str = HUNG

    @property
    def slots_per_worker(self) -> int:
        """``worker_concurrency``; for ``--scenario many`` room for every mapped try and the four others."""
        if self.scenario != MANY:
            return self.worker_concurrency
        return -(-(MANY_TASKS + 4) // self.workers) + 1

    @property
    def label(self) -> str:
        parts = [EXECUTORS[self.executor], f"{self.schedulers} scheduler{'s' * (self.schedulers > 1)}"]
        if self.executor == CELERY:
            parts.append(f"{self.workers} Celery workers")
        if self.scenario != HUNG:
            parts.append(self.scenario)
        return ", ".join(parts)


def db_label(database: str | None) -> str:
    if not database:
        return SQLITE
    return database.split(":", 1)[0].split("+", 1)[0]


def topology_refusal(topology: Topology, database: str | None) -> str | None:
    """Why the demo cannot run this topology on this database, or None."""
    if topology.executor not in EXECUTORS:
        return f"--executor takes one of {', '.join(EXECUTORS)}"
    if topology.schedulers < 1:
        return "--schedulers takes 1 or more"
    if db_label(database) == SQLITE and topology.executor == CELERY:
        return "--executor celery needs a PostgreSQL --database: Airflow's CeleryExecutor cannot use SQLite"
    if db_label(database) == SQLITE and topology.schedulers > 1:
        return "--schedulers 2 or more needs a PostgreSQL --database: SQLite allows only one scheduler"
    if topology.executor == CELERY and not topology.broker_url:
        return (
            "--executor celery needs --broker-url redis://HOST:PORT/DB of a Redis you run "
            "(from a checkout of this project, scripts/redis.sh start starts one and prints its URL)"
        )
    if topology.executor != CELERY and topology.broker_url:
        return "--broker-url is for --executor celery"
    if topology.scenario not in SCENARIOS:
        return f"--scenario takes one of {', '.join(SCENARIOS)}"
    if topology.scenario not in (HUNG, KILL_DAG_PROCESSOR) and topology.executor != CELERY:
        return f"--scenario {topology.scenario} needs --executor celery"
    if topology.scenario == KILL_SCHEDULER and topology.schedulers < 2:
        return "--scenario kill-scheduler needs --schedulers 2 or more (one must survive to adopt)"
    return None


def executor_env(topology: Topology, *, database_url: str, queue: str) -> dict[str, str]:
    """
    What :func:`~.environment.airflow_process_env` adds for ``topology``. Celery: the run's own queue,
    so a worker never takes a task another run (or an earlier demo) left in the broker; results in the
    run's metadata database.
    """
    env = {"AIRFLOW__CORE__EXECUTOR": EXECUTORS[topology.executor]}
    if topology.executor == CELERY:
        assert topology.broker_url is not None
        env.update(
            {
                "AIRFLOW__CELERY__BROKER_URL": topology.broker_url,
                "AIRFLOW__CELERY__RESULT_BACKEND": f"db+{database_url}",
                "AIRFLOW__CELERY__WORKER_CONCURRENCY": str(topology.slots_per_worker),
                "AIRFLOW__OPERATORS__DEFAULT_QUEUE": queue,
            }
        )
    if topology.scenario == MANY:
        # Every hung try holds a running slot: room for all of them at once, on each scheduler.
        env["AIRFLOW__CORE__PARALLELISM"] = str(2 * MANY_TASKS)
    if topology.scenario == KILL_SCHEDULER:
        # The survivor looks for a dead scheduler's tasks every 10 s instead of every 5 minutes.
        env["AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL"] = "10"
    if topology.scenario == REDELIVERY:
        env.update(REDELIVERY_ENV)
    return env


def component_commands(
    topology: Topology, airflow: str, *, port: int, home: Path, queue: str
) -> list[tuple[str, list[str]]]:
    """``(name, argv)`` of every long-running component; schedulers are named ``scheduler*``."""
    api = [airflow, "api-server", "--apps", "execution", "-H", "127.0.0.1", "-p", str(port), "-w", "1"]
    commands = [("api-server", api), (DAG_PROCESSOR, [airflow, "dag-processor"])]
    scheduler = [airflow, "scheduler", "--skip-serve-logs"]
    if topology.schedulers == 1:
        commands.append(("scheduler", scheduler))
    else:
        commands += [(f"scheduler-{n}", scheduler) for n in range(1, topology.schedulers + 1)]
    if topology.executor == CELERY:
        for n in range(1, topology.workers + 1):
            worker = [airflow, "celery", "worker", "--queues", queue]
            worker += ["--concurrency", str(topology.slots_per_worker), "--skip-serve-logs"]
            # Distinct hostnames and pid files: two workers on one machine and one AIRFLOW_HOME.
            worker += ["--celery-hostname", f"worker{n}@{queue}", "--pid", str(home / f"worker-{n}.pid")]
            commands.append((f"celery-worker-{n}", worker))
    return commands


def is_scheduler(name: str) -> bool:
    return name.startswith("scheduler")


def is_celery_worker(name: str) -> bool:
    return name.startswith("celery-worker")


def kill_target(
    scenario: str,
    tis: list[dict[str, Any]],
    logs: dict[str, str],
    *,
    runs: dict[str, str | None] | None = None,
    alerts_started: int = 0,
) -> str | None:
    """
    The component to SIGKILL now, or None: once both Dags' first tries run, the scheduler that sent the
    callback Dag's try to Celery (it logged that try's external executor id) or the worker that received it.
    ``kill-dag-processor``: the Dag processor, once every Dag run of ``runs`` (run id -> state) has failed
    (all their failure callbacks were sent) and the first alert has started (``alerts_started``).
    """
    if scenario not in KILLS:
        return None
    if scenario == KILL_DAG_PROCESSOR:
        failed = [state for state in (runs or {}).values() if state == "failed"]
        return DAG_PROCESSOR if len(failed) >= len(KILLED_RUNS) and alerts_started > 0 else None
    first = {str(r["dag_id"]): r for r in tis if r.get("try_number") == 1}
    if any(state_name(first.get(d, {}).get("state")) != "running" for d in DAG_IDS):
        return None
    celery_task_id = str(first[CALLBACK_DAG_ID].get("external_executor_id") or "")
    if scenario == KILL_SCHEDULER:
        return scheduler_owning(logs, celery_task_id)
    return worker_owning(logs, celery_task_id)


def duration_notice(topology: Topology, runs: int, timeout: float) -> str:
    """About how long ``runs`` runs of ``topology`` take, and their bound: said before the demo starts."""
    bound = runs * (SETUP_SECONDS + timeout)
    typical = TYPICAL_RUN_SECONDS.get((topology.executor, topology.scenario))
    if typical is None:
        return (
            f"at most about {_minutes(bound)} ({runs} run{'s' * (runs > 1)}, --timeout {timeout:.0f} s each)"
        )
    return (
        f"about {_minutes(runs * typical)} ({runs} run{'s' * (runs > 1)} of about {typical} s; at most about "
        f"{_minutes(bound)} with --timeout {timeout:.0f} s)"
    )


def _minutes(seconds: float) -> str:
    minutes = max(1, round(seconds / 60))
    return f"{minutes} minute{'s' * (minutes > 1)}"
