"""
``airflow-heartbeat-fix demo``: reproduce the heartbeat-timeout bug this Airflow has (the scheduler's
crash, or duplicate callbacks) with real Airflow components, stock vs fixed.

:func:`main` reads the options into one :class:`~.config.DemoConfig` and checks every option, path and
database before it starts anything; then it takes the demo home's lock, runs
:class:`~.run.DemoRun` once per label, prints the side-by-side table (:mod:`.text_report`) and writes the
HTML timeline (:mod:`.html_report`). Progress goes to stderr, the table to stdout. Exit codes:
:data:`EXIT_CODES`.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import signal
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from airflow_heartbeat_fix import support
from airflow_heartbeat_fix.demo.config import (
    LABELS,
    DemoConfig,
    DemoError,
    UsageError,
    airflow_executable,
    cache_dir,
    default_home,
    find_dag_sources,
    listener_plugin_sources,
)
from airflow_heartbeat_fix.demo.database import (
    DEMO_TABLE,
    database_tables,
    display_url,
    ensure_database_exists,
    foreign_data,
)
from airflow_heartbeat_fix.demo.features import probe_features
from airflow_heartbeat_fix.demo.html_report import render_html
from airflow_heartbeat_fix.demo.result import RunResult, run_from_json, run_to_json, scenario_dag_ids
from airflow_heartbeat_fix.demo.run import DemoRun
from airflow_heartbeat_fix.demo.text_report import render_table
from airflow_heartbeat_fix.demo.topology import (
    EXECUTORS,
    HUNG,
    LOCAL,
    SCENARIOS,
    Topology,
    duration_notice,
    topology_refusal,
)
from airflow_heartbeat_fix.demo.verdicts import expectation_notice

if TYPE_CHECKING:
    from collections.abc import Iterator
    from types import FrameType

__all__ = ["EXIT_CODES", "main"]

EXIT_OK = 0
EXIT_NOT_CONVERGED = 1
EXIT_USAGE = 2
EXIT_ENVIRONMENT = 3
EXIT_INTERRUPTED = 130
EXIT_CODES = {
    EXIT_OK: "the fixed run converged as expected",
    EXIT_NOT_CONVERGED: "the fixed run did not converge (the table and the report say why)",
    EXIT_USAGE: "refused before starting anything: invalid option, an Airflow outside the supported range, "
    "unusable --home/--json/--html, a --database with tables the demo did not create, or another demo "
    "running in the same home",
    EXIT_ENVIRONMENT: "setup failed: Airflow missing, database unreachable, migration or components failed",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C, SIGTERM, SIGHUP); every Airflow process it started is stopped",
}

#: In every home the demo made: a home with other content is not the demo's to delete from.
HOME_MARKER = ".airflow-heartbeat-fix-demo"
LOCK_NAME = ".demo.lock"
#: What the demo itself puts in a home (homes made before the marker existed hold only these).
HOME_ENTRIES = frozenset(
    {HOME_MARKER, LOCK_NAME, "stock", "fixed", "template", "pycache", "probe", "report.html"}
)
REPORT_NAME = "report.html"
#: ``--timeout``: how long a run may take after its trigger.
DEFAULT_TIMEOUT = 120.0


# --- options --------------------------------------------------------------------------------------


def _add_place_options(parser: argparse.ArgumentParser) -> None:
    """Where the demo works and writes: its home, the database, the Dags, the reports."""
    parser.add_argument(
        "--home",
        type=Path,
        help="demo directory (default $XDG_CACHE_HOME/airflow-heartbeat-fix/demo/<version>-<db>, "
        "~/.cache/... without XDG_CACHE_HOME)",
    )
    parser.add_argument(
        "--database",
        help="SQLAlchemy URL of a database to use instead of SQLite in the home; one holding tables the "
        "demo did not create is refused unless --reset-database",
    )
    parser.add_argument(
        "--reset-database",
        action="store_true",
        help="allow the demo to drop the Airflow tables of --database (airflow db reset)",
    )
    parser.add_argument(
        "--dags", type=Path, help="Dags directory (default: the Dags installed with this package)"
    )
    parser.add_argument("--json", type=Path, dest="json_path", help="also write the result as JSON here")
    parser.add_argument(
        "--report-from",
        type=Path,
        metavar="JSON",
        help="run nothing: draw the table (and --html, --json) of a result an earlier --json wrote",
    )
    parser.add_argument(
        "--html", type=Path, dest="html_path", help=f"HTML timeline report (default <home>/{REPORT_NAME})"
    )


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    """What runs: which runs, the executor and schedulers, the scenario, and the timing."""
    parser.add_argument("--runs", default="stock,fixed", help="comma-separated: stock, fixed")
    parser.add_argument(
        "--executor",
        choices=list(EXECUTORS),
        default=LOCAL,
        help="local (default), or celery: two Celery workers on --broker-url; needs a PostgreSQL --database",
    )
    parser.add_argument(
        "--schedulers", type=int, default=1, help="schedulers running at once (HA; 2+ needs PostgreSQL)"
    )
    parser.add_argument(
        "--scenario",
        choices=list(SCENARIOS),
        default=HUNG,
        help="; ".join(f"{name}: {text}" for name, text in SCENARIOS.items())
        + "; kills need --executor celery",
    )
    parser.add_argument(
        "--broker-url", help="Celery broker for --executor celery, e.g. redis://127.0.0.1:6389/0"
    )
    parser.add_argument("--heartbeat-timeout", type=int, default=10, help="seconds (default 10)")
    parser.add_argument("--detection-interval", type=int, default=2, help="seconds (default 2)")
    parser.add_argument(
        "--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds per run after trigger (default 120)"
    )
    parser.add_argument(
        "--settle", type=float, default=6.0, help="seconds to watch for late callbacks (default 6)"
    )
    parser.add_argument(
        "--listener",
        action="store_true",
        help="deploy an audit listener plugin that reads a Variable when a Dag run starts and writes a row "
        "through its own create_session() when a try fails, as deployments' plugins do (the stock "
        "scheduler then crashes with DetachedInstanceError as it starts the first Dag run)",
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="airflow-heartbeat-fix demo",
        description="Reproduce the heartbeat-timeout bugs with real Airflow components: stock vs fixed.\n\n"
        + textwrap.fill(
            "It runs the Airflow installed in this environment (from a checkout, scripts/demo.sh --airflow "
            "V picks it; the default is the newest stable release) and says before it starts which bug "
            "that release should show. With the defaults it takes "
            f"{duration_notice(Topology(), len(LABELS), DEFAULT_TIMEOUT)}.",
            width=78,
        ),
        epilog="exit codes:\n"
        + "\n".join(
            textwrap.fill(text, width=78, initial_indent=f"  {code:<4}", subsequent_indent=" " * 6)
            for code, text in EXIT_CODES.items()
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_place_options(parser)
    _add_run_options(parser)
    return parser.parse_args(argv)


def build_config(args: argparse.Namespace) -> DemoConfig:
    """The options, refused where they do not fit together or this Airflow, as one :class:`DemoConfig`."""
    runs = tuple(r.strip() for r in args.runs.split(",") if r.strip())
    if not runs or any(r not in LABELS for r in runs):
        raise UsageError(f"--runs takes a comma-separated subset of {', '.join(LABELS)}")
    if args.reset_database and not args.database:
        raise UsageError("--reset-database needs --database")
    topology = Topology(
        executor=args.executor, schedulers=args.schedulers, broker_url=args.broker_url, scenario=args.scenario
    )
    refusal = topology_refusal(topology, args.database)
    if refusal is not None:
        raise UsageError(refusal)
    in_range = support.check()
    if refusal := in_range.refusal:
        raise UsageError(f"{refusal}; the demo would show nothing")
    if (version := in_range.airflow_version) is None:
        raise DemoError("Airflow is not installed in this environment")
    cache = cache_dir(os.environ)
    home = (args.home or default_home(cache, version, args.database, topology.executor)).resolve()
    dags_origin, dag_sources = find_dag_sources(args.dags, scenario_dag_ids(topology.scenario))
    return DemoConfig(
        home=home,
        database=args.database,
        dags_origin=dags_origin,
        dag_sources=dag_sources,
        airflow_bin=airflow_executable(),
        airflow_version=version,
        heartbeat_timeout=args.heartbeat_timeout,
        detection_interval=args.detection_interval,
        timeout=args.timeout,
        settle=args.settle,
        runs=runs,
        json_path=args.json_path.absolute() if args.json_path else None,
        html_path=(args.html_path or home / REPORT_NAME).absolute(),
        reset_database=args.reset_database,
        topology=topology,
        plugin_sources=listener_plugin_sources() if args.listener else {},
    )


# --- checks before anything starts ------------------------------------------------------------------


def check_home(home: Path) -> None:
    """Create ``home`` if needed; refuse one that holds anything the demo did not put there."""
    try:
        home.mkdir(parents=True, exist_ok=True)
        entries = {p.name for p in home.iterdir()}
        if entries and HOME_MARKER not in entries and not entries <= HOME_ENTRIES:
            raise UsageError(
                f"--home {home} holds files the demo did not create; pick a new or empty directory"
            )
        (home / HOME_MARKER).touch()
    except OSError as exc:
        raise UsageError(f"cannot use --home {home}: {exc.strerror or exc}") from exc


def check_writable(path: Path, option: str) -> None:
    """Refuse an output path the demo could not write at the end of a run of several minutes."""
    if path.is_dir():
        raise UsageError(f"{option} {path} is a directory")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", delete=True):
            pass
        if path.exists() and not os.access(path, os.W_OK):
            raise PermissionError(13, "Permission denied")
    except OSError as exc:
        raise UsageError(f"cannot write {option} {path}: {exc.strerror or exc}") from exc


def database_refusal(
    tables: list[str], url: str, *, reset_allowed: bool, foreign: list[str] | None = None
) -> str | None:
    """
    Why the demo must not reset this database, or None: empty, made by the demo and holding nothing
    else (``foreign``: :func:`~.database.foreign_data`), or reset allowed.
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


def _read_database(url: str) -> tuple[list[str], list[str]]:
    """The tables of ``--database`` and, where the demo marked it, the data it did not write."""
    from sqlalchemy.exc import ArgumentError

    try:
        ensure_database_exists(url)
        tables = database_tables(url)
        return tables, foreign_data(url, tables) if DEMO_TABLE in tables else []
    except ArgumentError as exc:  # not a URL, or a dialect/driver this environment does not have
        raise UsageError(f"--database {url!r}: {exc}") from exc
    except DemoError:
        raise
    except Exception as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DemoError(f"cannot use --database {display_url(url)}: {first_line}") from exc


def check_database(config: DemoConfig) -> str | None:
    """Refuse a ``--database`` with tables the demo did not create; the warning line when resetting it."""
    if config.database is None:
        return None
    tables, foreign = _read_database(config.database)
    refusal = database_refusal(tables, config.database, reset_allowed=config.reset_database, foreign=foreign)
    if refusal is not None:
        raise UsageError(refusal)
    if config.reset_database and tables:
        return (
            f"--reset-database: airflow db reset drops the Airflow tables of {display_url(config.database)} "
            f"({len(tables)} tables)"
        )
    return None


@contextlib.contextmanager
def home_lock(home: Path) -> Iterator[None]:
    """One demo per home at a time: an exclusive ``flock`` on ``<home>/.demo.lock``, held until done."""
    path = home / LOCK_NAME
    with path.open("a+", encoding="utf-8") as lock:
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UsageError(
                f"another demo is running in {home} (pid {_holder(lock) or 'unknown'}); "
                "wait for it or pass another --home"
            ) from None
        lock.seek(0)
        lock.truncate()
        lock.write(f"{os.getpid()}\n")
        lock.flush()
        try:
            yield
        finally:
            lock.seek(0)
            lock.truncate()


def _holder(lock: IO[str]) -> str:
    lock.seek(0)
    return lock.read().strip()


# --- output -----------------------------------------------------------------------------------------


def to_json(config: DemoConfig, results: list[RunResult], ok: bool) -> dict[str, Any]:
    """The ``--json`` document: this demo's settings, whether it passed, and each run."""
    return {
        "airflow_version": config.airflow_version,
        "database": config.db_label,
        "heartbeat_timeout": config.heartbeat_timeout,
        "ok": ok,
        "runs": {r.label: run_to_json(r) for r in results},
    }


def write_outputs(config: DemoConfig, results: list[RunResult], ok: bool) -> None:
    """The table on stdout, then the HTML report (its path printed) and the JSON."""
    sys.stdout.write(render_table(results))
    if config.html_path is not None:
        config.html_path.write_text(render_html(results), encoding="utf-8")
        sys.stdout.write(f"report: {config.html_path}\n")
    if config.json_path is not None:
        config.json_path.write_text(
            json.dumps(to_json(config, results, ok), indent=2) + "\n", encoding="utf-8"
        )


def _raise_keyboard_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def report_from(path: Path, *, html_path: Path | None, json_path: Path | None) -> int:
    """The reports of a result ``--json`` wrote, drawn again; the exit code its runs had."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
        results = [run_from_json(raw) for raw in document["runs"].values()]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"--report-from {path}: not a result the demo's --json wrote ({exc})") from exc
    sys.stdout.write(render_table(results))
    if html_path is not None:
        html_path.write_text(render_html(results), encoding="utf-8")
        sys.stdout.write(f"report: {html_path}\n")
    if json_path is not None:
        json_path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    return EXIT_OK if document.get("ok") else EXIT_NOT_CONVERGED


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.report_from is not None:
            return report_from(args.report_from, html_path=args.html_path, json_path=args.json_path)
        config = build_config(args)
        check_home(config.home)
        for path, option in ((config.json_path, "--json"), (config.html_path, "--html")):
            if path is not None:
                check_writable(path, option)
        with home_lock(config.home):
            notice = check_database(config)
            if notice:
                print(f"demo: {notice}", file=sys.stderr)
            return _run(config)
    except UsageError as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except DemoError as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return EXIT_ENVIRONMENT


def _run(config: DemoConfig) -> int:
    # Ctrl-C, kill and a closed terminal all end the demo the same way: through DemoRun's stop.
    # (SIGINT explicitly too: a shell starts background jobs with SIGINT ignored.)
    stop_signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {sig: signal.signal(sig, _raise_keyboard_interrupt) for sig in stop_signals}
    results: list[RunResult] = []
    print(
        f"demo: Airflow {config.airflow_version} ({config.db_label}; {config.topology.label}), "
        f"home {config.home}, Dags from {config.dags_origin}, heartbeat timeout {config.heartbeat_timeout} s",
        file=sys.stderr,
    )
    print(f"demo: {duration_notice(config.topology, len(config.runs), config.timeout)}", file=sys.stderr)
    try:
        features = probe_features(config)
        expected = expectation_notice(
            features.get("needed_fixes", {}),
            listener=bool(config.plugin_sources),
            scenario=config.topology.scenario,
        )
        print(f"demo: {expected}", file=sys.stderr)
        for label in config.runs:
            results.append(DemoRun(config, label, features).execute())
    except KeyboardInterrupt:
        print("demo: interrupted; all Airflow processes stopped", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    ok = all(not r.problems for r in results if r.fix_enabled)
    write_outputs(config, results, ok)
    return EXIT_OK if ok else EXIT_NOT_CONVERGED
