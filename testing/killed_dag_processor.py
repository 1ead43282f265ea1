"""
A real ``airflow dag-processor`` handed callback requests as the scheduler stores them, killed at a chosen
moment, then restarted: :func:`kill_dag_processor`. Nothing is mocked: the requests are written by the
scheduler's own heartbeat-timeout purge (in this process), the Dag processors are processes of their own,
each in its own process group, and every callback writes down that it started and that it finished
(:data:`RECORD_ENV`), so the count is what ran, not what was logged.

Also :func:`run_batch`: one Dag processor, no kill, for the cases where stock drops callbacks by itself
(a bad request first in the batch, a blocked Dag version inflation check, a batch that times out).
"""

from __future__ import annotations

import enum
import json
import os
import signal
import sys
import textwrap
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, select

from airflow_heartbeat_fix.dag_processor import FETCHED
from airflow_heartbeat_fix.demo.processes import Component
from testing.environment import command_env
from testing.scheduler import make_stale, new_runner, purge_pass

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

#: The Dag whose callbacks write down what ran; the file a Dag processor parses, in its Dags folder.
DAG_ID = "heartbeat_fix_callback_record"
DAG_FILE = "heartbeat_fix_callback_record.py"
#: The bundle every Airflow 3 release configures by default for ``[core] dags_folder``.
BUNDLE = "dags-folder"
TASKS = ("cb_0", "cb_1", "cb_2")
#: Where each callback appends its lines, and how long it runs (the issue measured 5 s; 2 s keeps a kill
#: mid-batch well inside one callback and the tests short).
RECORD_ENV = "HEARTBEAT_FIX_CALLBACK_RECORD"
SECONDS_ENV = "HEARTBEAT_FIX_CALLBACK_SECONDS"
CALLBACK_SECONDS = 2.0

START_TIMEOUT = 120.0
FETCH_TIMEOUT = 60.0
POLL = 0.01

_DAG_SOURCE = '''\
"""Callbacks that write down that they ran (airflow-heartbeat-fix's Dag processor tests)."""
import json
import os
import time
from datetime import datetime, timezone

from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG


def record(context):
    ti = context["ti"]
    path = os.environ["{record_env}"]
    line = {{"task_id": ti.task_id, "try_number": ti.try_number, "pid": os.getpid()}}
    with open(path, "a") as out:
        out.write(json.dumps({{**line, "event": "start"}}) + "\\n")
    time.sleep(float(os.environ.get("{seconds_env}", "0")))
    with open(path, "a") as out:
        out.write(json.dumps({{**line, "event": "done"}}) + "\\n")


with DAG(
    "{dag_id}",
    schedule=None,
    start_date={start_date},
    default_args={{"on_failure_callback": record, "on_retry_callback": record}},
):
    for task_id in {tasks!r}:
        EmptyOperator(task_id=task_id)
'''


def write_dag_file(dags: Path, *, tasks: tuple[str, ...] = TASKS, inflating: bool = False) -> Path:
    """
    The Dag file in ``dags``. ``inflating``: its start date is ``datetime.now()``, which the Dag version
    inflation check (3.2+) reports, and with ``dag_version_inflation_check_level = error`` refuses.
    """
    start_date = "datetime.now(tz=timezone.utc)" if inflating else "datetime(2025, 1, 1, tzinfo=timezone.utc)"
    source = _DAG_SOURCE.format(
        record_env=RECORD_ENV, seconds_env=SECONDS_ENV, dag_id=DAG_ID, start_date=start_date, tasks=tasks
    )
    dags.mkdir(parents=True, exist_ok=True)
    path = dags / DAG_FILE
    path.write_text(textwrap.dedent(source))
    return path


@dataclass(frozen=True)
class Ran:
    """What the callbacks wrote down: per task id, how many started and how many finished, and where."""

    started: Counter[str]
    done: Counter[str]
    #: (task id, pid) of each callback that started and has not finished
    unfinished: tuple[tuple[str, int], ...]

    @classmethod
    def read(cls, path: Path) -> Ran:
        lines = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        runs = Counter((line["task_id"], line["pid"]) for line in lines if line["event"] == "start")
        runs.subtract((line["task_id"], line["pid"]) for line in lines if line["event"] == "done")
        return cls(
            Counter(line["task_id"] for line in lines if line["event"] == "start"),
            Counter(line["task_id"] for line in lines if line["event"] == "done"),
            tuple(sorted(run for run, left in runs.items() if left > 0)),
        )

    @property
    def running(self) -> int:
        """Callbacks started and not finished whose process is still alive (a killed one never finishes)."""
        return sum(1 for _, pid in self.unfinished if _alive(pid))

    def first_pid(self) -> int | None:
        return self.unfinished[0][1] if self.unfinished else None


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def logged(home: Path, text: str) -> int:
    """How often ``text`` appears in the Dag processors' logs in ``home`` (managers' and file processors')."""
    logs = [*home.glob("*.log"), *(home / "logs").rglob("*.log")]
    return sum(log.read_text(errors="replace").count(text) for log in logs if log.is_file())


def stored_requests() -> int:
    """Callback requests for the Dag processor still in the metadata database."""
    from airflow.models.db_callback_request import DbCallbackRequest
    from airflow.utils.session import create_session

    with create_session(scoped=False) as reader:
        return int(reader.scalar(select(func.count()).select_from(DbCallbackRequest)) or 0)


def store_requests(tis: list[Any], session: Session) -> int:
    """
    The scheduler's own heartbeat-timeout purge, one pass over ``tis`` left as hung workers leave them:
    it stores one task callback request per task instance (on_failure_callback: no retries here).
    """
    runner = new_runner(session)
    make_stale(tis, runner, session)
    session.expire_all()  # the purge reads the hung tries as the database has them now
    if (error := purge_pass(runner)) is not None:
        raise error
    return stored_requests()


def dag_processor_env(home: Path, database_url: str, *, fix_enabled: bool, **config: str) -> dict[str, str]:
    """A Dag processor's environment here: Airflow on this database in ``home``, callbacks recording."""
    return {
        **command_env(
            dict(os.environ),
            str(home),
            database_url,
            AIRFLOW__HEARTBEAT_FIX__ENABLED=str(fix_enabled),
            PYTHONUNBUFFERED="1",
            TMPDIR=str(home / "tmp"),
        ),
        RECORD_ENV: str(home / "callbacks.jsonl"),
        SECONDS_ENV: str(CALLBACK_SECONDS),
        **config,
    }


def start_dag_processor(name: str, home: Path, *, fix_enabled: bool, **config: str) -> Component:
    """``airflow dag-processor`` in ``home``, in a process group of its own; output in ``home/NAME.log``."""
    from airflow import settings

    if settings.engine is None:
        raise RuntimeError("Airflow's metadata database is not configured in this process")
    (home / "tmp").mkdir(parents=True, exist_ok=True)
    database_url = settings.engine.url.render_as_string(hide_password=False)
    env = dag_processor_env(home, database_url, fix_enabled=fix_enabled, **config)
    # A plain `airflow dag-processor`: the airflow.policy hook activates the package (or not, by the switch).
    argv = [str(Path(sys.executable).with_name("airflow")), "dag-processor"]
    return Component.start(name, argv, env, home / f"{name}.log", cwd=home)


def wait_until_parsed(processor: Component, since: datetime) -> None:
    """Until ``processor`` has parsed the Dag file (its last parse is after ``since``): it is idle then."""
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session

    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        with create_session(scoped=False) as reader:
            parsed = reader.scalar(select(DagModel.last_parsed_time).where(DagModel.dag_id == DAG_ID))
        if parsed is not None and parsed > since:
            return
        if processor.popen.poll() is not None:
            raise RuntimeError(f"{processor.name} exited before parsing {DAG_FILE}:\n{processor.tail()}")
        time.sleep(0.2)
    raise TimeoutError(
        f"{processor.name} did not parse {DAG_FILE} in {START_TIMEOUT:.0f}s:\n{processor.tail()}"
    )


class KillAt(str, enum.Enum):
    #: the moment the stored requests are gone (stock deletes them when it fetches them)
    FETCH = "fetch"
    #: the moment the first callback has started
    FIRST_CALLBACK = "first-callback"


class Kill(str, enum.Enum):
    #: SIGKILL the Dag processor's manager (the ``airflow dag-processor`` process) alone: an OOM kill. Its
    #: file processor lives on, orphaned, next to the restarted Dag processor.
    MANAGER = "manager"
    #: SIGKILL its whole process group: an evicted pod, a lost node
    GROUP = "group"
    #: SIGKILL the file processor running the first callback; the manager lives on
    FILE_PROCESSOR = "file-processor"


@dataclass
class DagProcessorKill:
    """What :func:`kill_dag_processor` saw."""

    stored: int
    kill: Kill
    at: KillAt
    #: requests still stored, and callbacks started, at the kill
    stored_at_kill: int
    started_at_kill: int
    ran: Ran
    stored_at_end: int
    timeline: dict[str, float] = field(default_factory=dict)

    def summary(self) -> str:
        steps = ", ".join(f"{step} {at:.2f}" for step, at in self.timeline.items())
        return (
            f"{self.stored} requests stored; {self.kill.value} killed at {self.at.value} with "
            f"{self.stored_at_kill} still stored and {self.started_at_kill} callbacks started; in the end "
            f"{sum(self.ran.done.values())} finished of {sum(self.ran.started.values())} started "
            f"(started {dict(sorted(self.ran.started.items()))}), {self.stored_at_end} still stored; "
            f"seconds: {steps}"
        )


def _wait_for_kill_moment(processor: Component, at: KillAt, record: Path, stored: int) -> None:
    deadline = time.monotonic() + FETCH_TIMEOUT
    while time.monotonic() < deadline:
        if at is KillAt.FETCH and (stored_requests() < stored or FETCHED in processor.read_log()):
            return
        if at is KillAt.FIRST_CALLBACK and Ran.read(record).started:
            return
        if processor.popen.poll() is not None:
            raise RuntimeError(f"{processor.name} exited before the kill:\n{processor.tail()}")
        time.sleep(POLL)
    raise TimeoutError(f"{processor.name}: no {at.value} in {FETCH_TIMEOUT:.0f}s:\n{processor.tail()}")


def _kill(processor: Component, kill: Kill, record: Path) -> None:
    if kill is Kill.GROUP:
        processor.kill_group()
    elif kill is Kill.MANAGER:
        os.kill(processor.popen.pid, signal.SIGKILL)
        processor.popen.wait()
    else:
        pid = Ran.read(record).first_pid()
        if pid is None:
            raise RuntimeError("no callback has started: no file processor to kill")
        os.kill(pid, signal.SIGKILL)


def settle(processors: list[Component], record: Path, *, quiet_for: float) -> None:
    """Until no request is stored and no callback runs, then ``quiet_for`` seconds with nothing new."""
    deadline = time.monotonic() + START_TIMEOUT
    last, quiet_since = None, time.monotonic()
    while time.monotonic() < deadline:
        now = (stored_requests(), Ran.read(record))
        state = (now[0], sum(now[1].started.values()), sum(now[1].done.values()))
        if state != last:
            last, quiet_since = state, time.monotonic()
        elif state[0] == 0 and now[1].running == 0 and time.monotonic() - quiet_since >= quiet_for:
            return
        for processor in processors:
            if processor.popen.poll() is not None:
                raise RuntimeError(f"{processor.name} exited:\n{processor.tail()}")
        time.sleep(0.2)
    raise TimeoutError(
        f"callbacks still stored or running after {START_TIMEOUT:.0f}s (stored, started, done: {last})"
    )


def kill_dag_processor(
    tis: list[Any], session: Session, *, home: Path, kill: Kill, at: KillAt, fix_enabled: bool
) -> DagProcessorKill:
    """
    An idle ``airflow dag-processor`` (it has parsed the Dag file) gets one callback request per task
    instance of ``tis`` from the scheduler's purge; at ``at`` it is killed as ``kill`` says. A killed
    manager is restarted (a second ``airflow dag-processor``); a killed file processor leaves its manager
    running. Then until nothing is stored or running any more.
    """
    record = home / "callbacks.jsonl"
    processors: list[Component] = []
    started, timeline = time.monotonic(), dict[str, float]()
    try:
        since = datetime.now(tz=timezone.utc)
        first = start_dag_processor("dag-processor", home, fix_enabled=fix_enabled)
        processors.append(first)
        wait_until_parsed(first, since)
        timeline["parsed"] = time.monotonic() - started
        stored = store_requests(tis, session)
        timeline["stored"] = time.monotonic() - started
        _wait_for_kill_moment(first, at, record, stored)
        _kill(first, kill, record)
        timeline["killed"] = time.monotonic() - started
        stored_at_kill, started_at_kill = stored_requests(), sum(Ran.read(record).started.values())
        if kill is Kill.FILE_PROCESSOR:
            alive = [first]
        else:
            # A killed manager's orphaned file processor (if any) runs on next to the restarted one; the
            # finally below ends what is left of its group.
            since = datetime.now(tz=timezone.utc)
            restarted = start_dag_processor("restarted-dag-processor", home, fix_enabled=fix_enabled)
            processors.append(restarted)
            alive = [restarted]
            wait_until_parsed(restarted, since)
            timeline["restarted"] = time.monotonic() - started
        settle(alive, record, quiet_for=CALLBACK_SECONDS + 2)
        timeline["settled"] = time.monotonic() - started
        return DagProcessorKill(
            stored=stored,
            kill=kill,
            at=at,
            stored_at_kill=stored_at_kill,
            started_at_kill=started_at_kill,
            ran=Ran.read(record),
            stored_at_end=stored_requests(),
            timeline=timeline,
        )
    finally:
        for processor in processors:
            processor.stop()


def run_batch(
    tis: list[Any],
    session: Session,
    *,
    home: Path,
    fix_enabled: bool,
    first: str | None = None,
    **config: str,
) -> Ran:
    """
    The purge stores one callback request per task instance of ``tis`` (``first``: the task id whose
    request the Dag processor fetches first), then one ``airflow dag-processor`` (``config``: its extra
    environment) starts and runs them. What ran, once nothing is stored or running any more.

    The requests are stored before the Dag processor starts, so that the order is fixed before its first
    fetch; it re-parses the file every :data:`REPARSE_EVERY` seconds, so the batch waits at most that long
    behind the start-up parse of the same file.
    """
    record = home / "callbacks.jsonl"
    store_requests(tis, session)
    if first is not None:
        _fetched_first(first)
    processor = start_dag_processor(
        "dag-processor",
        home,
        fix_enabled=fix_enabled,
        AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL=str(REPARSE_EVERY),
        **config,
    )
    try:
        settle([processor], record, quiet_for=CALLBACK_SECONDS + 2)
        return Ran.read(record)
    finally:
        processor.stop()


#: ``[dag_processor] min_file_process_interval`` for :func:`run_batch` (the default is 30 s).
REPARSE_EVERY = 2


def _fetched_first(task_id: str) -> None:
    """
    Give the stored request for ``task_id`` the priority the Dag processor fetches first: the highest from
    3.1 on, the lowest on 3.0 (its fetch orders ascending). A file's batch keeps the fetch order.
    """
    from airflow import __version__
    from airflow.callbacks.callback_requests import TaskCallbackRequest
    from airflow.models.db_callback_request import DbCallbackRequest
    from airflow.utils.session import create_session

    ascending = __version__.startswith("3.0.")
    with create_session(scoped=False) as writer:
        for row in writer.scalars(select(DbCallbackRequest)):
            request = row.get_callback_request()
            is_first = isinstance(request, TaskCallbackRequest) and request.ti.task_id == task_id
            row.priority_weight = (1 if is_first else 100) if ascending else (100 if is_first else 1)
