"""
One demo run (:class:`DemoRun`: prepare, start, trigger, watch, stop) and the pure decisions it takes.

Each run gets a fresh ``AIRFLOW_HOME`` and database, the demo Dags, and the real ``airflow api-server``
(execution API only), ``airflow dag-processor`` and ``airflow scheduler`` (LocalExecutor) of this
environment, with a short task heartbeat timeout. A :class:`Topology` can ask for the CeleryExecutor
instead (Redis broker, two ``airflow celery worker``) and for more than one scheduler (HA).
Both Dags' tasks freeze their own supervisor, so the scheduler fails them on heartbeat timeout. The
stock run has ``AIRFLOW__HEARTBEAT_FIX__ENABLED=False``, the fixed run ``True``.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import sys
import time
import uuid
from dataclasses import dataclass, field
from importlib import metadata, resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_heartbeat_fix.demo import report
from airflow_heartbeat_fix.demo.processes import Component, Processes, free_port, http_ok
from airflow_heartbeat_fix.demo.records import CALLBACK_LOG_NAME, EMAIL_LOG_NAME, SUBJECT_TEMPLATE
from airflow_heartbeat_fix.demo.topology import (
    KILLS,
    LOCAL,
    MANY,
    Topology,
    component_commands,
    db_label,
    executor_env,
    is_celery_worker,
    is_scheduler,
    kill_target,
)

if TYPE_CHECKING:
    from collections.abc import Mapping
    from importlib.resources.abc import Traversable

#: The top-level ``dags/``, installed as this package (``package-dir`` in pyproject.toml).
DAGS_PACKAGE = "airflow_heartbeat_fix.demo.dags"
EMAIL_BACKEND = "airflow_heartbeat_fix.demo.records.send_email"
LABELS = ("stock", "fixed")


@dataclass(frozen=True)
class DemoConfig:
    home: Path
    database: str | None
    dags_origin: str
    dag_sources: dict[str, str]
    airflow_bin: Path
    airflow_version: str
    heartbeat_timeout: int
    detection_interval: int
    timeout: float
    settle: float
    runs: tuple[str, ...]
    json_path: Path | None
    html_path: Path | None = None
    reset_database: bool = False
    topology: Topology = field(default_factory=Topology)

    @property
    def db_label(self) -> str:
        return db_label(self.database)


class DemoError(Exception):
    """A setup step failed; the message says which."""


class UsageError(DemoError):
    """The demo refuses to start: an option, path or database it must not or cannot use."""


# --- small pure helpers ---------------------------------------------------------------------------


def cache_dir(environ: Mapping[str, str]) -> Path:
    """The per-user cache directory (XDG): demo homes (45-50 MB each) stay out of the working directory."""
    base = environ.get("XDG_CACHE_HOME") or str(Path(environ.get("HOME") or Path.home()) / ".cache")
    return Path(base) / "airflow-heartbeat-fix"


def default_home(cache: Path, airflow_version: str, database: str | None, executor: str = LOCAL) -> Path:
    suffix = "" if executor == LOCAL else f"-{executor}"
    return cache / "demo" / f"{airflow_version}-{db_label(database)}{suffix}"


def sqlite_url(path: Path) -> str:
    return f"sqlite:///{path}"


def airflow_env(
    base: dict[str, str],
    *,
    home: Path,
    database_url: str,
    api_port: int,
    fix_enabled: bool,
    heartbeat_timeout: int,
    detection_interval: int,
    jwt_secret: str,
) -> dict[str, str]:
    """The environment of every Airflow command of one run: isolated from the caller's Airflow config."""
    env = {k: v for k, v in base.items() if not k.startswith(("AIRFLOW", "_AIRFLOW"))}
    env.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            # Frozen tries keep their LocalExecutor worker busy for good: 4 tries in all, so 8 is plenty.
            "AIRFLOW__CORE__PARALLELISM": "8",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{api_port}/execution/",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": database_url,
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(api_port),
            "AIRFLOW__API_AUTH__JWT_SECRET": jwt_secret,
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": str(heartbeat_timeout),
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": str(detection_interval),
            "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            "AIRFLOW__DAG_PROCESSOR__BUNDLE_REFRESH_CHECK_INTERVAL": "1",
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "60",
            "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
            "AIRFLOW__EMAIL__EMAIL_BACKEND": EMAIL_BACKEND,
            "AIRFLOW__EMAIL__SUBJECT_TEMPLATE": str(home / "email_subject.j2"),
            "AIRFLOW__HEARTBEAT_FIX__ENABLED": str(fix_enabled),
            "PYTHONUNBUFFERED": "1",
            "TMPDIR": str(home / "tmp"),  # whatever the components write to a temp dir stays in the home
        }
    )
    return env


def bytecode_env(env: dict[str, str], *, airflow_compiled: bool, cache_dir: Path) -> dict[str, str]:
    """
    Without compiled bytecode in the venv and with ``PYTHONDONTWRITEBYTECODE`` set, every Airflow command
    would compile all of Airflow again: then let them cache bytecode under ``cache_dir`` (in the demo home).
    """
    if airflow_compiled or not env.get("PYTHONDONTWRITEBYTECODE"):
        return env
    out = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    out["PYTHONPYCACHEPREFIX"] = str(cache_dir)
    return out


def airflow_is_compiled() -> bool:
    """Whether the installed Airflow has bytecode next to its sources for this interpreter."""
    from importlib.util import find_spec

    spec = find_spec("airflow")
    if spec is None or spec.origin is None:
        return False
    return (
        Path(spec.origin).parent / "__pycache__" / f"__init__.{sys.implementation.cache_tag}.pyc"
    ).exists()


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


# --- locating things ------------------------------------------------------------------------------


def find_dag_sources(
    explicit: Path | None, dag_ids: tuple[str, ...] = report.DAG_IDS
) -> tuple[str, dict[str, str]]:
    """Where the demo Dags come from (``--dags``, else the installed package data), and their sources."""
    folder: Traversable | Path = explicit if explicit is not None else resources.files(DAGS_PACKAGE)
    names = [f"{dag_id}.py" for dag_id in dag_ids]
    missing = [name for name in names if not (folder / name).is_file()]
    if missing:
        raise UsageError(f"--dags {folder} lacks {', '.join(missing)}")
    return str(folder), {name: (folder / name).read_text(encoding="utf-8") for name in names}


def airflow_executable() -> Path:
    path = Path(sys.executable).parent / "airflow"
    if not path.exists():
        raise DemoError(f"no airflow executable next to {sys.executable}")
    return path


def installed_airflow_version() -> str:
    for dist in ("apache-airflow-core", "apache-airflow"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    raise DemoError("Airflow is not installed in this environment")


# --- progress -------------------------------------------------------------------------------------


class Progress:
    """One status line on stderr: rewritten in place on a terminal, every few seconds otherwise."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.tty = sys.stderr.isatty()
        self.started = time.monotonic()
        self._last_text = ""
        self._last_print = 0.0

    def update(self, phase: str, detail: str = "") -> None:
        elapsed = time.monotonic() - self.started
        text = f"[{self.label}] {elapsed:5.0f}s  {phase}" + (f"  | {detail}" if detail else "")
        now = time.monotonic()
        if self.tty:
            sys.stderr.write("\r\x1b[2K" + text[: shutil.get_terminal_size().columns - 1])
            sys.stderr.flush()
        elif text.split("s  ", 1)[-1] != self._last_text or now - self._last_print >= 10:
            sys.stderr.write(text + "\n")
            sys.stderr.flush()
            self._last_print = now
        self._last_text = text.split("s  ", 1)[-1]

    def done(self, message: str) -> None:
        if self.tty:
            sys.stderr.write("\r\x1b[2K")
        sys.stderr.write(f"[{self.label}] {time.monotonic() - self.started:5.0f}s  {message}\n")
        sys.stderr.flush()


# --- database reads -------------------------------------------------------------------------------


class Db:
    """Read-only, short queries against one run's metadata database."""

    def __init__(self, url: str, dag_ids: tuple[str, ...] = report.DAG_IDS) -> None:
        from sqlalchemy import create_engine

        self.dag_ids = dag_ids
        self.engine = create_engine(url, poolclass=_null_pool())
        self._columns: dict[str, list[str]] = {}

    def columns(self, table: str) -> list[str]:
        if table not in self._columns:
            from sqlalchemy import inspect

            inspector = inspect(self.engine)
            names = inspector.get_table_names()
            self._columns[table] = [c["name"] for c in inspector.get_columns(table)] if table in names else []
        return self._columns[table]

    def rows(self, table: str, wanted: tuple[str, ...]) -> list[dict[str, Any]]:
        from sqlalchemy import bindparam, text

        present = [c for c in wanted if c in self.columns(table)]
        if not present:
            return []
        query = text(f"SELECT {', '.join(present)} FROM {table} WHERE dag_id IN :dag_ids").bindparams(
            bindparam("dag_ids", expanding=True)
        )
        with self.engine.connect() as conn:
            return [dict(r._mapping) for r in conn.execute(query, {"dag_ids": list(self.dag_ids)})]

    def current_tis(self) -> list[dict[str, Any]]:
        return self.rows("task_instance", ("id", "dag_id", "try_number", "state", "external_executor_id"))

    def serialized_dag_ids(self) -> set[str]:
        return {str(r["dag_id"]) for r in self.rows("serialized_dag", ("dag_id",))}

    def unpause(self) -> None:
        from sqlalchemy import bindparam, text

        query = text("UPDATE dag SET is_paused = :false WHERE dag_id IN :dag_ids").bindparams(
            bindparam("dag_ids", expanding=True)
        )
        with self.engine.begin() as conn:
            conn.execute(query, {"false": False, "dag_ids": list(self.dag_ids)})

    def dispose(self) -> None:
        self.engine.dispose()


def _null_pool() -> Any:
    from sqlalchemy.pool import NullPool

    return NullPool


def read_outcomes(db: Db, home: Path) -> dict[str, report.DagOutcome]:
    # Airflow 3.4 calls map_index region_index.
    ti_cols: tuple[str, ...] = ("dag_id", "task_id", "map_index", "region_index", "try_number", "state")
    ti_cols += ("working_set", "archived_reason")
    ti_rows = [_mapped_task_id(r) for r in db.rows("task_instance", ti_cols)]
    history_cols = ("dag_id", "task_id", "map_index", "region_index", "try_number", "state")
    history = [_mapped_task_id(r) for r in db.rows("task_instance_history", history_cols)]
    runs = db.rows("dag_run", ("dag_id", "run_id", "state"))
    callbacks = report.parse_jsonl(_read(home / CALLBACK_LOG_NAME))
    emails = report.parse_jsonl(_read(home / EMAIL_LOG_NAME))
    outcomes: dict[str, report.DagOutcome] = {}
    for run in runs:
        dag_id = str(run["dag_id"])
        outcomes[dag_id] = report.DagOutcome(
            dag_id=dag_id,
            run_state=report.state_name(run["state"]),
            tries=report.tries_from_rows(ti_rows, history, dag_id),
            callbacks=report.count_callbacks(callbacks, dag_id),
            emails=report.count_emails(emails, dag_id),
            per_map_index=report.count_per_map_index(callbacks, dag_id),
        )
    return outcomes


def _mapped_task_id(row: dict[str, Any]) -> dict[str, Any]:
    """A mapped task instance's row with ``stall[7]`` as its task id, so each map index has its tries."""
    index = row.get("map_index", row.get("region_index"))
    if index is None or int(index) < 0:
        return row
    return {**row, "task_id": f"{row['task_id']}[{index}]"}


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


# --- one run ------------------------------------------------------------------------------------


def prepare_home(home: Path, dag_sources: dict[str, str]) -> None:
    if home.exists():
        shutil.rmtree(home)
    for sub in ("logs", "tmp", "dags"):
        (home / sub).mkdir(parents=True)
    for name, text in dag_sources.items():
        (home / "dags" / name).write_text(text, encoding="utf-8")
    (home / "email_subject.j2").write_text(SUBJECT_TEMPLATE, encoding="utf-8")


#: Created in a ``--database`` right after the demo reset it: a later demo may reset it again unasked.
DEMO_TABLE = "airflow_heartbeat_fix_demo"


def database_tables(url: str) -> list[str]:
    """The tables of the database at ``url``."""
    from sqlalchemy import create_engine, inspect

    engine = create_engine(url, poolclass=_null_pool())
    try:
        return sorted(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def display_url(url: str) -> str:
    """``url`` with its password masked, for messages."""
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


#: Rows the demo never writes: in a database it marked, any of them came from someone else.
FOREIGN_ROWS = {"variable": "variables", "connection": "connections"}


def foreign_data(url: str, tables: list[str]) -> list[str]:
    """What a database the demo marked holds that it did not write: other Dags, variables, connections."""
    from sqlalchemy import bindparam, create_engine, text

    engine = create_engine(url, poolclass=_null_pool())
    found: list[str] = []
    try:
        with engine.connect() as conn:
            if "dag" in tables:
                query = text("SELECT dag_id FROM dag WHERE dag_id NOT IN :ours ORDER BY dag_id").bindparams(
                    bindparam("ours", expanding=True)
                )
                every_demo_dag = list(report.scenario_dag_ids(report.MANY_SCENARIO))
                others = list(conn.execute(query, {"ours": every_demo_dag}).scalars())
                if others:
                    found.append(f"Dags {', '.join(others[:5])}{', ...' if len(others) > 5 else ''}")
            for table, what in FOREIGN_ROWS.items():
                if table in tables and (
                    count := conn.execute(text(f"SELECT COUNT(*) FROM {table}")).scalar()
                ):
                    found.append(f"{count} {what}")
    finally:
        engine.dispose()
    return found


def database_refusal(
    tables: list[str], url: str, *, reset_allowed: bool, foreign: list[str] | None = None
) -> str | None:
    """
    Why the demo must not reset this database, or None: empty, made by the demo and holding nothing
    else (``foreign``: :func:`foreign_data`), or reset allowed.
    """
    if not tables or reset_allowed:
        return None
    if DEMO_TABLE in tables:
        if not foreign:
            return None
        return (
            f"{display_url(url)} was a demo database but now holds data the demo did not write "
            f"({'; '.join(foreign)}); it would drop it (airflow db reset). Pass --reset-database to allow "
            "that, or use an empty database"
        )
    shown = ", ".join(tables[:5]) + (", ..." if len(tables) > 5 else "")
    return (
        f"{display_url(url)} already has {len(tables)} tables ({shown}) the demo did not create; it "
        "would drop Airflow's tables and their data (airflow db reset). Pass --reset-database to allow "
        "that, or use an empty database"
    )


def mark_database_as_demo(url: str) -> None:
    from sqlalchemy import create_engine, text

    engine = create_engine(url, poolclass=_null_pool())
    try:
        with engine.begin() as conn:
            conn.execute(text(f"CREATE TABLE IF NOT EXISTS {DEMO_TABLE} (note VARCHAR(100))"))
    finally:
        engine.dispose()


def ensure_database_exists(url: str) -> None:
    """Create the PostgreSQL database of ``url`` (through the ``postgres`` database) if it is missing."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import OperationalError

    engine = create_engine(url, poolclass=_null_pool())
    try:
        with engine.connect():
            return
    except OperationalError as exc:
        if "does not exist" not in str(exc):
            reason = str(exc).strip().splitlines()[0]  # without SQLAlchemy's "Background on this error" line
            raise DemoError(f"cannot connect to {make_url(url).render_as_string()}: {reason}") from exc
    finally:
        engine.dispose()
    target = make_url(url)
    maintenance = target.set(database="postgres")
    admin = create_engine(maintenance, isolation_level="AUTOCOMMIT", poolclass=_null_pool())
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{target.database}"'))
    finally:
        admin.dispose()


def run_phase(dags: dict[str, report.DagOutcome]) -> str:
    tries = [t for d in dags.values() for t in d.tries]
    if not dags:
        return "waiting for Dag runs"
    if not tries or all(t.state in (None, "scheduled", "queued") for t in tries):
        return "waiting for tasks to start"
    if any(t.state == "running" and t.try_number == 1 for t in tries):
        return "task frozen; waiting for heartbeat timeout"
    if report.all_runs_terminal(dags):
        return "Dag runs finished; waiting for late callbacks"
    return "waiting for retries"


def isolated_env(
    config: DemoConfig, home: Path, *, fix_enabled: bool, database_url: str, port: int
) -> dict[str, str]:
    """:func:`airflow_env` for one home, with bytecode cached in the demo home when Airflow has none."""
    env = airflow_env(
        dict(os.environ),
        home=home,
        database_url=database_url,
        api_port=port,
        fix_enabled=fix_enabled,
        heartbeat_timeout=config.heartbeat_timeout,
        detection_interval=config.detection_interval,
        jwt_secret=secrets.token_urlsafe(32),
    )
    return bytecode_env(env, airflow_compiled=airflow_is_compiled(), cache_dir=config.home / "pycache")


def probe_features(config: DemoConfig) -> dict[str, Any]:
    """
    What this Airflow needs and does (:mod:`.features`), read in a child process with an isolated home.

    Runs once per demo, before the runs: the stock verdict and the email counts depend on it.
    """
    home = config.home / "probe"
    home.mkdir(parents=True, exist_ok=True)
    out = home / "features.json"
    out.unlink(missing_ok=True)
    env = isolated_env(config, home, fix_enabled=False, database_url=sqlite_url(home / "airflow.db"), port=0)
    procs = Processes(marker=f"probe-{uuid.uuid4()}")
    log = home / "features.log"
    argv = [sys.executable, "-m", "airflow_heartbeat_fix.demo.features", str(out)]
    try:
        codes = procs.run([argv], env, log, home, timeout=300)
    finally:
        procs.stop_all()
    if codes != [0] or not out.exists():
        raise DemoError(f"could not read what this Airflow needs; see {log}")
    features: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    return features


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
        self.dag_ids = report.scenario_dag_ids(config.topology.scenario)
        base = isolated_env(
            config, self.home, fix_enabled=self.fix_enabled, database_url=self.database_url, port=self.port
        )
        self.env = {**base, **executor_env(config.topology, database_url=self.database_url, queue=self.queue)}
        self.procs = Processes(marker=f"{label}-{uuid.uuid4()}")
        self.progress = Progress(f"{label} {config.airflow_version}")
        self.db: Db | None = None
        self._triggered = time.monotonic(), time.time()  # set again when the Dags are triggered
        self.result = report.RunResult(
            label=label,
            fix_enabled=self.fix_enabled,
            airflow_version=config.airflow_version,
            database=config.db_label,
            topology=config.topology.label,
            scenario=config.topology.scenario,
            many_expected=report.MANY_TASKS if config.topology.scenario == MANY else 0,
            home=str(self.home),
            needed_fixes=dict(features.get("needed_fixes", {})),
            emails_via_backend=bool(features.get("emails_via_backend", True)),
        )

    @property
    def airflow(self) -> str:
        return str(self.config.airflow_bin)

    def execute(self) -> report.RunResult:
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
            self.result.problems = report.fixed_problems(self.result)
        else:
            self.result.reproduced = report.stock_reproduced(self.result)
        return self.result

    def prepare(self) -> None:
        """A fresh home with the Dags, and a fresh database (see :meth:`prepare_database`)."""
        prepare_home(self.home, self.config.dag_sources)
        self.progress.update("preparing database", self.config.db_label)
        self.prepare_database()
        self.db = Db(self.database_url, self.dag_ids)

    def prepare_database(self) -> None:
        """A copy of a migrated SQLite template, or ``airflow db reset -y`` of ``--database``."""
        home, config = self.home, self.config
        if config.database is None:
            template = config.home / "template" / f"airflow-{config.airflow_version}.db"
            if not template.exists():
                # Migrate under another name and rename when done: an interrupted migration is never reused.
                partial = template.with_suffix(".partial")
                partial.parent.mkdir(parents=True, exist_ok=True)
                partial.unlink(missing_ok=True)
                template_env = {**self.env, "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": sqlite_url(partial)}
                log = home / "logs" / "db-migrate.log"
                argv = [self.airflow, "db", "migrate"]
                if self.procs.run([argv], template_env, log, home, timeout=300) != [0]:
                    partial.unlink(missing_ok=True)
                    raise DemoError(f"airflow db migrate failed; see {log}")
                partial.replace(template)
            shutil.copyfile(template, home / "airflow.db")
            return
        log = home / "logs" / "db-reset.log"
        if self.procs.run([[self.airflow, "db", "reset", "-y"]], self.env, log, home, timeout=300) != [0]:
            raise DemoError(f"airflow db reset failed; see {log}")
        mark_database_as_demo(config.database)

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

    def _wait_until_ready(self, deadline: float) -> None:
        assert self.db is not None
        api_ready = False
        while time.monotonic() < deadline:
            self.procs.track()
            self._check_components()
            api_ready = api_ready or http_ok(f"http://127.0.0.1:{self.port}/execution/health")
            try:
                parsed = self.db.serialized_dag_ids()
            except Exception:  # tables appear while the components start
                parsed = set()
            missing = sorted(set(self.dag_ids) - parsed)
            workers = [
                name
                for name, c in self.procs.components.items()
                if is_celery_worker(name) and not report.celery_worker_ready(c.read_log())
            ]
            if api_ready and not missing and not workers:
                return
            waiting = [] if api_ready else ["execution API"]
            waiting += [f"parse of {dag_id}" for dag_id in missing] + workers
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
        codes = self.procs.run(argvs, self.env, log, self.home, timeout=120)
        if any(code != 0 for code in codes):
            raise DemoError(f"airflow dags trigger failed (exit codes {codes}); see {log}")

    def watch(self) -> None:
        """Poll the database and the scheduler's log every second until :func:`should_stop` says why."""
        assert self.db is not None
        db, result, config = self.db, self.result, self.config
        schedulers = self._schedulers()
        scenario_pending = config.topology.scenario in KILLS
        triggered, triggered_at = self._triggered
        states: dict[tuple[str, int], str | None] = {}
        crashed_at: float | None = None
        terminal_at: float | None = None
        last_change = time.monotonic()
        last_seen: Any = None
        while True:
            self.procs.track()
            now = time.monotonic()
            try:
                dags = read_outcomes(db, self.home)
            except Exception:  # SQLite can be locked for a moment: keep the last snapshot
                dags = result.dags
            result.dags = dags
            now_states = report.try_states(dags)
            result.timeline += report.state_changes(states, now_states, now - triggered)
            states = now_states
            result.watched_seconds = now - triggered
            seen = {d: (o.callbacks, o.emails, o.tries, o.run_state) for d, o in dags.items()}
            if seen != last_seen:
                last_seen, last_change = seen, now
            if scenario_pending and (victim := self._kill_target()) is not None:
                scenario_pending = False
                self._kill(victim, now - triggered)
                schedulers = [s for s in schedulers if s.name != victim]
            # Several schedulers: the first one that crashes or exits stands for all of them.
            for scheduler in schedulers:
                scheduler_log = scheduler.read_log()
                result.scheduler.fixes = result.scheduler.fixes or report.find_fix_summary(scheduler_log)
                error = report.find_scheduler_crash(scheduler_log)
                if error is not None and crashed_at is None:
                    crashed_at = now
                    named = error if len(schedulers) == 1 else f"{scheduler.name}: {error}"
                    result.scheduler.crashed, result.scheduler.error = True, named
                    logged_at = report.find_crash_time(scheduler_log)
                    result.crashed_after = now - triggered if logged_at is None else logged_at - triggered_at
            exit_code = next((c.exit_code() for c in schedulers if c.exit_code() is not None), None)
            if exit_code is not None:
                result.scheduler.alive, result.scheduler.exit_code = False, exit_code
            if crashed_at is not None:
                result.scheduler.alive = False
            if report.all_runs_terminal(dags):
                terminal_at = terminal_at or now
                if result.converge_seconds is None:
                    result.converge_seconds = now - triggered
            reason = should_stop(
                since_trigger=now - triggered,
                crashed_for=None if crashed_at is None else now - crashed_at,
                exited=exit_code is not None,
                terminal_for=None if terminal_at is None else now - terminal_at,
                quiet_for=now - last_change,
                callbacks_complete=report.callbacks_complete(dags, result.emails_via_backend),
                timeout=config.timeout,
                settle=config.settle,
            )
            if reason is not None:
                result.stop_reason = reason
                result.converged = terminal_at is not None and not result.scheduler.crashed
                result.marks = report.marks_from_logs(
                    report.parse_jsonl(_read(self.home / CALLBACK_LOG_NAME)),
                    report.parse_jsonl(_read(self.home / EMAIL_LOG_NAME)),
                    triggered_at,
                )
                return
            phase = "scheduler crashed; collecting callbacks" if crashed_at else run_phase(dags)
            self.progress.update(phase, report.progress_line(dags))
            time.sleep(1.0)

    def _kill_target(self) -> str | None:
        assert self.db is not None
        try:
            tis = self.db.current_tis()
        except Exception:  # the database is busy for a moment: try again next second
            return None
        logs = {name: c.read_log() for name, c in self.procs.components.items()}
        return kill_target(self.config.topology.scenario, tis, logs)

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
