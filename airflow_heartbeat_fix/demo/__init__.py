"""
``airflow-heartbeat-fix demo``: reproduce both scheduler bugs with real Airflow components, stock vs fixed.

:func:`main` parses the options, runs :class:`~airflow_heartbeat_fix.demo.run.DemoRun` once per label
and prints the side-by-side table (:mod:`.report`). Progress goes to stderr, the table to stdout
(``--json PATH`` writes the result as JSON). The exit code is 0 when the fixed run converged as
expected, 1 when it did not, 2 on a setup error.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_heartbeat_fix.demo import report
from airflow_heartbeat_fix.demo.run import (
    LABELS,
    DemoConfig,
    DemoError,
    DemoRun,
    airflow_executable,
    default_home,
    find_dag_sources,
    installed_airflow_version,
    probe_features,
)

if TYPE_CHECKING:
    from types import FrameType

__all__ = ["main"]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="airflow-heartbeat-fix demo",
        description="Reproduce both scheduler bugs with real Airflow components: stock vs fixed.",
    )
    parser.add_argument("--home", type=Path, help="demo directory (default ./.demo/<version>-<db>)")
    parser.add_argument(
        "--database",
        help="SQLAlchemy URL of a PostgreSQL database to reset and use (default: SQLite in the home)",
    )
    parser.add_argument(
        "--dags", type=Path, help="Dags directory (default: the Dags installed with this package)"
    )
    parser.add_argument("--json", type=Path, dest="json_path", help="also write the result as JSON here")
    parser.add_argument("--runs", default="stock,fixed", help="comma-separated: stock, fixed")
    parser.add_argument("--heartbeat-timeout", type=int, default=10, help="seconds (default 10)")
    parser.add_argument("--detection-interval", type=int, default=2, help="seconds (default 2)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per run after trigger")
    parser.add_argument(
        "--settle", type=float, default=6.0, help="seconds to watch for late callbacks (default 6)"
    )
    return parser.parse_args(argv)


def build_config(args: argparse.Namespace, cwd: Path) -> DemoConfig:
    runs = tuple(r.strip() for r in args.runs.split(",") if r.strip())
    if not runs or any(r not in LABELS for r in runs):
        raise DemoError(f"--runs takes a comma-separated subset of {', '.join(LABELS)}")
    if args.database and not args.database.startswith("postgresql"):
        raise DemoError("--database must be a postgresql URL (SQLite is the default)")
    version = installed_airflow_version()
    home = args.home or default_home(cwd, version, args.database)
    dags_origin, dag_sources = find_dag_sources(args.dags)
    return DemoConfig(
        home=home.resolve(),
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
        json_path=args.json_path,
    )


def to_json(config: DemoConfig, results: list[report.RunResult], ok: bool) -> dict[str, Any]:
    return {
        "airflow_version": config.airflow_version,
        "database": config.db_label,
        "heartbeat_timeout": config.heartbeat_timeout,
        "ok": ok,
        "runs": {r.label: dataclasses.asdict(r) for r in results},
    }


def _raise_keyboard_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        config = build_config(args, Path.cwd())
    except DemoError as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 2
    # Ctrl-C, kill and a closed terminal all end the demo the same way: through DemoRun's stop.
    # (SIGINT explicitly too: a shell starts background jobs with SIGINT ignored.)
    stop_signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {sig: signal.signal(sig, _raise_keyboard_interrupt) for sig in stop_signals}
    results: list[report.RunResult] = []
    print(
        f"demo: Airflow {config.airflow_version} ({config.db_label}), home {config.home}, "
        f"Dags from {config.dags_origin}, heartbeat timeout {config.heartbeat_timeout} s",
        file=sys.stderr,
    )
    try:
        config.home.mkdir(parents=True, exist_ok=True)
        features = probe_features(config)
        for label in config.runs:
            results.append(DemoRun(config, label, features).execute())
    except DemoError as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("demo: interrupted; all Airflow processes stopped", file=sys.stderr)
        return 130
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    ok = all(not r.problems for r in results if r.fix_enabled)
    sys.stdout.write(report.render_table(results))
    if config.json_path is not None:
        config.json_path.write_text(
            json.dumps(to_json(config, results, ok), indent=2) + "\n", encoding="utf-8"
        )
    return 0 if ok else 1
