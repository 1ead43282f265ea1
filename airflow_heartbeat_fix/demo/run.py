"""
One demo run (:class:`DemoRun`: prepare, start, trigger, watch, stop) and when to stop watching it.

Each run gets a fresh ``AIRFLOW_HOME`` and database, the demo Dags, and the real ``airflow api-server``
(execution API only), ``airflow dag-processor`` and ``airflow scheduler`` (LocalExecutor) of this
environment, with a short task heartbeat timeout. A :class:`~.topology.Topology` can ask for the
CeleryExecutor instead (Redis broker, two ``airflow celery worker``) and for more than one scheduler
(HA). Both Dags' tasks freeze their own supervisor, so the scheduler fails them on heartbeat timeout.
The stock run has ``AIRFLOW__HEARTBEAT_FIX__ENABLED=False``, the fixed run ``True``.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_heartbeat_fix.demo import alerts
from airflow_heartbeat_fix.demo.config import DemoConfig, DemoError
from airflow_heartbeat_fix.demo.database import Db, mark_database_as_demo, read_outcomes, sqlite_url
from airflow_heartbeat_fix.demo.environment import isolated_env, prepare_home
from airflow_heartbeat_fix.demo.logs import (
    celery_worker_ready,
    count_events_set_aside,
    count_fix_actions,
    count_running_tries_failed_by_event,
    find_crash_time,
    find_fix_summary,
    find_scheduler_crash,
    marks_from_logs,
    read_jsonl,
)
from airflow_heartbeat_fix.demo.processes import Component, Processes, free_port, http_ok
from airflow_heartbeat_fix.demo.progress import Progress, progress_line, run_phase
from airflow_heartbeat_fix.demo.records import CALLBACK_LOG_NAME, DAG_CALLBACK_LOG_NAME, EMAIL_LOG_NAME
from airflow_heartbeat_fix.demo.result import (
    KILLED_DAG_ID,
    KILLED_RUNS,
    MANY_TASKS,
    DagOutcome,
    RunResult,
    scenario_dag_ids,
    state_changes,
    try_states,
)
from airflow_heartbeat_fix.demo.topology import (
    DAG_PROCESSOR,
    KILL_DAG_PROCESSOR,
    KILLS,
    MANY,
    component_commands,
    executor_env,
    is_celery_worker,
    is_scheduler,
    kill_target,
)
from airflow_heartbeat_fix.demo.verdicts import (
    all_runs_terminal,
    callbacks_complete,
    fixed_problems,
    stock_reproduced,
)

if TYPE_CHECKING:
    from pathlib import Path


def should_stop(
    *,
    since_trigger: float,
    crashed_for: float | None,
    exited: bool,
    terminal_for: float | None,
    quiet_for: float,
    callbacks_complete: bool,
    timeout: float,
    settle: float,
) -> str | None:
    """
    Why to stop watching a run now, or None to keep waiting.

    Once every Dag run is finished, watch at least ``settle`` seconds (and ``settle / 2`` without any
    change) for late or duplicate callbacks; up to ``4 * settle`` while a finished try still misses its
    callback or email, which the Dag processor runs asynchronously.
    """
    if crashed_for is not None and crashed_for >= min(settle, 5.0):
        return "scheduler crashed"
    if exited and crashed_for is None:
        return "scheduler exited"
    if terminal_for is not None and terminal_for >= settle and quiet_for >= settle / 2:
        if callbacks_complete:
            return "Dag runs finished, callbacks settled"
        if terminal_for >= 4 * settle:
            return "Dag runs finished, callbacks missing"
    if since_trigger >= timeout:
        return f"timed out after {timeout:.0f} s"
    return None


@dataclass
class _Watch:
    """What :meth:`DemoRun.watch` carries from one poll to the next (times are ``time.monotonic()``)."""

    #: The schedulers still to watch: a killed one is dropped, its death is the scenario.
    schedulers: list[Component]
    kill_pending: bool
    states: dict[tuple[str, int], str | None] = field(default_factory=dict)
    crashed_at: float | None = None
    terminal_at: float | None = None
    last_change: float = field(default_factory=time.monotonic)
    last_seen: Any = None

    @property
    def exit_code(self) -> int | None:
        """The first watched scheduler's exit code, ``None`` while they all run."""
        return next((code for c in self.schedulers if (code := c.exit_code()) is not None), None)


class DemoRun:
    """
    One run, stock or fixed: owns its home, environment, Airflow processes, database and result from
    :meth:`prepare` to :meth:`stop`; :meth:`execute` goes through all of them and always stops.
    """

    def __init__(self, config: DemoConfig, label: str, features: dict[str, Any]) -> None:
        self.config = config
        self.fix_enabled = label == "fixed"
        self.home = (config.home / label).resolve()
        self.database_url = config.database or sqlite_url(self.home / "airflow.db")
        self.port = free_port()
        self.queue = f"hbfix-demo-{label}-{uuid.uuid4().hex[:8]}"
        self.dag_ids = scenario_dag_ids(config.topology.scenario)
        base = isolated_env(
            config, self.home, fix_enabled=self.fix_enabled, database_url=self.database_url, port=self.port
        )
        self.env = {**base, **executor_env(config.topology, database_url=self.database_url, queue=self.queue)}
        self.procs = Processes(marker=f"{label}-{uuid.uuid4()}")
        self.progress = Progress(f"{label} {config.airflow_version}")
        self.db: Db | None = None
        self._triggered = time.monotonic(), time.time()  # set again when the Dags are triggered
        self.result = RunResult(
            label=label,
            fix_enabled=self.fix_enabled,
            airflow_version=config.airflow_version,
            database=config.db_label,
            topology=config.topology.label,
            scenario=config.topology.scenario,
            many_expected=MANY_TASKS if config.topology.scenario == MANY else 0,
            home=str(self.home),
            needed_fixes=dict(features.get("needed_fixes", {})),
            emails_via_backend=bool(features.get("emails_via_backend", True)),
        )

    @property
    def airflow(self) -> str:
        return str(self.config.airflow_bin)

    def execute(self) -> RunResult:
        started = time.monotonic()
        try:
            self.prepare()
            self.start()
            self.trigger()
            self.watch()
        finally:
            self.stop()
            self.result.elapsed_seconds = time.monotonic() - started
            left = self.result.leftover_pids
            self.progress.done(
                f"stopped: {self.result.stop_reason or 'setup failed or interrupted'}"
                + (f"; WARNING: processes left: {left}" if left else "")
            )
        if self.fix_enabled:
            self.result.problems = fixed_problems(self.result)
        else:
            self.result.reproduced = stock_reproduced(self.result)
        return self.result

    def prepare(self) -> None:
        """A fresh home with the Dags, and a fresh database (see :meth:`prepare_database`)."""
        prepare_home(self.home, self.config.dag_sources, self.config.plugin_sources)
        self.progress.update("preparing database", self.config.db_label)
        self.prepare_database()
        self.db = Db(self.database_url, self.dag_ids)

    def prepare_database(self) -> None:
        """A copy of a migrated SQLite template, or ``airflow db reset -y`` of ``--database``."""
        home, config = self.home, self.config
        if config.database is None:
            template = config.home / "template" / f"airflow-{config.airflow_version}.db"
            if not template.exists():
                self._migrate_template(template)
            shutil.copyfile(template, home / "airflow.db")
            return
        log = home / "logs" / "db-reset.log"
        if self.procs.run([[self.airflow, "db", "reset", "-y"]], self.env, log, home, timeout=300) != [0]:
            raise DemoError(f"airflow db reset failed; see {log}")
        mark_database_as_demo(config.database)

    def _migrate_template(self, template: Path) -> None:
        """Migrate under another name and rename when done: an interrupted migration is never reused."""
        partial = template.with_suffix(".partial")
        partial.parent.mkdir(parents=True, exist_ok=True)
        partial.unlink(missing_ok=True)
        template_env = {**self.env, "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": sqlite_url(partial)}
        log = self.home / "logs" / "db-migrate.log"
        argv = [self.airflow, "db", "migrate"]
        if self.procs.run([argv], template_env, log, self.home, timeout=300) != [0]:
            partial.unlink(missing_ok=True)
            raise DemoError(f"airflow db migrate failed; see {log}")
        partial.replace(template)

    def start(self, ready_within: float = 180.0) -> None:
        """
        Start the API server, Dag processor, scheduler(s) and Celery workers of the topology; wait for
        the API, both parsed Dags and every worker.
        """
        logs, home = self.home / "logs", self.home
        commands = component_commands(
            self.config.topology, self.airflow, port=self.port, home=home, queue=self.queue
        )
        for name, argv in commands:
            self.procs.start(name, argv, self.env, logs / f"{name}.out", home)
        # A topology of six Airflow processes on two cores starts slowly.
        self._wait_until_ready(deadline=time.monotonic() + ready_within * max(1, len(commands) / 3))

    def _schedulers(self) -> list[Component]:
        return [c for name, c in self.procs.components.items() if is_scheduler(name)]

    def _check_components(self) -> None:
        for name, component in self.procs.components.items():
            if component.exit_code() is not None:
                what = "exited early" if is_scheduler(name) else f"exited with code {component.exit_code()}"
                raise DemoError(f"{name} {what}; see {component.log_path}")

    def _waiting_for(self, api_ready: bool) -> list[str]:
        """What the run still waits for before the trigger: the API, a Dag's parse, a Celery worker."""
        assert self.db is not None
        try:
            parsed = self.db.serialized_dag_ids()
        except Exception:  # tables appear while the components start
            parsed = set()
        waiting = [] if api_ready else ["execution API"]
        waiting += [f"parse of {dag_id}" for dag_id in sorted(set(self.dag_ids) - parsed)]
        waiting += [
            name
            for name, c in self.procs.components.items()
            if is_celery_worker(name) and not celery_worker_ready(c.read_log())
        ]
        return waiting

    def _wait_until_ready(self, deadline: float) -> None:
        api_ready = False
        while time.monotonic() < deadline:
            self.procs.track()
            self._check_components()
            api_ready = api_ready or http_ok(f"http://127.0.0.1:{self.port}/execution/health")
            waiting = self._waiting_for(api_ready)
            if not waiting:
                return
            self.progress.update("starting Airflow", "waiting for " + ", ".join(waiting))
            time.sleep(1.0)
        raise DemoError("Airflow components did not become ready in time")

    def trigger(self) -> None:
        """Unpause (in the database) and trigger (``airflow dags trigger``, concurrently) both Dags."""
        assert self.db is not None
        self.progress.update("triggering Dags", ", ".join(self.dag_ids))
        self.db.unpause()
        self._triggered = time.monotonic(), time.time()
        log = self.home / "logs" / "trigger.log"
        argvs = [[self.airflow, "dags", "trigger", dag_id] for dag_id in self.dag_ids]
        if self.config.topology.scenario == KILL_DAG_PROCESSOR:
            trigger = [self.airflow, "dags", "trigger", KILLED_DAG_ID, "--run-id"]
            argvs = [[*trigger, run_id] for run_id in KILLED_RUNS]
        codes = self.procs.run(argvs, self.env, log, self.home, timeout=120)
        if any(code != 0 for code in codes):
            raise DemoError(f"airflow dags trigger failed (exit codes {codes}); see {log}")

    def watch(self) -> None:
        """Poll the database and the schedulers' logs every second until :func:`should_stop` says why."""
        watching = _Watch(self._schedulers(), kill_pending=self.config.topology.scenario in KILLS)
        while True:
            self.procs.track()
            now = time.monotonic()
            dags = self._poll_outcomes(watching, now)
            self._inject_scenario(watching, now)
            self._watch_schedulers(watching, now)
            if all_runs_terminal(dags):
                watching.terminal_at = watching.terminal_at or now
                if self.result.converge_seconds is None:
                    self.result.converge_seconds = now - self._triggered[0]
            reason = self._stop_reason(watching, dags, now)
            if reason is not None:
                self._finish(reason, watching)
                return
            phase = "scheduler crashed; collecting callbacks" if watching.crashed_at else run_phase(dags)
            self.progress.update(phase, progress_line(dags))
            time.sleep(1.0)

    def _poll_outcomes(self, watching: _Watch, now: float) -> dict[str, DagOutcome]:
        """Read the Dag runs; record the tries that changed state, and when anything last changed."""
        assert self.db is not None
        result, since_trigger = self.result, now - self._triggered[0]
        with contextlib.suppress(Exception):  # SQLite can be locked for a moment: keep the last snapshot
            result.dags = read_outcomes(self.db, self.home)
        now_states = try_states(result.dags)
        result.timeline += state_changes(watching.states, now_states, since_trigger)
        watching.states = now_states
        result.watched_seconds = since_trigger
        seen = {d: (o.callbacks, o.emails, o.tries, o.run_state) for d, o in result.dags.items()}
        if seen != watching.last_seen:
            watching.last_seen, watching.last_change = seen, now
        return result.dags

    def _inject_scenario(self, watching: _Watch, now: float) -> None:
        """A kill scenario: SIGKILL its target once, as soon as there is one."""
        if not watching.kill_pending or (victim := self._kill_target()) is None:
            return
        watching.kill_pending = False
        self._kill(victim, now - self._triggered[0])
        watching.schedulers = [s for s in watching.schedulers if s.name != victim]
        if victim == DAG_PROCESSOR:  # an OOM-killed or evicted Dag processor comes back
            argv = dict(
                component_commands(
                    self.config.topology, self.airflow, port=self.port, home=self.home, queue=self.queue
                )
            )[DAG_PROCESSOR]
            name = f"{DAG_PROCESSOR}-2"
            self.procs.start(name, argv, self.env, self.home / "logs" / f"{name}.out", self.home)
            self.result.injected.append(f"restarted {DAG_PROCESSOR} as {name}")

    def _watch_schedulers(self, watching: _Watch, now: float) -> None:
        """The fixes each scheduler logged, and whether one crashed or exited (the first stands for all)."""
        result, (triggered, triggered_at) = self.result, self._triggered
        result.scheduler.actions = count_fix_actions(s.read_log() for s in watching.schedulers)
        set_aside, failed_by_event = 0, 0
        for scheduler in watching.schedulers:
            scheduler_log = scheduler.read_log()
            set_aside += count_events_set_aside(scheduler_log)
            failed_by_event += count_running_tries_failed_by_event(scheduler_log)
            result.scheduler.fixes = result.scheduler.fixes or find_fix_summary(scheduler_log)
            error = find_scheduler_crash(scheduler_log)
            if error is not None and watching.crashed_at is None:
                watching.crashed_at = now
                named = error if len(watching.schedulers) == 1 else f"{scheduler.name}: {error}"
                result.scheduler.crashed, result.scheduler.error = True, named
                logged_at = find_crash_time(scheduler_log)
                result.crashed_after = now - triggered if logged_at is None else logged_at - triggered_at
        result.scheduler.exit_code = watching.exit_code
        result.events_set_aside, result.running_tries_failed_by_event = set_aside, failed_by_event

    def _stop_reason(self, watching: _Watch, dags: dict[str, DagOutcome], now: float) -> str | None:
        return should_stop(
            since_trigger=now - self._triggered[0],
            crashed_for=None if watching.crashed_at is None else now - watching.crashed_at,
            exited=watching.exit_code is not None,
            terminal_for=None if watching.terminal_at is None else now - watching.terminal_at,
            quiet_for=now - watching.last_change,
            callbacks_complete=callbacks_complete(dags, self.result.emails_via_backend)
            and self._alerts_complete(),
            timeout=self.config.timeout,
            settle=self.config.settle,
        )

    def _alerts(self) -> tuple[dict[str, str | None], list[dict[str, Any]]]:
        """``kill-dag-processor``: the Dag runs' states and the alerts' lines (empty for other scenarios)."""
        if self.config.topology.scenario != KILL_DAG_PROCESSOR or self.db is None:
            return {}, []
        with contextlib.suppress(Exception):  # the database is busy for a moment: nothing new yet
            return self.db.dag_run_states(), read_jsonl(self.home / DAG_CALLBACK_LOG_NAME)
        return {}, []

    def _alerts_complete(self) -> bool:
        runs, lines = self._alerts()
        return alerts.alerts_complete(runs, alerts.done(lines))

    def _finish(self, reason: str, watching: _Watch) -> None:
        """Why the watch ended, whether the run converged, and every callback and email as a mark."""
        result = self.result
        runs, lines = self._alerts()
        result.killed_runs, result.dag_callbacks_started = runs, alerts.started(lines)
        result.dag_callbacks_done = alerts.done(lines)
        result.stop_reason = reason
        result.converged = watching.terminal_at is not None and not result.scheduler.crashed
        result.marks = marks_from_logs(
            read_jsonl(self.home / CALLBACK_LOG_NAME),
            read_jsonl(self.home / EMAIL_LOG_NAME),
            self._triggered[1],
        )

    def _kill_target(self) -> str | None:
        assert self.db is not None
        try:
            tis = self.db.current_tis()
        except Exception:  # the database is busy for a moment: try again next second
            return None
        logs = {name: c.read_log() for name, c in self.procs.components.items()}
        runs, lines = self._alerts()
        return kill_target(
            self.config.topology.scenario,
            tis,
            logs,
            runs=runs,
            alerts_started=sum(alerts.started(lines).values()),
        )

    def _kill(self, name: str, seconds: float) -> None:
        """SIGKILL ``name`` and everything in its process group, as the OOM killer or a node loss would."""
        self.procs.kill(name)
        self.result.injected.append(f"SIGKILL {name} at {seconds:.0f} s")
        self.progress.update("injected", f"SIGKILL {name}")

    def stop(self) -> None:
        """Stop every process of this run (even on a second Ctrl-C) and close the database engine."""
        self.progress.update("stopping Airflow components")
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not skip this
        try:
            self.procs.stop_all()
            self.result.leftover_pids = self.procs.leftovers()
        finally:
            signal.signal(signal.SIGINT, previous)
        if self.db is not None:
            self.db.dispose()
