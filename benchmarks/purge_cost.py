"""
What the heartbeat-timeout purge costs, stock vs fixed: ``python -m benchmarks.purge_cost``.

Run with an Airflow venv's interpreter (``.venvs/airflow-<v>/bin/python -m benchmarks.purge_cost``), or
with ``--airflow 3.2.2,3.4.0b2`` from any Python to run each release's venv and print one table. Every
measurement is a fresh process (fixes on or off through ``AIRFLOW__HEARTBEAT_FIX__ENABLED``), stock and
fixed interleaved, on a database migrated once per release:

* purge: one ``_find_and_purge_task_instances_without_heartbeats`` pass over N stale task instances:
  wall (median/min/max over repeats), the scheduler process's CPU time (median; steadier than the wall
  on a shared machine, but without the database server's share), statements per task instance
  (SQLAlchemy ``before_cursor_execute``), commits per pass, peak Python memory of the pass (tracemalloc,
  in a run of its own), and whether every task instance left RUNNING with exactly one task callback.
  Over two or more N (in one run, or in runs merged with ``--tables-from``), statements and commits
  are fitted as a constant per pass plus a slope per task instance: the scan and the Dag lookup are
  paid once a pass, the rest per task instance;
* idle: the scheduler loop's ``_do_scheduling`` plus heartbeat check over 100 running Dag runs that
  have no timeouts: statements and wall per loop;
* storm: 200 Dag runs failing at once with a Dag ``on_failure_callback``: loops until all are failed,
  statements, wall, Dag callbacks stored;
* listener: the purge again, with a listener plugin whose ``on_task_instance_failed`` writes an audit row
  through its own ``create_session()`` (``testing/plugin_files``): one nested session per task instance;
  the statements each nested session adds over the same purge without the plugin.

Statement counts are exact; walls depend on the machine's load. ``--smoke`` (N = 20, one repeat) fails
only when the fixed purge does not converge every task instance with exactly one callback.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks import _setup
from testing.plugins import LISTENER_PLUGIN, install_plugin_folder, plugins_loaded
from testing.scheduler import StatementCounter, make_stale, new_runner

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

ROOT = Path(__file__).resolve().parent.parent
RESULT_PREFIX = "BENCH-RESULT "
MODES = ("stock", "fixed")
#: The purge every other is compared with: upstream's converged purge, stock, retries 0.
ANCHOR_VERSION = "3.4.0b2"
IDLE_RUNS = 100
IDLE_LOOPS = 20
STORM_RUNS = 200
SMOKE_N = 20

# -- one measurement per process -----------------------------------------------------------------------


def _task_callbacks_per_try(session: Session, dag_id: str) -> Counter[tuple[str, str, int]]:
    from airflow.models.db_callback_request import DbCallbackRequest
    from sqlalchemy import select

    counts: Counter[tuple[str, str, int]] = Counter()
    for row in session.scalars(select(DbCallbackRequest)):
        request: Any = row.get_callback_request()
        if type(request).__name__ == "TaskCallbackRequest" and request.ti.dag_id == dag_id:
            counts[(request.ti.run_id, request.ti.task_id, request.ti.try_number)] += 1
    return counts


def _left_running(session: Session, dag_id: str) -> int:
    from airflow.models.taskinstance import TaskInstance as TI
    from sqlalchemy import func, select

    running = select(func.count()).where(TI.dag_id == dag_id, TI.state.in_(("running", "restarting")))
    return int(session.scalar(running) or 0)


def _audit_rows(session: Session) -> int:
    """Rows the listener plugin wrote: one per nested session it opened."""
    from airflow.models.log import Log
    from sqlalchemy import func, select

    return int(session.scalar(select(func.count()).where(Log.event == "heartbeat-fix-audit")) or 0)


def measure_purge(n: int, retries: int, *, memory: bool, listener: bool = False) -> dict[str, Any]:
    import contextlib
    import tempfile

    with contextlib.ExitStack() as plugins:
        if listener:
            folder = Path(plugins.enter_context(tempfile.TemporaryDirectory(prefix="hbfix-bench-plugins-")))
            plugins.enter_context(plugins_loaded(install_plugin_folder(folder, LISTENER_PLUGIN)))
        return _measure_purge(n, retries, memory=memory)


def _measure_purge(n: int, retries: int, *, memory: bool) -> dict[str, Any]:
    from airflow.utils.session import create_session

    with create_session() as session:
        runner = new_runner(session)
        created = _setup.stale_task_instances(runner, n, session, retries=retries)
    counter = StatementCounter()
    error = None
    if memory:
        tracemalloc.start()
    started, cpu_started = time.perf_counter(), time.process_time()
    try:
        with counter.counting():
            runner._find_and_purge_task_instances_without_heartbeats()
    except Exception as exc:  # a stock release that crashes is a result, not a benchmark failure
        error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    peak = tracemalloc.get_traced_memory()[1] if memory else None
    if memory:
        tracemalloc.stop()
    with create_session() as session:
        callbacks = _task_callbacks_per_try(session, "bench_purge")
        left_running = _left_running(session, "bench_purge")
        nested_sessions = _audit_rows(session)
    return {
        "n": created,
        "wall": wall,
        "cpu": cpu,
        "statements": counter.statements,
        "commits": counter.commits,
        "kinds": dict(counter.kinds),
        "peak_bytes": peak,
        "error": error,
        "left_running": left_running,
        "callbacks": sum(callbacks.values()),
        "tis_with_one_callback": sum(1 for count in callbacks.values() if count == 1),
        "nested_sessions": nested_sessions,
    }


def _scheduling_loop(runner: Any) -> None:
    """One pass of the scheduler loop's parts this package touches, in the loop's sessions."""
    from airflow.utils.session import create_session

    with create_session() as session:
        runner._do_scheduling(session)
    runner._find_and_purge_task_instances_without_heartbeats()


def _set_columns(dag_id: str, session: Session, **values: Any) -> None:
    from airflow.models.taskinstance import TaskInstance as TI
    from sqlalchemy import update

    session.execute(update(TI).where(TI.dag_id == dag_id).values(**values))
    session.commit()


def _unpause(dag_id: str, session: Session) -> None:
    from airflow.models.dag import DagModel
    from sqlalchemy import update

    session.execute(update(DagModel).where(DagModel.dag_id == dag_id).values(is_paused=False))
    session.commit()


def measure_idle() -> dict[str, Any]:
    from airflow.utils.session import create_session

    with create_session() as session:
        runner = new_runner(session)
        dag = _setup.store_dag(_setup.DagShape("bench_idle", 1), session)
        _setup.create_runs(dag, IDLE_RUNS, session)
        running = _setup.task_instances("bench_idle", session)
        make_stale(running, runner, session)
        _set_columns("bench_idle", session, last_heartbeat_at=datetime.now(tz=timezone.utc))
        _unpause("bench_idle", session)
    for _ in range(2):  # warm caches (Dag bag, compiled statements) before counting
        _scheduling_loop(runner)
    counter = StatementCounter()
    started = time.perf_counter()
    with counter.counting():
        for _ in range(IDLE_LOOPS):
            _scheduling_loop(runner)
    wall = time.perf_counter() - started
    return {
        "loops": IDLE_LOOPS,
        "wall": wall / IDLE_LOOPS,
        "statements": counter.statements / IDLE_LOOPS,
        "kinds": dict(counter.kinds),
    }


def measure_storm() -> dict[str, Any]:
    from airflow.models.dagrun import DagRun
    from airflow.models.db_callback_request import DbCallbackRequest
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState, TaskInstanceState
    from sqlalchemy import func, select

    with create_session() as session:
        runner = new_runner(session)
        dag = _setup.store_dag(_setup.DagShape("bench_storm", 1), session)
        _setup.create_runs(dag, STORM_RUNS, session)
        _set_columns("bench_storm", session, state=TaskInstanceState.FAILED)
        _unpause("bench_storm", session)
    counter = StatementCounter()
    loops, error = 0, None
    started = time.perf_counter()
    with counter.counting():
        while loops < 100:
            loops += 1
            try:
                _scheduling_loop(runner)
            except Exception as exc:
                error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
                break
            with create_session() as session:
                running = session.scalar(
                    select(func.count()).where(
                        DagRun.dag_id == "bench_storm", DagRun.state == DagRunState.RUNNING
                    )
                )
            if not running:
                break
    wall = time.perf_counter() - started
    with create_session() as session:
        failed = session.scalar(
            select(func.count()).where(DagRun.dag_id == "bench_storm", DagRun.state == DagRunState.FAILED)
        )
        stored = sum(
            1
            for row in session.scalars(select(DbCallbackRequest))
            if type(row.get_callback_request()).__name__ == "DagCallbackRequest"
        )
    return {
        "loops": loops,
        "wall": wall,
        "statements": counter.statements,
        "commits": counter.commits,
        "runs_failed": failed,
        "dag_callbacks": stored,
        "error": error,
    }


def run_child(args: argparse.Namespace) -> None:
    """Inside a fresh process: configure Airflow, measure one thing, print one JSON line."""
    _setup.configure(args.db_url)
    if args.child == "prepare":
        _setup.migrate_database()
        result: dict[str, Any] = {"ok": True}
    else:
        _setup.become_scheduler()
        _setup.clear_tables()
        try:
            if args.child == "purge":
                result = measure_purge(args.n[0], args.retries[0], memory=args.memory, listener=args.listener)
            elif args.child == "idle":
                result = measure_idle()
            else:
                result = measure_storm()
        finally:
            _setup.clear_tables()
        from airflow.cli.commands import scheduler_command

        result["fixed"] = bool(getattr(scheduler_command.SchedulerJobRunner, "heartbeat_fixes", ()))
    from airflow import __version__

    result["version"] = __version__
    print(RESULT_PREFIX + json.dumps(result), flush=True)


# -- the parent: interleaved fresh processes, one table ------------------------------------------------


def default_db_url(db: str, version: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "_", version.lower())
    if db == "sqlite":
        return f"sqlite:///{os.environ.get('TMPDIR', '/tmp')}/hbfix_bench_{slug}.db"
    base = os.environ.get(
        "HEARTBEAT_FIX_BENCH_PG_URL_BASE", "postgresql+psycopg://airflow:airflow@localhost:5432"
    )
    return f"{base}/hbfix_bench_{slug}"


def _airflow_version() -> str:
    from importlib.metadata import version

    return version("apache-airflow")


def spawn(python: str, mode: str, argv: list[str]) -> dict[str, Any]:
    """Run one child in a fresh process with the fixes on or off; its JSON result."""
    env = {**os.environ, "AIRFLOW__HEARTBEAT_FIX__ENABLED": str(mode == "fixed")}
    env.pop("AIRFLOW_HOME", None)
    proc = subprocess.run(
        [python, "-m", "benchmarks.purge_cost", *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            result: dict[str, Any] = json.loads(line[len(RESULT_PREFIX) :])
            if "fixed" in result and (mode == "fixed") != result["fixed"]:
                raise SystemExit(f"asked for {mode}, but the child ran fixed={result['fixed']}")
            return result
    tail = "\n".join((proc.stderr or proc.stdout).splitlines()[-25:])
    raise SystemExit(f"benchmark child {' '.join(argv)} ({mode}) failed (rc={proc.returncode}):\n{tail}")


@dataclass
class Repeats:
    """Every repeat of one measurement of one mode (stock or fixed), each a fresh process's result."""

    results: list[dict[str, Any]] = field(default_factory=list)
    memory: int | None = None

    def walls(self) -> list[float]:
        return [r["wall"] for r in self.results if not r.get("error")]

    def first(self, key: str) -> Any:
        return self.results[0][key] if self.results else None

    def error(self) -> str | None:
        return next((r["error"] for r in self.results if r.get("error")), None)


def measure_version(args: argparse.Namespace) -> dict[str, Any]:
    """All measurements on this venv's Airflow, stock and fixed interleaved; a JSON-able summary."""
    version = _airflow_version()
    python = sys.executable
    out: dict[str, Any] = {"version": version, "db": args.db, "purge": [], "idle": {}, "storm": {}}
    out["listener"] = []
    db_url = args.db_url or default_db_url(args.db, version)
    common = ["--db-url", db_url]
    spawn(python, "fixed", ["--child", "prepare", *common])
    for n in args.n:
        for retries in args.retries:
            by_mode = {mode: Repeats() for mode in MODES}
            argv = ["--child", "purge", "--n", str(n), "--retries", str(retries), *common]
            for repeat in range(args.repeats):
                for mode in MODES if repeat % 2 == 0 else MODES[::-1]:
                    by_mode[mode].results.append(spawn(python, mode, argv))
                    _progress(f"{version} {args.db} purge n={n} retries={retries} {mode} #{repeat + 1}")
            if not args.no_memory:
                for mode in MODES:
                    by_mode[mode].memory = spawn(python, mode, [*argv, "--memory"])["peak_bytes"]
            out["purge"].append(
                {"n": n, "retries": retries, **{mode: _summary(repeats) for mode, repeats in by_mode.items()}}
            )
    if "listener" in args.scenarios:
        for n in args.n:
            for retries in args.retries:
                argv = ["--child", "purge", "--listener", "--n", str(n), "--retries", str(retries), *common]
                by_mode = {mode: Repeats([spawn(python, mode, argv)]) for mode in MODES}
                _progress(f"{version} {args.db} purge with a listener n={n} retries={retries}")
                out["listener"].append(
                    {"n": n, "retries": retries, **{mode: _summary(r) for mode, r in by_mode.items()}}
                )
    for what in ("idle", "storm"):
        if what not in args.scenarios:
            continue
        by_mode = {mode: Repeats() for mode in MODES}
        for repeat in range(max(1, args.repeats // 2)):
            for mode in MODES if repeat % 2 == 0 else MODES[::-1]:
                by_mode[mode].results.append(spawn(python, mode, ["--child", what, *common]))
                _progress(f"{version} {args.db} {what} {mode} #{repeat + 1}")
        out[what] = {mode: _summary(repeats) for mode, repeats in by_mode.items()}
    return out


#: What differs between repeats (summarised above) or is not a measurement.
_PER_REPEAT = {"wall", "cpu", "error", "peak_bytes", "version", "fixed"}


def _summary(repeats: Repeats) -> dict[str, Any]:
    walls = repeats.walls()
    cpus = [r["cpu"] for r in repeats.results if "cpu" in r and not r.get("error")]
    first = repeats.results[0]
    return {
        "wall_median": statistics.median(walls) if walls else None,
        "wall_min": min(walls) if walls else None,
        "wall_max": max(walls) if walls else None,
        "cpu_median": statistics.median(cpus) if cpus else None,
        "repeats": len(walls),
        "error": repeats.error(),
        "peak_bytes": repeats.memory,
        **{k: v for k, v in first.items() if k not in _PER_REPEAT},
        "converged": all(_converged(r) for r in repeats.results) if "left_running" in first else None,
    }


def _converged(result: dict[str, Any]) -> bool:
    """Every task instance left RUNNING, each try with exactly one task callback."""
    return (
        not result.get("error")
        and result["left_running"] == 0
        and result["tis_with_one_callback"] == result["n"] == result["callbacks"]
    )


def _progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- printing ------------------------------------------------------------------------------------------


def _cell(report: dict[str, Any], row: dict[str, Any], mode: str) -> list[Any]:
    """The columns that say which run a table row is: release, database, N, retries, mode."""
    return [report["version"], report["db"], row["n"], row["retries"], mode]


def _fmt_wall(summary: dict[str, Any]) -> str:
    if summary["wall_median"] is None:
        return f"crashes ({summary['error'][:40]})" if summary["error"] else "-"
    return f"{summary['wall_median']:.3f} ({summary['wall_min']:.3f}-{summary['wall_max']:.3f})"


def _anchor_walls(versions: list[dict[str, Any]]) -> dict[tuple[str, int], float]:
    """Stock 3.4.0b2's purge wall, retries 0, per (db, N): what every ratio is relative to."""
    anchors = {}
    for report in versions:
        if report["version"] != ANCHOR_VERSION:
            continue
        for row in report["purge"]:
            if row["retries"] == 0 and row["stock"]["wall_median"]:
                anchors[(report["db"], row["n"])] = row["stock"]["wall_median"]
    return anchors


def purge_table(versions: list[dict[str, Any]]) -> str:
    anchors = _anchor_walls(versions)
    headers = [
        "purge pass", "db", "N", "retries", "mode", "wall s median (min-max)", f"vs stock {ANCHOR_VERSION}",
        "fixed/stock", "scheduler CPU s", "statements/TI", "commits/pass", "peak MiB", "converged",
    ]  # fmt: skip
    rows: list[list[Any]] = []
    for report in versions:
        for row in report["purge"]:
            stock_wall = row["stock"]["wall_median"]
            for mode in MODES:
                s = row[mode]
                anchor = anchors.get((report["db"], row["n"]))
                vs_anchor = f"{s['wall_median'] / anchor:.2f}" if anchor and s["wall_median"] else "-"
                vs_stock = (
                    f"{s['wall_median'] / stock_wall:.2f}"
                    if mode == "fixed" and stock_wall and s["wall_median"]
                    else ""
                )
                per_ti = f"{s['statements'] / s['n']:.3f}" if s.get("n") else "-"
                peak = f"{s['peak_bytes'] / 2**20:.1f}" if s.get("peak_bytes") else "-"
                cpu = f"{s['cpu_median']:.2f}" if s.get("cpu_median") is not None else "-"
                rows.append(
                    [
                        *_cell(report, row, mode),
                        _fmt_wall(s),
                        vs_anchor,
                        vs_stock,
                        cpu,
                        per_ti,
                        s["commits"],
                        peak,
                        "yes" if s["converged"] else "no",
                    ]
                )
    return _markdown(headers, rows)


def loop_table(versions: list[dict[str, Any]]) -> str:
    headers = [
        "loop", "db", "scenario", "stock statements", "fixed statements", "stock wall s", "fixed wall s",
        "fixed/stock wall", "notes",
    ]  # fmt: skip
    rows: list[list[Any]] = []
    for report in versions:
        for what in ("idle", "storm"):
            by_mode = report.get(what)
            if not by_mode:
                continue
            stock, fixed = by_mode["stock"], by_mode["fixed"]
            ratio = (
                f"{fixed['wall_median'] / stock['wall_median']:.2f}"
                if stock["wall_median"] and fixed["wall_median"]
                else "-"
            )
            if what == "idle":
                label = f"idle, per loop ({IDLE_RUNS} running runs)"
                notes = _kinds_difference(stock["kinds"], fixed["kinds"], IDLE_LOOPS)
            else:
                label = f"Dag-callback storm ({STORM_RUNS} runs)"
                notes = "; ".join(
                    f"{mode}: {c['loops']} loops, {c['dag_callbacks']} callbacks"
                    + (f", {c['error'][:50]}" if c["error"] else "")
                    for mode, c in by_mode.items()
                )
            rows.append(
                [
                    report["version"],
                    report["db"],
                    label,
                    f"{stock['statements']:g}",
                    f"{fixed['statements']:g}",
                    _wall(stock),
                    _wall(fixed),
                    ratio,
                    notes,
                ]
            )
    return _markdown(headers, rows)


def _kinds_difference(stock: dict[str, int], fixed: dict[str, int], loops: int) -> str:
    """Which statements fixed sends more (+) or fewer (-) than stock over ``loops`` loops."""
    difference = Counter(fixed)
    difference.subtract(stock)
    changed = sorted((kind, count) for kind, count in difference.items() if count)
    if not changed:
        return "same statements"
    return f"fixed vs stock over {loops} loops: " + ", ".join(f"{kind} {count:+d}" for kind, count in changed)


def _wall(summary: dict[str, Any]) -> str:
    return f"{summary['wall_median']:.4f}" if summary["wall_median"] is not None else "-"


def _markdown(headers: list[str], rows: list[list[Any]]) -> str:
    """A GitHub Markdown table (values as formatted here: tabulate parses no numbers)."""
    from tabulate import tabulate

    return str(tabulate(rows, headers, tablefmt="github", disable_numparse=True))


def _purge_rows(versions: list[dict[str, Any]]) -> dict[tuple[str, str, int, str], dict[int, dict[str, Any]]]:
    """Every purge measurement, wherever it came from, as (version, db, retries, mode) -> N -> summary."""
    rows: dict[tuple[str, str, int, str], dict[int, dict[str, Any]]] = {}
    for report in versions:
        for row in report["purge"]:
            for mode in MODES:
                key = (report["version"], report["db"], row["retries"], mode)
                rows.setdefault(key, {})[row["n"]] = row[mode]
    return rows


def kinds_table(versions: list[dict[str, Any]]) -> str:
    """Statements per task instance by kind, at the largest N measured, per version, retries and mode."""
    rows: list[list[Any]] = []
    for (version, db, retries, mode), by_n in _purge_rows(versions).items():
        n = max(by_n)
        s = by_n[n]
        kinds = sorted(s["kinds"].items(), key=lambda kv: -kv[1])
        text = ", ".join(f"{k} {v / s['n']:.2f}" for k, v in kinds if v / s["n"] >= 0.01)
        rows.append([version, db, retries, mode, n, text])
    return _markdown(["version", "db", "retries", "mode", "N", "statements per TI by kind"], rows)


def linear_fit(points: list[tuple[int, float]]) -> tuple[float, float, float]:
    """
    Least squares ``count = per_pass + per_ti * N`` over ``(N, count)`` points (at least two Ns):
    ``(per_pass, per_ti, worst residual)``. A residual far from 0 means growth that is not linear.
    """
    ns = [n for n, _ in points]
    mean_n = statistics.fmean(ns)
    mean_count = statistics.fmean(count for _, count in points)
    spread = sum((n - mean_n) ** 2 for n in ns)
    per_ti = sum((n - mean_n) * (count - mean_count) for n, count in points) / spread
    per_pass = mean_count - per_ti * mean_n
    worst = max(abs(count - per_pass - per_ti * n) for n, count in points)
    return per_pass, per_ti, worst


def fit_table(versions: list[dict[str, Any]]) -> str:
    """
    Statements and commits of a pass split into a constant per pass and a slope per task instance,
    fitted over every N measured (possibly in separate runs) of a release, database, retries and mode.
    """
    headers = [
        "statements = per pass + per TI x N", "db", "retries", "mode", "Ns", "statements per pass",
        "statements per TI", "commits per pass", "commits per TI", "worst residual",
    ]  # fmt: skip
    rows: list[list[Any]] = []
    for (version, db, retries, mode), by_n in _purge_rows(versions).items():
        measured = [s for n, s in sorted(by_n.items()) if s.get("n") and not s["error"]]
        if len(measured) < 2:
            continue
        statements = linear_fit([(s["n"], s["statements"]) for s in measured])
        commits = linear_fit([(s["n"], s["commits"]) for s in measured])
        rows.append(
            [
                version,
                db,
                retries,
                mode,
                ",".join(str(s["n"]) for s in measured),
                f"{statements[0]:.1f}",
                f"{statements[1]:.3f}",
                f"{commits[0]:.1f}",
                f"{commits[1]:.3f}",
                f"{max(statements[2], commits[2]):.2g}",
            ]
        )
    return _markdown(headers, rows)


def listener_table(versions: list[dict[str, Any]]) -> str:
    """The purge with the listener plugin against the same purge without it: the cost of a nested session."""
    headers = [
        "purge with a listener", "db", "N", "retries", "mode", "statements/TI", "without the listener",
        "nested sessions", "extra statements per nested session", "converged",
    ]  # fmt: skip
    rows: list[list[Any]] = []
    for report in versions:
        plain = {(row["n"], row["retries"]): row for row in report["purge"]}
        for row in report.get("listener", []):
            for mode in MODES:
                s, without = row[mode], plain.get((row["n"], row["retries"]), {}).get(mode)
                per_ti = f"{s['statements'] / s['n']:.3f}" if s.get("n") else "-"
                base = f"{without['statements'] / without['n']:.3f}" if without and without.get("n") else "-"
                extra = "-"
                if without and not s["error"] and not without["error"] and s.get("nested_sessions"):
                    extra = f"{(s['statements'] - without['statements']) / s['nested_sessions']:.2f}"
                outcome = "yes" if s["converged"] else "no" + (f" ({s['error'][:40]})" if s["error"] else "")
                rows.append(
                    [
                        *_cell(report, row, mode),
                        per_ti,
                        base,
                        s.get("nested_sessions", 0),
                        extra,
                        outcome,
                    ]
                )
    return _markdown(headers, rows)


def print_tables(versions: list[dict[str, Any]]) -> None:
    print(purge_table(versions))
    if any(report.get("listener") for report in versions):
        print()
        print(listener_table(versions))
    print()
    print(fit_table(versions))
    print()
    print(loop_table(versions))
    print()
    print(kinds_table(versions))


# -- entry point ---------------------------------------------------------------------------------------


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    summary = (__doc__ or "").strip().split("\n\n")[0]
    parser = argparse.ArgumentParser(prog="python -m benchmarks.purge_cost", description=summary)
    parser.add_argument("--db", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--db-url", help="database to use (default: one per release, created if missing)")
    parser.add_argument("--n", type=_ints, default=[500, 2000], help="stale task instances, e.g. 500,2000")
    parser.add_argument("--retries", type=_ints, default=[0, 1], help="task retries, e.g. 0,1")
    parser.add_argument("--repeats", type=int, default=5, help="fresh-process runs per mode")
    parser.add_argument(
        "--scenarios", default="idle,storm", help="besides the purge: idle,storm,listener or none"
    )
    parser.add_argument("--no-memory", action="store_true", help="skip the tracemalloc runs")
    parser.add_argument("--airflow", help="releases to run, each in .venvs/airflow-<v> (e.g. 3.2.2,3.4.0b2)")
    parser.add_argument("--json", dest="json_out", help="also write the results as JSON to this file")
    parser.add_argument("--tables-from", help="only print the tables of earlier --json files (a,b,...)")
    parser.add_argument(
        "--smoke", action="store_true", help=f"N={SMOKE_N}, 1 repeat; fails only on wrong results"
    )
    parser.add_argument("--child", choices=("prepare", "purge", "idle", "storm"), help=argparse.SUPPRESS)
    parser.add_argument("--memory", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--listener", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--emit-json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.smoke:
        args.n, args.repeats, args.no_memory, args.scenarios = [SMOKE_N], 1, True, "none"
    return args


def _with_venvs(args: argparse.Namespace, argv: list[str]) -> list[dict[str, Any]]:
    """Run this command in each release's venv and collect what each measured."""
    reports = []
    forwarded = [a for a in argv if not a.startswith("--airflow") and a != args.airflow]
    for version in args.airflow.split(","):
        python = ROOT / ".venvs" / f"airflow-{version}" / "bin" / "python"
        if not python.exists():
            raise SystemExit(
                f"{python} is missing: build it with `bash scripts/test.sh --versions {version} "
                "--dbs sqlite --modes fixed --no-e2e --no-lint -- -k nothing`"
            )
        proc = subprocess.run(
            [str(python), "-m", "benchmarks.purge_cost", *forwarded, "--emit-json"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
            check=False,
        )
        lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
        if proc.returncode != 0 or not lines:
            raise SystemExit(f"the benchmark failed on Airflow {version} (rc={proc.returncode})")
        reports.append(json.loads(lines[-1][len(RESULT_PREFIX) :]))
    return reports


def smoke_failures(reports: list[dict[str, Any]]) -> list[str]:
    """What the smoke run checks: the fixed purge converges every task instance with one callback."""
    return [
        f"{report['version']} {report['db']} n={row['n']} retries={row['retries']}: "
        f"fixed purge did not converge (error={row['fixed']['error']}, "
        f"left running={row['fixed'].get('left_running')}, "
        f"callbacks={row['fixed'].get('callbacks')} for n={row['fixed'].get('n')})"
        for report in reports
        for row in report["purge"]
        if not row["fixed"]["converged"]
    ]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.child:
        run_child(args)
        return 0
    args.scenarios = [] if args.scenarios == "none" else args.scenarios.split(",")
    if args.tables_from:
        reports = [
            report for name in args.tables_from.split(",") for report in json.loads(Path(name).read_text())
        ]
    elif args.airflow:
        reports = _with_venvs(args, argv)
    else:
        reports = [measure_version(args)]
        if args.emit_json:
            print(RESULT_PREFIX + json.dumps(reports[0]), flush=True)
            return 0
    if args.json_out and not args.tables_from:
        Path(args.json_out).write_text(json.dumps(reports, indent=2))
    print_tables(reports)
    if args.smoke and (failures := smoke_failures(reports)):
        print("\n".join(["", "SMOKE FAILED:", *failures]), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
