"""
Time from a worker's SIGKILL to its retry, stock vs fixed: ``python -m benchmarks.kill_to_retry``.

``heartbeat_judged_executor_events`` sets a terminal executor event aside while its try's heartbeat is
fresh, so a real death that comes with an event (a SIGKILLed Celery pool process: WorkerLostError; 3.4's
LocalExecutor worker) is judged when the heartbeat is ``2 x [workers] min_heartbeat_interval`` minus one
loop old instead of when the event arrives. This measures what that costs, on real components:

    python -m benchmarks.kill_to_retry --airflow 3.3.2,3.4.0b2 --executor local,celery [--kills 3]

runs, per release and executor, one child per mode in ``.venvs/airflow-<v>`` (``-celery`` for Celery:
PostgreSQL and Redis from ``scripts/postgres.sh`` and ``scripts/redis.sh``, a fresh database each, dropped
afterwards): an API server (execution API), a Dag processor, ``airflow scheduler`` and, for Celery, two
``airflow celery worker``. Each child triggers one Dag whose task sleeps with ``--kills`` retries and both
callbacks, and ``--kills`` times: waits for the running try's next heartbeat to land (the fix's worst case:
the longest a live worker may go without one still lies ahead), SIGKILLs the try's supervisor and its task
process (``--kill supervisor``: an OOM kill of the worker's processes; on Celery the pool process, which
Celery reports as WorkerLostError) or only the task process (``--kill task``: the supervisor reports the
failure itself, no executor event), and measures on the database until the try leaves RUNNING ("judged")
and the next try runs ("retry").

Modes: ``stock`` (``[heartbeat_fix] enabled = False``), ``fixed``, and where stock crashes on the retry
(3.4.0b1/b2: the sink's UniqueViolation) ``without``: the package with every fix it applies here but this
one (``benchmarks.scheduler_without_fix``), the baseline the fix is then compared with. The check: every
fixed kill's retry comes no later than the baseline's median plus ``2 x min_heartbeat_interval``.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULT_PREFIX = "K2R-RESULT "
FIX = "heartbeat_judged_executor_events"
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


@dag(dag_id="kill_to_retry", schedule=None, start_date=datetime(2024, 1, 1), catchup=False)
def kill_to_retry():
    @task(
        retries=RETRIES,
        retry_delay=timedelta(seconds=1),
        on_failure_callback=_record("failure"),
        on_retry_callback=_record("retry"),
    )
    def sleeper():
        time.sleep(3600)

    sleeper()


kill_to_retry()
"""


# --- one child: one release, executor and mode ---------------------------------------------------


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


class Child:
    """The components of one measurement, started once, and the kills done on them."""

    def __init__(self, args: argparse.Namespace) -> None:
        from sqlalchemy import create_engine

        from airflow_heartbeat_fix.demo.environment import airflow_process_env, prepare_home
        from airflow_heartbeat_fix.demo.processes import Processes, free_port

        self.args = args
        self.home = Path(tempfile.mkdtemp(prefix=f"hbfix-k2r-{args.mode}-"))
        prepare_home(self.home, {f"{DAG_ID}.py": DAG_SOURCE.replace("RETRIES", str(args.kills))})
        self.port, self.queue = free_port(), f"k2r_{os.getpid()}"
        database = args.database or f"sqlite:///{self.home}/airflow.db"
        env = airflow_process_env(
            dict(os.environ),
            home=self.home,
            database_url=database,
            api_port=self.port,
            fix_enabled=args.mode != "stock",
            heartbeat_timeout=args.heartbeat_timeout,
            detection_interval=args.detection_interval,
            jwt_secret=secrets.token_urlsafe(32),
        )
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL"] = str(args.min_heartbeat_interval)
        env["PYTHONPATH"] = str(ROOT)  # the ``without`` mode's scheduler launcher lives in benchmarks/
        if args.executor == "celery":
            env.update(
                {
                    "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
                    "AIRFLOW__CELERY__BROKER_URL": args.broker_url,
                    "AIRFLOW__CELERY__RESULT_BACKEND": f"db+{database}",
                    "AIRFLOW__CELERY__WORKER_CONCURRENCY": "2",
                    "AIRFLOW__OPERATORS__DEFAULT_QUEUE": self.queue,
                }
            )
        self.env = env
        self.procs = Processes(marker=f"hbfix-k2r-{os.getpid()}")
        self.engine = create_engine(database)
        self.airflow = str(Path(sys.executable).with_name("airflow"))

    def rows(self) -> list[dict[str, Any]]:
        """Every try of the task (3.4 keeps one row per try; before, the current try's row only)."""
        from sqlalchemy import text

        query = "SELECT try_number, state, pid, last_heartbeat_at FROM task_instance WHERE dag_id = :d"
        with self.engine.connect() as conn:
            return [dict(row) for row in conn.execute(text(query), {"d": DAG_ID}).mappings()]

    def running(self, try_number: int) -> dict[str, Any] | None:
        return next(
            (
                r
                for r in self.rows()
                if r["try_number"] == try_number
                and r["state"] == "running"
                and r["pid"]
                and r["last_heartbeat_at"]
            ),
            None,
        )

    def scheduler_exited(self) -> bool:
        return self.procs.components["scheduler"].exit_code() is not None

    def start(self) -> None:
        from sqlalchemy import text

        from airflow_heartbeat_fix.demo.logs import celery_worker_ready
        from airflow_heartbeat_fix.demo.processes import http_ok

        logs, home, env, airflow = self.home / "logs", self.home, self.env, self.airflow
        if self.procs.run([[airflow, "db", "migrate"]], env, logs / "migrate.log", home, timeout=300) != [0]:
            raise RuntimeError(f"database setup failed: {logs / 'migrate.log'}")
        api = [
            airflow,
            "api-server",
            "--apps",
            "execution",
            "-H",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-w",
            "1",
        ]
        self.procs.start("api-server", api, env, logs / "api-server.out", home)
        self.procs.start("dag-processor", [airflow, "dag-processor"], env, logs / "dag-processor.out", home)
        scheduler = [airflow, "scheduler", "--skip-serve-logs"]
        if self.args.mode == "without":
            python = str(Path(airflow).with_name("python"))
            scheduler = [python, "-m", "benchmarks.scheduler_without_fix", FIX, *scheduler[1:]]
        self.procs.start("scheduler", scheduler, env, logs / "scheduler.out", home)
        if self.args.executor == "celery":
            for n in (1, 2):
                worker = [airflow, "celery", "worker", "--queues", self.queue, "--concurrency", "2"]
                worker += ["--skip-serve-logs", "--celery-hostname", f"worker{n}@{self.queue}"]
                worker += ["--pid", str(home / f"worker-{n}.pid")]
                self.procs.start(f"celery-worker-{n}", worker, env, logs / f"celery-worker-{n}.out", home)

        def ready() -> bool:
            try:
                with self.engine.connect() as conn:
                    query = text("SELECT 1 FROM serialized_dag WHERE dag_id = :d")
                    parsed = conn.execute(query, {"d": DAG_ID}).first()
            except Exception:
                return False
            workers = [c for name, c in self.procs.components.items() if name.startswith("celery-worker")]
            return bool(
                parsed
                and http_ok(f"http://127.0.0.1:{self.port}/execution/health")
                and all(celery_worker_ready(c.read_log()) for c in workers)
            )

        if not _wait(ready, 300, 1.0):
            raise RuntimeError(f"components not ready; see {logs}")
        with self.engine.begin() as conn:
            conn.execute(text("UPDATE dag SET is_paused = false WHERE dag_id = :d"), {"d": DAG_ID})
        trigger = [[airflow, "dags", "trigger", DAG_ID]]
        if self.procs.run(trigger, env, logs / "trigger.log", home, timeout=120) != [0]:
            raise RuntimeError(f"trigger failed: {logs / 'trigger.log'}")

    def kill(self, try_number: int) -> dict[str, Any]:
        """Wait for a heartbeat of try ``try_number``, kill it, and time the judgement and the retry."""
        import psutil

        measured: dict[str, Any] = {"try": try_number}
        live = _wait(lambda: self.running(try_number) or self.scheduler_exited(), 300, 0.2)
        if not isinstance(live, dict):
            measured["error"] = "scheduler exited" if self.scheduler_exited() else "try never ran"
            return measured
        seen = live["last_heartbeat_at"]
        # Right after a heartbeat lands: the fix's worst case (a live worker's longest gap lies ahead).
        _wait(
            lambda: (r := self.running(try_number)) is not None and r["last_heartbeat_at"] != seen, 30, 0.05
        )
        time.sleep(self.args.kill_after_heartbeat)
        live = self.running(try_number) or live
        task = psutil.Process(int(live["pid"]))
        victims = [task] if self.args.kill == "task" else [task.parent(), task]
        killed_at, t_kill = datetime.now(timezone.utc), time.monotonic()
        for victim in victims:
            os.kill(victim.pid, signal.SIGKILL)
        measured["heartbeat_age_at_kill_s"] = round(
            (killed_at - _aware(live["last_heartbeat_at"])).total_seconds(), 2
        )

        def judged() -> bool:
            return not any(r["try_number"] == try_number and r["state"] == "running" for r in self.rows())

        def retried() -> bool:
            return any(r["try_number"] == try_number + 1 and r["state"] == "running" for r in self.rows())

        limit = self.args.heartbeat_timeout + 120
        if _wait(lambda: judged() or self.scheduler_exited(), limit) and judged():
            measured["kill_to_judged_s"] = round(time.monotonic() - t_kill, 2)
        if _wait(lambda: retried() or self.scheduler_exited(), limit) and retried():
            measured["kill_to_retry_s"] = round(time.monotonic() - t_kill, 2)
        if self.scheduler_exited():
            measured["error"] = "scheduler exited"
        return measured

    def run(self) -> dict[str, Any]:
        result: dict[str, Any] = {
            "airflow": _airflow_version(),
            "executor": self.args.executor,
            "mode": self.args.mode,
            "kill": self.args.kill,
            "min_heartbeat_interval": self.args.min_heartbeat_interval,
            "home": str(self.home),
            "kills": [],
        }
        try:
            self.start()
            for try_number in range(1, self.args.kills + 1):
                measured = self.kill(try_number)
                result["kills"].append(measured)
                _progress(f"{self.args.executor} {self.args.mode}: {measured}")
                if "error" in measured:
                    break
            time.sleep(self.args.settle)
            log = self.procs.components["scheduler"].read_log()
            result["scheduler_crashed"] = "Exception when executing SchedulerJob._run_scheduler_loop" in log
            result["events_set_aside"] = log.count(f"airflow-heartbeat-fix ({FIX}): executor ")
            callbacks = self.home / "callbacks.log"
            lines = callbacks.read_text().splitlines() if callbacks.exists() else []
            result["callbacks"] = [line.split(" ", 1)[1] for line in lines]
        finally:
            self.procs.stop_all()
            self.engine.dispose()
        return result


def _airflow_version() -> str:
    from importlib.metadata import version

    return version("apache-airflow")


def _progress(message: str) -> None:
    print(f"[kill_to_retry] {message}", file=sys.stderr, flush=True)


# --- the driver: every release, executor and mode, each in its own environment --------------------


def _script(*args: str) -> str:
    """The last output line of ``scripts/<args>`` (a URL)."""
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / args[0]), *args[1:]], check=True, capture_output=True
    )
    return out.stdout.decode().strip().splitlines()[-1]


def _drop_database(url: str) -> None:
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    admin = create_engine(parsed.set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{parsed.database}" WITH (FORCE)'))
    finally:
        admin.dispose()


def run_child(version: str, executor: str, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    env_dir = ROOT / ".venvs" / (f"airflow-{version}" + ("-celery" if executor == "celery" else ""))
    python = env_dir / "bin" / "python"
    if not python.exists():
        raise SystemExit(
            f"{env_dir} is missing: build it (bash scripts/nox.sh -s bench_kill_to_retry builds them)"
        )
    argv = [str(python), "-m", "benchmarks.kill_to_retry", "--child", "--executor", executor, "--mode", mode]
    argv += [
        "--kill",
        args.kill,
        "--kills",
        str(args.kills),
        "--kill-after-heartbeat",
        str(args.kill_after_heartbeat),
    ]
    argv += [
        "--heartbeat-timeout",
        str(args.heartbeat_timeout),
        "--detection-interval",
        str(args.detection_interval),
    ]
    argv += ["--min-heartbeat-interval", str(args.min_heartbeat_interval)]
    database = None
    if executor == "celery":
        name = f"hbfix_k2r_{version}_{mode}_{os.getpid()}".replace(".", "_")
        database = _script("postgres.sh", "create-db", name)
        argv += ["--database", database, "--broker-url", _script("redis.sh", "start")]
    _progress(f"Airflow {version}, {executor}, {mode}")
    try:
        proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=3600, check=False)
    finally:
        if database is not None:
            _drop_database(database)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if not lines:
        raise SystemExit(f"Airflow {version} {executor} {mode} failed:\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1][len(RESULT_PREFIX) :])


def _seconds(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def _retries(result: dict[str, Any]) -> list[float]:
    return [k["kill_to_retry_s"] for k in result["kills"] if "kill_to_retry_s" in k]


def report(results: list[dict[str, Any]]) -> str:
    """The table (one row per child), then the check per release and executor."""
    from tabulate import tabulate

    rows = []
    for r in results:
        kills = r["kills"]
        ages = [k["heartbeat_age_at_kill_s"] for k in kills if "heartbeat_age_at_kill_s" in k]
        judged = [k["kill_to_judged_s"] for k in kills if "kill_to_judged_s" in k]
        outcome = (
            "scheduler crashed" if r.get("scheduler_crashed") else f"{len(_retries(r))}/{len(kills)} retried"
        )
        rows.append(
            [
                r["airflow"],
                r["executor"],
                r["kill"],
                r["mode"],
                _seconds(ages),
                _seconds(judged),
                _seconds(_retries(r)),
                outcome,
                r.get("events_set_aside", 0),
                len(r.get("callbacks", [])),
            ]
        )
    head = [
        "airflow",
        "executor",
        "kill",
        "mode",
        "heartbeat age at kill s",
        "kill -> judged s",
        "kill -> retry runs s",
        "outcome",
        "events set aside",
        "callbacks",
    ]
    lines = [
        tabulate(rows, headers=head, tablefmt="github"),
        "",
        "median (min-max) over the kills of one run",
        "",
    ]
    for (version, executor, kill), group in _by_cell(results).items():
        fixed = next((r for r in group if r["mode"] == "fixed"), None)
        baseline = next((r for r in group if r["mode"] == "stock" and _retries(r)), None) or next(
            (r for r in group if r["mode"] == "without" and _retries(r)), None
        )
        if fixed is None or baseline is None or not _retries(fixed):
            lines.append(f"{version} {executor} {kill}: no baseline or no fixed retry to compare")
            continue
        bound = statistics.median(_retries(baseline)) + 2 * fixed["min_heartbeat_interval"]
        worst = max(_retries(fixed))
        verdict = "OK" if worst <= bound else "SLOWER THAN THE BOUND"
        lines.append(
            f"{version} {executor} {kill}: fixed worst {worst:.1f} s <= {baseline['mode']} median "
            f"{statistics.median(_retries(baseline)):.1f} s + 2 x {fixed['min_heartbeat_interval']:.0f} s "
            f"= {bound:.1f} s: {verdict}"
        )
    return "\n".join(lines) + "\n"


def _by_cell(results: list[dict[str, Any]]) -> dict[tuple[str, str, str], list[dict[str, Any]]]:
    cells: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in results:
        cells.setdefault((r["airflow"], r["executor"], r["kill"]), []).append(r)
    return cells


def drive(args: argparse.Namespace) -> int:
    results = []
    for version in args.airflow.split(","):
        for executor in args.executor.split(","):
            stock = run_child(version, executor, "stock", args)
            results.append(stock)
            if stock.get("scheduler_crashed") or not _retries(stock):
                results.append(run_child(version, executor, "without", args))
            results.append(run_child(version, executor, "fixed", args))
    text = report(results)
    print(text)
    if args.output:
        raw = "\n".join(json.dumps(r, sort_keys=True) for r in results)
        Path(args.output).write_text(f"{text}\nRaw results (one JSON line per run):\n{raw}\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--airflow", default="3.3.2,3.4.0b2", help="releases, comma-separated")
    parser.add_argument("--executor", default="local,celery", help="local and/or celery, comma-separated")
    parser.add_argument("--kill", choices=("supervisor", "task"), default="supervisor")
    parser.add_argument("--kills", type=int, default=3, help="kills per run (the task has as many retries)")
    parser.add_argument("--kill-after-heartbeat", type=float, default=0.0)
    parser.add_argument(
        "--heartbeat-timeout", type=int, default=30, help="[scheduler] task_instance_heartbeat_timeout"
    )
    parser.add_argument("--detection-interval", type=int, default=5)
    parser.add_argument(
        "--min-heartbeat-interval", type=int, default=5, help="[workers] min_heartbeat_interval"
    )
    parser.add_argument("--settle", type=float, default=5.0)
    parser.add_argument("--output", help="write the table and the raw results here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--mode", choices=("stock", "without", "fixed"), default="fixed", help=argparse.SUPPRESS
    )
    parser.add_argument("--database", help=argparse.SUPPRESS)
    parser.add_argument("--broker-url", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not args.child:
        return drive(args)
    print(RESULT_PREFIX + json.dumps(Child(args).run()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
