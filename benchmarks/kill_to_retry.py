"""
Time from a SIGKILL to the retry, and a live try under a stale executor event, with real Airflow
components (phase-1 prototype of the issue's benchmark command and the demo's redelivery scenario).

    .venvs/airflow-3.3.2/bin/python -m benchmarks.kill_to_retry --kill task --runs 3 [--mode stock]
    .venvs/airflow-3.3.2-celery/bin/python -m benchmarks.kill_to_retry --executor celery \
        --database postgresql+psycopg://... --broker-url redis://127.0.0.1:6389/0 --kill supervisor

Starts an API server (execution API), a Dag processor and ``airflow scheduler`` (LocalExecutor on SQLite,
or CeleryExecutor with two ``airflow celery worker`` on PostgreSQL and Redis) in a fresh home, triggers a
Dag whose one task sleeps with a retry left and both callbacks (they append to ``<home>/callbacks.log``),
samples the live try's ``last_heartbeat_at`` for ``--sample`` seconds (what a live worker's heartbeat age
looks like to the scheduler), then:

* ``--kill task``: SIGKILL the task process (the supervisor's child: ``ti.pid``);
* ``--kill supervisor``: SIGKILL the process running the supervisor (a LocalExecutor worker, or a Celery
  pool process: WorkerLostError), so the heartbeats stop;
* ``--kill none`` with ``--redelivery``: nothing; Redis redelivers the unacknowledged message after the
  visibility timeout and the duplicate's expired token is refused: the try must run to its end.

It measures, on the database, how long until try 1 leaves RUNNING ("judged") and until try 2 runs, and
prints one line per run.
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psutil
from sqlalchemy import create_engine, text

from airflow_heartbeat_fix.demo.environment import airflow_process_env, prepare_home
from airflow_heartbeat_fix.demo.logs import celery_worker_ready
from airflow_heartbeat_fix.demo.processes import Processes, free_port, http_ok

DAG_ID = "kill_to_retry"
DAG_SOURCE = """
import os
import time
from datetime import datetime, timedelta

from airflow.sdk import dag, task


def _record(kind):
    def callback(context):
        ti = context["ti"]
        with open(os.path.join(os.environ["AIRFLOW_HOME"], "callbacks.log"), "a") as out:
            out.write(f"{time.time():.3f} {kind} try={ti.try_number}\\n")
    return callback


@dag(dag_id="DAG_ID", schedule=None, start_date=datetime(2024, 1, 1), catchup=False)
def kill_to_retry():
    @task(
        retries=1,
        retry_delay=timedelta(seconds=1),
        on_failure_callback=_record("failure"),
        on_retry_callback=_record("retry"),
    )
    def sleeper():
        # CHATTY > 0: a line of output every CHATTY seconds (output wakes the supervisor's select loop).
        end = time.monotonic() + SLEEP
        while time.monotonic() < end:
            time.sleep(CHATTY or SLEEP)
            if CHATTY:
                print("still working", flush=True)

    sleeper()


kill_to_retry()
"""


def _rows(engine: Any) -> list[dict[str, Any]]:
    """Every try of the Dag's task (3.4 keeps one row per try; before, try 1 moves to the history table)."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT try_number, state, pid, hostname, last_heartbeat_at FROM task_instance "
                "WHERE dag_id = :dag_id ORDER BY try_number"
            ),
            {"dag_id": DAG_ID},
        ).mappings()
        return [dict(row) for row in rows]


def _aware(value: Any) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)


def _wait(predicate: Any, timeout: float, step: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := predicate():
            return result
        time.sleep(step)
    return None


def _environment(args: argparse.Namespace, home: Path, port: int, queue: str) -> dict[str, str]:
    database = args.database or f"sqlite:///{home}/airflow.db"
    env = airflow_process_env(
        dict(os.environ),
        home=home,
        database_url=database,
        api_port=port,
        fix_enabled=args.mode != "stock",
        heartbeat_timeout=args.heartbeat_timeout,
        detection_interval=args.detection_interval,
        jwt_secret=secrets.token_urlsafe(32),
    )
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if args.mode == "prototype":  # the launcher lives in this repository's benchmarks/
        env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    if args.executor == "celery":
        env.update(
            {
                "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
                "AIRFLOW__CELERY__BROKER_URL": args.broker_url,
                "AIRFLOW__CELERY__RESULT_BACKEND": f"db+{database}",
                "AIRFLOW__CELERY__WORKER_CONCURRENCY": "2",
                "AIRFLOW__OPERATORS__DEFAULT_QUEUE": queue,
            }
        )
    if args.redelivery:
        # Redis redelivers an unacknowledged message after the visibility timeout; the workload token
        # lives [scheduler] task_queued_timeout (600 s by default, the visibility timeout 86,400 s: at the
        # defaults a redelivery always carries an expired token). Shortened so one happens mid-task.
        env.update(
            {
                "AIRFLOW__CELERY_BROKER_TRANSPORT_OPTIONS__VISIBILITY_TIMEOUT": str(args.visibility_timeout),
                "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT": str(args.token_lifetime),
                "AIRFLOW__API_AUTH__JWT_LEEWAY": "0",
            }
        )
    return env


def _start(
    args: argparse.Namespace,
    procs: Processes,
    airflow: str,
    env: dict[str, str],
    home: Path,
    port: int,
    queue: str,
) -> None:
    logs = home / "logs"
    if procs.run([[airflow, "db", "migrate"]], env, logs / "migrate.log", home, timeout=300) != [0]:
        raise RuntimeError(f"database setup failed: {logs / 'migrate.log'}")
    api = [airflow, "api-server", "--apps", "execution", "-H", "127.0.0.1", "-p", str(port), "-w", "1"]
    procs.start("api-server", api, env, logs / "api-server.out", home)
    procs.start("dag-processor", [airflow, "dag-processor"], env, logs / "dag-processor.out", home)
    scheduler = [airflow, "scheduler", "--skip-serve-logs"]
    if args.mode == "prototype":
        python = str(Path(airflow).with_name("python"))
        scheduler = [python, "-m", "benchmarks.prototype_scheduler", "scheduler", "--skip-serve-logs"]
    procs.start("scheduler", scheduler, env, logs / "scheduler.out", home)
    if args.executor == "celery":
        for n in (1, 2):
            worker = [
                airflow,
                "celery",
                "worker",
                "--queues",
                queue,
                "--concurrency",
                "2",
                "--skip-serve-logs",
            ]
            worker += ["--celery-hostname", f"worker{n}@{queue}", "--pid", str(home / f"worker-{n}.pid")]
            procs.start(f"celery-worker-{n}", worker, env, logs / f"celery-worker-{n}.out", home)


def _ready(args: argparse.Namespace, procs: Processes, engine: Any, port: int) -> bool:
    try:
        with engine.connect() as conn:
            parsed = conn.execute(
                text("SELECT 1 FROM serialized_dag WHERE dag_id = :d"), {"d": DAG_ID}
            ).first()
    except Exception:
        return False
    workers = [c for name, c in procs.components.items() if name.startswith("celery-worker")]
    return bool(
        parsed
        and http_ok(f"http://127.0.0.1:{port}/execution/health")
        and all(celery_worker_ready(c.read_log()) for c in workers)
    )


def one_run(args: argparse.Namespace, airflow: str, run: int) -> dict[str, Any]:
    home = Path(tempfile.mkdtemp(prefix=f"hbfix-k2r-{run}-"))
    sleep = args.task_seconds
    prepare_home(
        home,
        {
            f"{DAG_ID}.py": DAG_SOURCE.replace("DAG_ID", DAG_ID)
            .replace("SLEEP", str(sleep))
            .replace("CHATTY", str(args.chatty))
        },
    )
    port, queue = free_port(), f"k2r_{os.getpid()}_{run}"
    env = _environment(args, home, port, queue)
    procs = Processes(marker=f"hbfix-k2r-{os.getpid()}-{run}")
    engine = create_engine(env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
    logs = home / "logs"
    try:
        _start(args, procs, airflow, env, home, port, queue)
        if not _wait(lambda: _ready(args, procs, engine, port), 300, 1.0):
            raise RuntimeError(f"components not ready; see {logs}")
        with engine.begin() as conn:
            conn.execute(text("UPDATE dag SET is_paused = false WHERE dag_id = :d"), {"d": DAG_ID})
        if procs.run(
            [[airflow, "dags", "trigger", DAG_ID]], env, logs / "trigger.log", home, timeout=120
        ) != [0]:
            raise RuntimeError("trigger failed")

        def running_with_pid() -> dict[str, Any] | None:
            rows = _rows(engine)
            return next(
                (r for r in rows if r["state"] == "running" and r["pid"] and r["last_heartbeat_at"]), None
            )

        live = _wait(running_with_pid, 300, 0.5)
        if not live:
            raise RuntimeError(f"the task never ran; see {logs}")
        started = time.monotonic()
        # What a live worker's heartbeat age looks like to a scheduler pass: sample it.
        ages: list[float] = []
        sample_until = time.monotonic() + args.sample
        while time.monotonic() < sample_until:
            if row := running_with_pid():
                ages.append((datetime.now(timezone.utc) - _aware(row["last_heartbeat_at"])).total_seconds())
            time.sleep(0.2)
        result: dict[str, Any] = {"run": run, "executor": args.executor, "mode": args.mode, "kill": args.kill}
        if args.kill != "none":
            if args.kill_after_heartbeat is not None:
                # Kill a set time after a heartbeat lands: 0 is the fix's worst case (the longest a live
                # worker's heartbeat may be missing still lies ahead), about one interval its best.
                seen = running_with_pid()["last_heartbeat_at"]
                _wait(lambda: running_with_pid()["last_heartbeat_at"] != seen, 30, 0.05)
                time.sleep(args.kill_after_heartbeat)
            live = running_with_pid()
            task_proc = psutil.Process(int(live["pid"]))
            target = task_proc if args.kill == "task" else task_proc.parent()
            last_heartbeat = _aware(live["last_heartbeat_at"])
            killed_at = datetime.now(timezone.utc)
            t_kill = time.monotonic()
            os.kill(target.pid, signal.SIGKILL)
            result["killed"] = (
                f"{target.pid} {' '.join(target.cmdline())[:60]!r}" if target.is_running() else target.pid
            )
            result["heartbeat_age_at_kill_s"] = round((killed_at - last_heartbeat).total_seconds(), 2)
        else:
            t_kill = started

        restarts: list[float] = []

        def judged() -> dict[str, Any] | None:
            scheduler = procs.components["scheduler"]
            if scheduler.exit_code() is not None and args.restart_scheduler:
                # As Kubernetes would: a crashed scheduler is started again (each start re-reads the events).
                restarts.append(round(time.monotonic() - t_kill, 1))
                scheduler.log_file.close()
                procs.start("scheduler", scheduler.popen.args, env, logs / "scheduler.out", home)
            rows = _rows(engine)
            first = next((r for r in rows if r["try_number"] == 1), None)
            if any(r["try_number"] >= 2 for r in rows) or (first and first["state"] != "running"):
                return {"rows": rows}
            return None

        wait_for = args.heartbeat_timeout + 120 if args.kill != "none" else sleep + 120
        got = _wait(judged, wait_for, 0.1)
        result["kill_to_judged_s"] = round(time.monotonic() - t_kill, 2) if got else None
        result["try1_state_then"] = (
            next((r["state"] for r in got["rows"] if r["try_number"] == 1), None) if got else None
        )

        def try2_running() -> bool:
            return any(r["try_number"] >= 2 and r["state"] == "running" for r in _rows(engine))

        if got and args.kill != "none":
            t_retry = _wait(try2_running, 120, 0.2)
            result["kill_to_try2_running_s"] = round(time.monotonic() - t_kill, 2) if t_retry else None
        time.sleep(args.settle)
        result["tries_at_end"] = [(r["try_number"], r["state"]) for r in _rows(engine)]
        result["scheduler_restarts_at_s"] = restarts
        result["scheduler_crashes_logged"] = (
            procs.components["scheduler"]
            .read_log()
            .count("Exception when executing SchedulerJob._run_scheduler_loop")
        )
        callbacks = home / "callbacks.log"
        result["callbacks"] = (
            [line.split(" ", 1)[1] for line in callbacks.read_text().splitlines()]
            if callbacks.exists()
            else []
        )
        result["heartbeat_age_samples"] = len(ages)
        result["heartbeat_age_max_s"] = round(max(ages), 2) if ages else None
        result["heartbeat_age_p50_s"] = round(statistics.median(ages), 2) if ages else None
        result["home"] = str(home)
        return result
    finally:
        procs.stop_all()
        engine.dispose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--executor", choices=("local", "celery"), default="local")
    parser.add_argument("--kill", choices=("task", "supervisor", "none"), default="task")
    parser.add_argument("--mode", choices=("stock", "fixed", "prototype"), default="stock")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument(
        "--database", help="SQLAlchemy URL of an empty database (one run); default SQLite in the home"
    )
    parser.add_argument("--broker-url", help="Redis URL for --executor celery")
    parser.add_argument(
        "--redelivery", action="store_true", help="short visibility timeout and token lifetime"
    )
    parser.add_argument("--visibility-timeout", type=int, default=20)
    parser.add_argument("--token-lifetime", type=int, default=10)
    parser.add_argument("--task-seconds", type=int, default=900)
    parser.add_argument(
        "--chatty", type=float, default=0, help="the task prints a line every this many seconds"
    )
    parser.add_argument("--sample", type=float, default=30.0, help="seconds of heartbeat-age sampling first")
    parser.add_argument("--settle", type=float, default=5.0)
    parser.add_argument("--restart-scheduler", action="store_true", help="start a crashed scheduler again")
    parser.add_argument("--kill-after-heartbeat", type=float, help="kill this many seconds after a heartbeat")
    parser.add_argument("--heartbeat-timeout", type=int, default=300)
    parser.add_argument("--detection-interval", type=int, default=10)
    args = parser.parse_args(argv)
    airflow = str(Path(sys.executable).with_name("airflow"))
    for run in range(1, args.runs + 1):
        print(one_run(args, airflow, run), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
