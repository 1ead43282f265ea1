"""
Stress benchmark: heartbeat-timeout purges racing workers that report SUCCESS.

    python -m benchmarks.purge_race --db postgresql+psycopg://USER:PASSWORD@HOST/DB [--rounds 10]

Run it with the Python of the Airflow to measure (``.venvs/airflow-<version>/bin/python``) from the
repository root. It RESETS the database given with ``--db`` (``airflow db reset``): use a throwaway
one. Each round builds ``--tis`` timed-out task instances in one Dag run and purges them while
``--workers`` threads report SUCCESS for about ``--share`` of them at random moments of the pass (the
scenario of ``testing/purge_race.py``), once on stock Airflow and once fixed, interleaved. It
prints, per mode, the task instances purged, the successes workers were told, the successes lost
(overwritten by the purge), the failure callbacks sent for tasks whose worker was told SUCCESS, any
other inconsistency, and deadlocks; then the statements and commits per task instance of one pass
with nothing racing it. Not a timed test: the numbers are counts, and the race is real, so stock
losses vary from run to run.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from tabulate import tabulate

from benchmarks import _setup
from testing.database import backend
from testing.environment import configure_airflow
from testing.purge_race import random_finishes
from testing.scheduler import make_stale, measured_pass, new_runner

MODES = ("stock", "fixed")


@dataclass
class Totals:
    rounds: int = 0
    tis: int = 0
    worker_successes: int = 0
    lost_successes: int = 0
    spurious_callbacks: int = 0
    other_problems: int = 0
    deadlocks: int = 0
    seconds: float = 0.0
    clean_passes: list[Any] = field(default_factory=list)

    def add(self, result: Any, seconds: float) -> None:
        self.rounds += 1
        self.seconds += seconds
        for name in ("tis", "worker_successes", "lost_successes", "spurious_callbacks", "other_problems"):
            setattr(self, name, getattr(self, name) + getattr(result, name))
        self.deadlocks += result.deadlocks


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.purge_race", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--db", required=True, help="SQLAlchemy URL of a THROWAWAY PostgreSQL database")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per mode (default 3)")
    parser.add_argument("--tis", type=int, default=300, help="timed-out task instances per round")
    parser.add_argument("--workers", type=int, default=4, help="worker threads per round")
    parser.add_argument("--share", type=float, default=0.3, help="share of task instances workers finish")
    parser.add_argument("--modes", default=",".join(MODES), help="stock,fixed (default both, interleaved)")
    parser.add_argument("--verbose", action="store_true", help="keep Airflow's logging")
    args = parser.parse_args(argv)
    args.modes = [mode for mode in args.modes.split(",") if mode]
    if unknown := set(args.modes) - set(MODES):
        parser.error(f"unknown modes {sorted(unknown)}")
    if backend(args.db) != "postgres":
        parser.error("--db must be PostgreSQL: SQLite has no row locks and cannot run concurrent writers")
    return args


def _configure_airflow(args: argparse.Namespace) -> None:
    """Environment for Airflow, set before it is imported."""
    configure_airflow(args.db, home_prefix="hbfix-bench-")
    if not args.verbose:
        # The purge logs every task instance it fails; at 300 per round that is the slowest part.
        os.environ["AIRFLOW__LOGGING__LOGGING_LEVEL"] = "CRITICAL"


def _use(mode: str) -> None:
    """Stock: the package's patches removed; fixed: installed as ``airflow scheduler`` installs them."""
    from airflow_heartbeat_fix import activation

    activation.uninstall()
    if mode == "fixed":
        os.environ["AIRFLOW__HEARTBEAT_FIX__ENABLED"] = "True"
        activation.install()


def _round(mode: str, index: int, args: argparse.Namespace, totals: Totals) -> None:
    from airflow.utils.session import create_session

    _use(mode)
    try:
        # Statement counts are the same every round: one pass with nothing racing it is enough.
        for kind in ("race", "clean") if index == 0 else ("race",):
            with create_session() as session:
                dag_id = f"purge_race_{mode}_{kind}_{index}"
                dag = _setup.store_dag(_setup.DagShape(dag_id, args.tis, callbacks=False), session)
                _setup.create_runs(dag, 1, session)
                runner = new_runner(session)
                ti_ids = make_stale(_setup.task_instances(dag_id, session), runner, session)
                if kind == "race":
                    started = time.monotonic()
                    result = random_finishes(
                        runner, ti_ids, session, workers=args.workers, share=args.share, seed=index
                    )
                    totals.add(result, time.monotonic() - started)
                else:
                    totals.clean_passes.append(measured_pass(runner))
    finally:
        _setup.clear_tables()


def _report(version: str, args: argparse.Namespace, totals: dict[str, Totals]) -> str:
    header = ("mode", "rounds", "TIs", "worker told SUCCESS", "lost SUCCESS", "spurious callbacks")
    header += ("other inconsistencies", "deadlocks", "statements/TI", "commits/TI", "s/round")
    rows = []
    for mode, total in totals.items():
        clean_tis = args.tis * len(total.clean_passes)
        statements = sum(cost.statements for cost in total.clean_passes) / clean_tis
        commits = sum(cost.commits for cost in total.clean_passes) / clean_tis
        rows.append(
            (
                mode,
                str(total.rounds),
                str(total.tis),
                str(total.worker_successes),
                str(total.lost_successes),
                str(total.spurious_callbacks),
                str(total.other_problems),
                str(total.deadlocks),
                f"{statements:.2f}",
                f"{commits:.2f}",
                f"{total.seconds / max(total.rounds, 1):.1f}",
            )
        )
    lines = [
        f"Airflow {version}, PostgreSQL, {args.rounds} round(s) x {args.tis} timed-out task instances, "
        f"{args.workers} workers reporting SUCCESS for ~{args.share:.0%} of them during the purge",
    ]
    lines.append(tabulate(rows, headers=header, tablefmt="simple", stralign="right", disable_numparse=True))
    lines.append(
        "statements/TI and commits/TI: one extra pass over as many task instances with nothing racing "
        "it (scan included), counted on the scheduler's connection"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    _configure_airflow(args)
    from airflow import __version__ as version
    from airflow.utils.db import resetdb

    resetdb()
    # Become a scheduler process, as `airflow scheduler` does (this also activates the package).
    import airflow.cli.commands.scheduler_command  # noqa: F401

    totals = {mode: Totals() for mode in args.modes}
    for index in range(args.rounds):
        for mode in args.modes:
            _round(mode, index, args, totals[mode])
            print(f"round {index + 1}/{args.rounds} {mode}: {totals[mode]}", file=sys.stderr, flush=True)
    print(_report(version, args, totals))
    return 0


if __name__ == "__main__":
    sys.exit(main())
