"""
A real ``airflow scheduler`` SIGKILLed in the middle of its heartbeat-timeout purge, then a second one
started that must deal with the dead one's tries: :func:`kill_scheduler_mid_purge`. Nothing is mocked;
the schedulers are processes of their own, each in its own process group, with their output in files.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from sqlalchemy import select, text, update

from testing.database import own_connection
from testing.purge_race import SETTLE_TIMEOUT
from testing.real_scheduler import (
    POLL,
    PURGE_EVERY,
    PURGE_TIMEOUT,
    RESTART_CONFIG,
    RESTART_TIMEOUT,
    check_activation,
    loop_crash,
    scheduler_job,
    start_scheduler,
)
from testing.scheduler import STALE_FOR, make_stale_for_job, task_callback_requests

if TYPE_CHECKING:
    from pathlib import Path

    from sqlalchemy.orm import Session

    from airflow_heartbeat_fix.demo.processes import Component

#: The try :func:`make_stale` leaves running: the one the killed scheduler was purging.
KILLED_TRY = 1


@dataclass(frozen=True)
class KilledTry:
    """One task instance whose try was running when its scheduler was killed, as the database says."""

    task_id: str
    #: the state of the task instance's live try (on 3.4 a reset or a retry makes a new try)
    state: str | None
    #: callbacks stored for the killed try
    callbacks: int
    #: callbacks stored for any other try of the task instance (none ever ran)
    stray_callbacks: int

    def problem(self, *, settled: bool) -> str | None:
        """
        What is inconsistent: a callback must go with its try's failure (FAILED, or UP_FOR_RETRY with
        the next try allocated), once; a try reset by adoption has none. ``settled``: the dead
        scheduler's tries must all have been dealt with (after the restart), not only be consistent.
        """
        from airflow.utils.state import TaskInstanceState

        if self.stray_callbacks:
            return f"{self.stray_callbacks} callback(s) for a try that never ran"
        if self.state in (TaskInstanceState.RUNNING, TaskInstanceState.RESTARTING):
            if self.callbacks:
                return f"{self.callbacks} callback(s) stored while its try is still {self.state} (orphan)"
            return f"still {self.state}: neither converged nor reset by adoption" if settled else None
        if self.state in (TaskInstanceState.FAILED, TaskInstanceState.UP_FOR_RETRY):
            if self.callbacks != 1:
                return f"{self.state} with {self.callbacks} callbacks for its try (one expected)"
            return None
        if self.state is None:
            if self.callbacks:
                return f"reset by adoption, yet {self.callbacks} callback(s) for the reset try (orphan)"
            return None
        return f"unexpected state {self.state}"


@dataclass
class SchedulerKill:
    """What :func:`kill_scheduler_mid_purge` saw."""

    batch: int
    callbacks_at_kill: int
    at_kill: list[KilledTry]
    #: why the scheduler died before it could be killed (it crashed), if it did
    died_by_itself: str | None
    #: what kept the restarted scheduler from dealing with the dead one's tries, if anything
    restart_failed: str | None
    after_restart: list[KilledTry]
    #: seconds from the start to each step: the scheduler up, killed, the restarted one up, all dealt with
    timeline: dict[str, float]

    def problems(self) -> list[str]:
        found = [f"the scheduler {self.died_by_itself}"] if self.died_by_itself else []
        found += [f"at the kill, {t.task_id}: {p}" for t in self.at_kill if (p := t.problem(settled=False))]
        found += [f"the restarted scheduler {self.restart_failed}"] if self.restart_failed else []
        found += [f"{t.task_id}: {p}" for t in self.after_restart if (p := t.problem(settled=True))]
        return found

    def verdict(self, shown: int = 8) -> str:
        """The summary, then the first ``shown`` problems."""
        problems = self.problems()
        more = [f"(+{len(problems) - shown} more)"] if len(problems) > shown else []
        return "\n".join([self.summary(), *problems[:shown], *more])

    def summary(self) -> str:
        ends = Counter(str(t.state) for t in self.after_restart)
        died = self.died_by_itself or f"killed with {self.callbacks_at_kill} of {self.batch} callbacks stored"
        steps = ", ".join(f"{step} {at:.1f}" for step, at in self.timeline.items())
        return (
            f"scheduler {died}; after the restart: {sum(t.callbacks for t in self.after_restart)} "
            f"callbacks, live states {dict(sorted(ends.items()))}; seconds: {steps}"
        )


def kill_scheduler_mid_purge(
    tis: list[Any], session: Session, *, home: Path, kill_at: int, fix_enabled: bool
) -> SchedulerKill:
    """
    ``airflow scheduler`` (LocalExecutor, the package activated through its entry point when
    ``fix_enabled``) is handed ``tis`` (one Dag run) as its hung tries; once ``kill_at`` of their
    callbacks are stored, and not all, its whole process group gets SIGKILL, as in a host crash. A
    second scheduler then starts and, once the dead one's heartbeat is stale, adopts or resets its
    RUNNING task instances. LocalExecutor adopts none, so each is reset: up to 3.3 its try goes to the
    history table and its state is cleared; 3.4 archives the try and adds the next one, with no state.
    Tries the dead scheduler failed are left alone. The schedulers' output is in ``home/*.log``.
    """
    dag_id, run_id, batch = tis[0].dag_id, tis[0].run_id, len(tis)
    schedulers: list[Component] = []
    started, timeline = time.monotonic(), dict[str, float]()
    try:
        first = start_scheduler("killed-scheduler", home, fix_enabled=fix_enabled)
        schedulers.append(first)
        job_id = scheduler_job(first, known=set())
        timeline["up"] = time.monotonic() - started
        check_activation(first, fix_enabled)
        make_stale_for_job(tis, job_id, session)
        died_by_itself = _kill_mid_purge(first, kill_at, batch)
        _wait_for_other_backends()
        _heartbeat_long_ago(job_id)
        timeline["died"] = time.monotonic() - started
        at_kill = _killed_tries(dag_id, run_id)
        second = start_scheduler("restarted-scheduler", home, fix_enabled=fix_enabled, **RESTART_CONFIG)
        schedulers.append(second)
        scheduler_job(second, known={job_id})
        timeline["restarted"] = time.monotonic() - started
        restart_failed = _wait_until_dealt_with(second, dag_id, run_id)
        second.stop()
        timeline["done"] = time.monotonic() - started
        after_restart = _killed_tries(dag_id, run_id)
    finally:
        for scheduler in schedulers:
            scheduler.stop()
    return SchedulerKill(
        batch=batch,
        callbacks_at_kill=sum(t.callbacks for t in at_kill),
        at_kill=at_kill,
        died_by_itself=died_by_itself,
        restart_failed=restart_failed,
        after_restart=after_restart,
        timeline=timeline,
    )


def _kill_mid_purge(scheduler: Component, kill_at: int, batch: int) -> str | None:
    """
    SIGKILL ``scheduler``'s process group once ``kill_at`` callbacks (fewer than ``batch``) are stored.
    Returns ``None`` once killed, or how it died if it died by itself first.
    """
    from airflow.models.db_callback_request import DbCallbackRequest
    from airflow.utils.session import create_session
    from sqlalchemy import func

    deadline = time.monotonic() + PURGE_TIMEOUT
    for look in itertools.count():
        if time.monotonic() >= deadline:
            break
        with create_session(scoped=False) as reader:
            stored = int(reader.scalar(select(func.count()).select_from(DbCallbackRequest)) or 0)
        if kill_at <= stored < batch:
            scheduler.kill_group()
            return None
        if stored >= batch:
            raise RuntimeError(
                f"the purge stored all {batch} callbacks between two looks: too fast to kill mid-way"
            )
        if (code := scheduler.popen.poll()) is not None:
            why = loop_crash(scheduler.read_log()) or "no crash logged"
            return f"exited by itself (code {code}) with {stored} of {batch} callbacks stored: {why}"
        # A crashed scheduler can take longer than the purge timeout to exit (its LocalExecutor waits
        # for running tasks), so its log is read too, twice a second.
        if look % 50 == 49 and (crash := loop_crash(scheduler.read_log())):
            return f"crashed (still shutting down) with {stored} of {batch} callbacks stored: {crash}"
        time.sleep(POLL)
    raise TimeoutError(
        f"{scheduler.name} stored no {kill_at} callbacks in {PURGE_TIMEOUT:.0f}s:\n{scheduler.tail()}"
    )


def _wait_for_other_backends() -> None:
    """
    Until no other connection to this database is inside a statement or transaction: a killed client's
    backend finishes what it was running (a commit already sent still commits), then exits.
    """
    query = text(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND pid <> pg_backend_pid() AND backend_type = 'client backend' AND state <> 'idle'"
    )
    with own_connection() as connection:
        deadline = time.monotonic() + SETTLE_TIMEOUT
        while connection.execute(query).scalar_one():
            if time.monotonic() > deadline:
                raise TimeoutError(f"the killed scheduler's connections still busy after {SETTLE_TIMEOUT}s")
            time.sleep(POLL)


def _heartbeat_long_ago(job_id: int) -> None:
    """The dead scheduler's job as the health check sees it once the threshold has passed."""
    from airflow.jobs.job import Job
    from airflow.utils.session import create_session

    with create_session(scoped=False) as writer:
        writer.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(latest_heartbeat=datetime.now(tz=timezone.utc) - STALE_FOR)
            .execution_options(synchronize_session=False)
        )


def _killed_tries(dag_id: str, run_id: str) -> list[KilledTry]:
    """Each task instance of the run: its live try's state, and the callbacks stored per try."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session(scoped=False) as reader:
        live = reader.execute(
            select(TaskInstance.task_id, TaskInstance.state).where(
                TaskInstance.dag_id == dag_id, TaskInstance.run_id == run_id
            )
        ).all()
        requests = task_callback_requests(reader)
    states = dict(live)
    if len(states) != len(live):
        raise RuntimeError(f"more than one live try per task instance in {dag_id}/{run_id}")
    callbacks = Counter(
        (request.ti.task_id, request.ti.try_number)
        for request in requests
        if (request.ti.dag_id, request.ti.run_id) == (dag_id, run_id)
    )
    return [
        KilledTry(
            task_id=task_id,
            state=state,
            callbacks=callbacks[(task_id, KILLED_TRY)],
            stray_callbacks=sum(
                n for (task, tn), n in callbacks.items() if task == task_id and tn != KILLED_TRY
            ),
        )
        for task_id, state in sorted(states.items())
    ]


def _wait_until_dealt_with(scheduler: Component, dag_id: str, run_id: str) -> str | None:
    """
    Until no try of the run is RUNNING any more, then two scan intervals more (for anything the
    restarted scheduler would still do to them). What went wrong instead, or ``None``.
    """
    from airflow.utils.state import TaskInstanceState

    deadline = time.monotonic() + RESTART_TIMEOUT
    running = (TaskInstanceState.RUNNING, TaskInstanceState.RESTARTING)
    while any(t.state in running for t in _killed_tries(dag_id, run_id)):
        if (code := scheduler.popen.poll()) is not None:
            return f"exited (code {code}) before it dealt with the killed one's tries:\n{scheduler.tail()}"
        if time.monotonic() > deadline:
            return f"left tries running for {RESTART_TIMEOUT:.0f}s"
        time.sleep(0.2)
    time.sleep(2 * PURGE_EVERY)
    if (code := scheduler.popen.poll()) is not None:
        return f"exited (code {code}):\n{scheduler.tail()}"
    return None
