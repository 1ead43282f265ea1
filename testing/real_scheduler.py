"""
A real ``airflow scheduler`` for the tests: started in a process group of its own with this database and
the switch as asked (:func:`start_scheduler`), its job found (:func:`scheduler_job`), its start line
checked (:func:`check_activation`), its loop's crash read off its log (:func:`loop_crash`), and restarted
over a dead scheduler's orphans until one stays up, as Kubernetes restarts a crashed container
(:func:`start_over_orphans`). Nothing is mocked; each scheduler's output is in a file of its own.
"""

from __future__ import annotations

import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select

from airflow_heartbeat_fix.demo.processes import Component
from airflow_heartbeat_fix.detection import SCHEDULER_LOOP_CRASH
from testing.environment import command_env
from testing.scheduler import STALE_FOR

#: Every scheduler here scans for timed-out tries every second (the hung tries are an hour stale).
PURGE_EVERY = 1
#: The restarted scheduler looks for the killed one's orphans every second. A scheduler is dead 20 s
#: after its last heartbeat: well past the restarted one's own silence while it resets ~100 orphans in
#: one transaction on a loaded machine (past that it would mark its own job failed once, which changes
#: nothing here: it holds no task instances). The killed one's heartbeat is moved back past that
#: (:func:`_heartbeat_long_ago`), as the 20 s would, so the restart need not wait them out.
RESTART_CONFIG = {
    "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD": "20",
    "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "1",
    "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
}
#: Bounds for real processes on a busy machine: reaching one ends the run, it never hangs. Together
#: (with SETTLE_TIMEOUT) under 400 s: a test running this gives pytest-timeout more than that, so the
#: harness, not pytest, ends a stuck run and stops the schedulers.
START_TIMEOUT = 90.0
PURGE_TIMEOUT = 60.0
RESTART_TIMEOUT = 120.0
POLL = 0.01


def scheduler_env(
    base: dict[str, str], *, home: Path, database_url: str, fix_enabled: bool
) -> dict[str, str]:
    """
    A scheduler's environment here: Airflow on this database in ``home``, the switch as asked, a scan
    every :data:`PURGE_EVERY` seconds for tries silent for half of :data:`STALE_FOR`, output unbuffered
    (the log is read while the scheduler runs).
    """
    return command_env(
        base,
        str(home),
        database_url,
        AIRFLOW__CORE__PARALLELISM="8",
        AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT=str(int(STALE_FOR.total_seconds() / 2)),
        AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL=str(PURGE_EVERY),
        AIRFLOW__HEARTBEAT_FIX__ENABLED=str(fix_enabled),
        PYTHONUNBUFFERED="1",
        TMPDIR=str(home / "tmp"),
    )


def start_scheduler(name: str, home: Path, *, fix_enabled: bool, **config: str) -> Component:
    """``airflow scheduler`` in ``home``, in a process group of its own, without this process's config."""
    from airflow import settings

    if settings.engine is None:
        raise RuntimeError("Airflow's metadata database is not configured in this process")
    for sub in ("dags", "tmp"):
        (home / sub).mkdir(parents=True, exist_ok=True)
    database_url = settings.engine.url.render_as_string(hide_password=False)
    env = scheduler_env(dict(os.environ), home=home, database_url=database_url, fix_enabled=fix_enabled)
    argv = [str(Path(sys.executable).with_name("airflow")), "scheduler", "--skip-serve-logs"]
    return Component.start(name, argv, {**env, **config}, home / f"{name}.log", cwd=home)


def scheduler_job(scheduler: Component, *, known: set[int]) -> int:
    """The id of the job ``scheduler`` registers (the first SchedulerJob not in ``known``)."""
    from airflow.jobs.job import Job
    from airflow.utils.session import create_session

    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        with create_session(scoped=False) as reader:
            found = reader.scalars(
                select(Job.id).where(Job.job_type == "SchedulerJob", Job.id.not_in(known or {-1}))
            ).first()
        if found is not None:
            return int(found)
        if scheduler.popen.poll() is not None:
            raise RuntimeError(f"{scheduler.name} exited before registering its job:\n{scheduler.tail()}")
        time.sleep(0.2)
    raise TimeoutError(f"{scheduler.name} registered no job in {START_TIMEOUT:.0f}s:\n{scheduler.tail()}")


def check_activation(scheduler: Component, fix_enabled: bool) -> None:
    """The scheduler logged the start line this Airflow gives with the switch as asked (before its job)."""
    from airflow_heartbeat_fix import activation

    facts = activation.facts()
    decided = activation.decide(facts, enabled=fix_enabled)
    expected = activation.summary(decided, facts.version, switched_off=not fix_enabled)
    if expected not in scheduler.read_log():
        raise RuntimeError(f"{scheduler.name} did not log {expected!r}:\n{scheduler.tail()}")


_ERROR_LINE = re.compile(r"^\s*[A-Za-z_][\w.]*(Error|Exception|Violation)\b.*$", re.MULTILINE)


def loop_crash(log_text: str) -> str | None:
    """The error that ended the scheduler loop (the first error line after its crash line), or None."""
    at = log_text.find(SCHEDULER_LOOP_CRASH)
    if at < 0:
        return None
    error = _ERROR_LINE.search(log_text, at + len(SCHEDULER_LOOP_CRASH))
    return error.group(0).strip() if error else SCHEDULER_LOOP_CRASH


#: Starts of ``airflow scheduler`` over the same orphans, each after the last one exited, as Kubernetes
#: restarts a crashed scheduler container: the second shows whether the crash repeats (a crash loop).
STARTS = 2
#: Once the orphans are dealt with, a scheduler must stay up this long (several orphan checks) to pass.
STAY_UP_SECONDS = 5.0


@dataclass(frozen=True)
class SchedulerStart:
    """One ``airflow scheduler`` started over the orphans, as its process and its log showed it."""

    job_id: int
    #: how it ended (its loop's crash, or its exit); ``None``: it stayed up, and was then stopped
    ended: str | None
    traceback: bool
    seconds: float

    def describe(self) -> str:
        if self.ended is None:
            return f"stayed up ({self.seconds:.0f} s){', traceback logged' if self.traceback else ''}"
        return f"{self.ended} ({self.seconds:.0f} s)"


def orphans_left(job_id: int) -> int:
    """The live tries still queued by scheduler job ``job_id`` in a state adoption takes."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from airflow.utils.state import State

    table = TaskInstance.__table__
    live = [table.c.working_set.is_(True)] if hasattr(TaskInstance, "working_set") else []
    with create_session(scoped=False) as reader:
        rows = reader.execute(
            select(table.c.id).where(
                table.c.queued_by_job_id == job_id, table.c.state.in_(State.adoptable_states), *live
            )
        ).all()
    return len(rows)


def how_it_ended(scheduler: Component, dead_job_id: int) -> str | None:
    """
    ``scheduler``'s loop crash as it logged it, or its exit; ``None`` once it has outlived the dead job's
    orphans by :data:`STAY_UP_SECONDS`. A crashed scheduler's process group is killed at once: its
    KubernetesExecutor would wait 20 s for the watcher process, which ignores SIGTERM, before it exits.
    """
    deadline, settled_at = time.monotonic() + RESTART_TIMEOUT, None
    while time.monotonic() < deadline:
        if crash := loop_crash(scheduler.read_log()):
            scheduler.kill_group()
            return f"crashed: {crash}"
        if (code := scheduler.popen.poll()) is not None:
            return f"exited with code {code}"
        if settled_at is None and not orphans_left(dead_job_id):
            settled_at = time.monotonic()
        if settled_at is not None and time.monotonic() - settled_at >= STAY_UP_SECONDS:
            return None
        time.sleep(0.2)
    raise TimeoutError(
        f"{scheduler.name} neither ended nor dealt with the orphans in {RESTART_TIMEOUT:.0f}s:\n"
        + scheduler.tail()
    )


def start_over_orphans(
    started: list[Component], home: Path, dead_job_id: int, config: dict[str, str], *, fix_enabled: bool
) -> list[SchedulerStart]:
    """Up to :data:`STARTS` ``airflow scheduler`` processes, each started once the one before has ended."""
    starts: list[SchedulerStart] = []
    known = {dead_job_id}
    for number in range(1, STARTS + 1):
        began = time.monotonic()
        scheduler = start_scheduler(f"scheduler-{number}", home, fix_enabled=fix_enabled, **config)
        started.append(scheduler)
        job_id = scheduler_job(scheduler, known=known)
        known.add(job_id)
        check_activation(scheduler, fix_enabled)
        ended = how_it_ended(scheduler, dead_job_id)
        seconds = time.monotonic() - began
        starts.append(SchedulerStart(job_id, ended, "Traceback" in scheduler.read_log(), seconds))
        if ended is None:
            break
    return starts
