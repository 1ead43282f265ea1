"""
Statements of adopting or resetting a dead scheduler's orphans, stock vs fixed: one command.

Run with an Airflow venv's interpreter (``.venvs/airflow-<v>/bin/python -m benchmarks.adoption_cost
--db-url URL``). One ``adopt_or_reset_orphaned_tasks`` pass (as the scheduler loop calls it) over N
RUNNING task instances of a dead scheduler job, per executor and mode, each in a fresh process (fixes
on or off through ``AIRFLOW__HEARTBEAT_FIX__ENABLED``):

* ``local``: the LocalExecutor, which adopts nothing (every orphan is reset) and opens no session;
* ``adopt_half``: adopts every other orphan, opens no session;
* ``scoped_session``: adopts every other orphan after a scoped ``create_session()``, as cncf-kubernetes
  <= 10.17 does (stock crashes or loses the resets there, so only its fixed count is a cost).

Prints statements and commits per pass (SQLAlchemy ``before_cursor_execute``, exact), what the pass
left (reset, adopted, still orphaned) and the stock crash if any. Nothing is timed or asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from benchmarks import _setup
from testing.scheduler import StatementCounter

if TYPE_CHECKING:
    from collections.abc import Sequence

RESULT_PREFIX = "BENCH-RESULT "
EXECUTORS = ("local", "adopt_half", "scoped_session")
DAG_ID = "bench_adopt"


def _executor(kind: str) -> Any:
    from airflow.executors.local_executor import LocalExecutor
    from airflow.jobs.job import Job
    from airflow.utils.session import create_session
    from sqlalchemy import select

    class AdoptHalf(LocalExecutor):
        opens_session = kind == "scoped_session"

        def try_adopt_task_instances(self, tis: Sequence[Any]) -> Sequence[Any]:
            keys = [ti.task_id for ti in tis]
            if self.opens_session:
                with create_session() as session:
                    session.scalars(select(Job.id).where(Job.state == "running")).all()
            return [ti for ti, task_id in zip(tis, keys, strict=True) if int(task_id[1:]) % 2]

    return LocalExecutor() if kind == "local" else AdoptHalf()


def _runner(executor: Any, session: Any) -> Any:
    """The runner ``airflow scheduler`` builds on ``executor`` (3.2+ takes it, 3.0/3.1 read the job's)."""
    import inspect

    from airflow.cli.commands import scheduler_command
    from airflow.jobs.job import Job

    job = Job()
    session.add(job)
    session.flush()
    runner_cls = scheduler_command.SchedulerJobRunner
    if "executors" in inspect.signature(runner_cls.__init__).parameters:
        runner = runner_cls(job=job, num_runs=1, executors=[executor])
    else:
        job.executors = [executor]
        runner = runner_cls(job=job, num_runs=1)
    executor.job_id = job.id
    session.commit()
    return runner


def measure(n: int, kind: str) -> dict[str, Any]:
    from airflow.jobs.job import Job
    from airflow.models.taskinstance import TaskInstance as TI
    from airflow.utils.session import create_session
    from sqlalchemy import func, select, update

    with create_session() as session:
        runner = _runner(_executor(kind), session)
        dead = Job()
        dead.job_type, dead.state = "SchedulerJob", "failed"
        dead.latest_heartbeat = datetime.now(timezone.utc) - timedelta(hours=1)
        session.add(dead)
        session.flush()
        dag = _setup.store_dag(_setup.DagShape(DAG_ID, _setup.TASKS_PER_RUN), session)
        _setup.create_runs(dag, -(-n // _setup.TASKS_PER_RUN), session)
        now = datetime.now(timezone.utc)
        session.execute(
            update(TI)
            .where(TI.dag_id == DAG_ID)
            .values(state="running", queued_by_job_id=dead.id, try_number=1, last_heartbeat_at=now)
        )
        session.commit()
        dead_id, own_id = dead.id, runner.job.id
    counter = StatementCounter()
    error = None
    try:
        with counter.counting():
            runner.adopt_or_reset_orphaned_tasks()
    except Exception as exc:  # a stock release that crashes is a result, not a benchmark failure
        error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    with create_session() as session:

        def count(*where: Any) -> int:
            query = select(func.count()).select_from(TI).where(TI.dag_id == DAG_ID, *where)
            return int(session.scalar(query) or 0)

        left = {
            "reset": count(TI.state.is_(None), TI.queued_by_job_id.is_(None)),
            "adopted": count(TI.state == "running", TI.queued_by_job_id == own_id),
            "still_orphaned": count(TI.queued_by_job_id == dead_id),
        }
    return {
        "n": n,
        "statements": counter.statements,
        "commits": counter.commits,
        "error": error,
        **left,
        "kinds": dict(counter.kinds),
    }


def child(args: argparse.Namespace) -> None:
    _setup.configure(args.db_url)
    _setup.migrate_database()
    _setup.become_scheduler()
    _setup.clear_tables()
    result = measure(args.n, args.executor)
    _setup.clear_tables()
    print(RESULT_PREFIX + json.dumps(result), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--db-url", required=True)
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--executor", choices=EXECUTORS, action="append")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        args.executor = args.executor[0]
        child(args)
        return 0
    from airflow import __version__ as version  # the interpreter's Airflow; children run the same one

    print(f"Airflow {version}, N = {args.n}, {args.db_url.split(':', 1)[0]}")
    print(
        f"{'executor':15} {'mode':6} {'statements':>10} {'commits':>7} {'reset':>6} {'adopted':>7} "
        f"{'orphaned':>8}  error"
    )
    for kind in args.executor or EXECUTORS:
        for mode in ("stock", "fixed"):
            env = {**os.environ, "AIRFLOW__HEARTBEAT_FIX__ENABLED": str(mode == "fixed")}
            command = [sys.executable, "-m", "benchmarks.adoption_cost", "--child", "--executor", kind]
            out = subprocess.run(
                [*command, "--n", str(args.n), "--db-url", args.db_url],
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            lines = [line for line in out.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
            if not lines:
                print(f"{kind:15} {mode:6} no result (exit {out.returncode}): {out.stderr[-400:]}")
                continue
            r = json.loads(lines[-1].removeprefix(RESULT_PREFIX))
            print(
                f"{kind:15} {mode:6} {r['statements']:>10} {r['commits']:>7} {r['reset']:>6} "
                f"{r['adopted']:>7} {r['still_orphaned']:>8}  {r['error'] or ''}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
