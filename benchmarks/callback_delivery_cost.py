"""
What ``claimed_callback_delivery`` costs in statements: the Dag processor's fetch when nothing is stored
(its idle loop), and a batch of N callback requests that all run without failing, stock vs fixed.

Exact counts, not timings: every statement and commit sent through the manager's engine (its fetch) and
through the file processor's claim connection, counted by SQLAlchemy events. The rest of the manager's
loop (bundle refresh, file queue, stats) is the same code stock and fixed, and the file processor's own
work (parsing the file, running the callback) is Airflow's: neither is counted. The requests are stored
by Airflow's own sink; the callbacks are stand-ins that do nothing (the benchmark counts the delivery).

    python -m benchmarks.callback_delivery_cost --db postgres --n 1,10,100
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from typing import Any

from benchmarks._setup import configure

BUNDLE = "dags-folder"


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part]


def _store(n: int) -> None:
    from airflow.callbacks.callback_requests import DagCallbackRequest
    from airflow.callbacks.database_callback_sink import DatabaseCallbackSink
    from airflow.models.db_callback_request import DbCallbackRequest
    from airflow.utils.session import create_session
    from sqlalchemy import delete

    with create_session() as session:
        session.execute(delete(DbCallbackRequest))
    for number in range(n):
        request = DagCallbackRequest(
            filepath="bench.py", bundle_name=BUNDLE, bundle_version=None, dag_id="d", run_id=f"r{number}"
        )
        DatabaseCallbackSink().send(request)


def _manager(fixed: bool) -> Any:
    """A manager of the stock class or the fixed one, parsing the one bundle the requests name."""
    from types import SimpleNamespace

    from airflow.dag_processing.manager import DagFileProcessorManager

    from airflow_heartbeat_fix.dag_processor import build_manager_class
    from airflow_heartbeat_fix.detection import CLAIMED_FIX

    cls = (
        build_manager_class((CLAIMED_FIX,), base=DagFileProcessorManager)
        if fixed
        else DagFileProcessorManager
    )
    manager = cls(max_runs=1)
    manager._dag_bundles = [SimpleNamespace(name=BUNDLE, supports_versioning=False, is_initialized=True)]
    return manager


def _fetch(manager: Any) -> list[Any]:
    fetch = getattr(manager, "fetch_callbacks", None) or manager._fetch_callbacks
    return list(fetch())


class Counted:
    """Statements (by kind) and commits sent through one engine while counting."""

    def __init__(self, engine: Any) -> None:
        from sqlalchemy import event

        from testing.scheduler import statement_kind

        self.kinds: Counter[str] = Counter()
        self.commits = 0

        def on_statement(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
            self.kinds[statement_kind(statement)] += 1

        def on_commit(conn: Any) -> None:
            self.commits += 1

        event.listen(engine, "before_cursor_execute", on_statement)
        event.listen(engine, "commit", on_commit)

    @property
    def statements(self) -> int:
        return sum(self.kinds.values())


def measure(n: int, *, fixed: bool, url: str) -> dict[str, Any]:
    """The fetches until nothing is left (the manager), then the file processor's claims (fixed only)."""
    from airflow import settings
    from airflow.models.db_callback_request import DbCallbackRequest
    from sqlalchemy import create_engine

    from airflow_heartbeat_fix.callback_delivery import Handover, run_claimed

    _store(n)
    manager, fetched = _manager(fixed), []
    counted = Counted(settings.engine)
    while batch := _fetch(manager):
        fetched += batch
    fetches = len(fetched) // manager.max_callbacks_per_loop + 1
    manager_side = (counted.statements, counted.commits, dict(counted.kinds))
    child = (0, 0, {})
    if fixed and fetched:
        engine = create_engine(url)
        child_count = Counted(engine)
        delivery = manager._delivery
        rows = tuple(delivery.fetched[id(request)][0] for request in fetched)
        # In-process, the "manager" is this process's parent: the file processor is not orphaned.
        handover = Handover(rows, engine, os.getppid(), delivery.max_attempts)
        run_claimed(lambda dagbag, requests, log: None, None, fetched, None, handover, isolate=True)
        engine.dispose()
        child = (child_count.statements, child_count.commits, dict(child_count.kinds))
    from airflow.utils.session import create_session
    from sqlalchemy import func, select

    with create_session() as session:
        left = session.scalar(select(func.count()).select_from(DbCallbackRequest))
    return {
        "n": n,
        "mode": "fixed" if fixed else "stock",
        "fetches": fetches,
        "manager": manager_side,
        "file_processor": child,
        "left_stored": left,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.callback_delivery_cost", description=__doc__)
    parser.add_argument("--db", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument(
        "--db-url", help="database to use (default: a fresh SQLite file, or hbfix_bench_callbacks)"
    )
    parser.add_argument(
        "--n", type=_ints, default=[1, 10, 100], help="callback requests per batch, e.g. 1,10,100"
    )
    args = parser.parse_args(argv)
    url = args.db_url or (
        f"sqlite:///{os.path.abspath('callback-bench.db')}"
        if args.db == "sqlite"
        else os.environ.get(
            "HEARTBEAT_FIX_BENCH_PG_URL_BASE", "postgresql+psycopg://airflow:airflow@localhost:5432"
        )
        + "/hbfix_bench_callbacks"
    )
    configure(url)
    from airflow import __version__

    from benchmarks._setup import migrate_database

    migrate_database()
    print(f"Airflow {__version__}, {args.db}; statements (commits) per scenario, exact")
    print(
        "| scenario | N | mode | manager: statements (commits) | file processor: statements (commits) |"
        " total statements | per request | left stored |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for n in [0, *args.n]:
        for fixed in (False, True):
            result = measure(n, fixed=fixed, url=url)
            (ms, mc, mk), (cs, cc, ck) = result["manager"], result["file_processor"]
            total = ms + cs
            per = f"{total / n:.2f}" if n else "-"
            scenario = "idle loop (nothing stored)" if n == 0 else "batch without failures"
            print(
                f"| {scenario} | {n} | {result['mode']} | {ms} ({mc}) {_kinds(mk)} |"
                f" {cs} ({cc}) {_kinds(ck)} | {total} | {per} | {result['left_stored']} |"
            )
    return 0


def _kinds(kinds: dict[str, int]) -> str:
    return "[" + ", ".join(f"{kind} {count}" for kind, count in sorted(kinds.items())) + "]" if kinds else ""


if __name__ == "__main__":
    sys.exit(main())
