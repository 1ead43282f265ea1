"""
The demo's reads and writes of a metadata database: one run's Dag runs and tries (:class:`Db`,
:func:`read_outcomes`), and what the checks before a run need to know of a ``--database`` (its tables,
data the demo did not write, the demo's mark). SQLAlchemy is imported when a database is first used,
so ``--help`` and the option checks start without it.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from airflow_heartbeat_fix.demo.config import DemoError
from airflow_heartbeat_fix.demo.logs import count_callbacks, count_emails, count_per_map_index, read_jsonl
from airflow_heartbeat_fix.demo.records import CALLBACK_LOG_NAME, EMAIL_LOG_NAME
from airflow_heartbeat_fix.demo.result import (
    DAG_IDS,
    EVERY_DAG_ID,
    DagOutcome,
    TryRow,
    state_name,
)

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Mapping
    from pathlib import Path

    from sqlalchemy.engine import URL, Engine

#: Created in a ``--database`` right after the demo reset it: a later demo may reset it again unasked.
DEMO_TABLE = "airflow_heartbeat_fix_demo"
#: Rows the demo never writes: in a database it marked, any of them came from someone else.
FOREIGN_ROWS = {"variable": "variables", "connection": "connections"}


def sqlite_url(path: Path) -> str:
    return f"sqlite:///{path}"


def engine(url: str | URL, **options: Any) -> Engine:
    """An engine that keeps no connection open between uses (``NullPool``): Airflow's own processes
    migrate, reset and write the same database, and a pooled connection would hold SQLite's lock."""
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    return create_engine(url, poolclass=NullPool, **options)


@contextlib.contextmanager
def disposed_engine(url: str | URL, **options: Any) -> Iterator[Engine]:
    """:func:`engine` for one block, disposed of when it ends."""
    used = engine(url, **options)
    try:
        yield used
    finally:
        used.dispose()


def display_url(url: str) -> str:
    """``url`` with its password masked, for messages."""
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


# --- one run's database ---------------------------------------------------------------------------


class Db:
    """Read-only, short queries against one run's metadata database."""

    def __init__(self, url: str, dag_ids: tuple[str, ...] = DAG_IDS) -> None:
        self.dag_ids = dag_ids
        self.engine = engine(url)
        self._columns: dict[str, list[str]] = {}

    def columns(self, table: str) -> list[str]:
        if table not in self._columns:
            from sqlalchemy import inspect

            inspector = inspect(self.engine)
            names = inspector.get_table_names()
            self._columns[table] = [c["name"] for c in inspector.get_columns(table)] if table in names else []
        return self._columns[table]

    def rows(self, table: str, wanted: tuple[str, ...]) -> list[dict[str, Any]]:
        """The ``wanted`` columns this release has (others are left out) of the demo Dags' rows."""
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

    def dag_run_states(self) -> dict[str, str | None]:
        """Run id -> state of the Dag runs (``--scenario kill-dag-processor`` runs one Dag three times)."""
        return {str(r["run_id"]): state_name(r["state"]) for r in self.rows("dag_run", ("run_id", "state"))}

    def dispose(self) -> None:
        self.engine.dispose()


def read_outcomes(db: Db, home: Path) -> dict[str, DagOutcome]:
    """Each Dag run of the run in ``home``: its state, its tries, and the callbacks and emails recorded."""
    # Airflow 3.4 calls map_index region_index; working_set and archived_reason are 3.4's too.
    index_cols = ("dag_id", "task_id", "map_index", "region_index", "try_number", "state")
    ti_rows = [
        mapped_task_id(r) for r in db.rows("task_instance", (*index_cols, "working_set", "archived_reason"))
    ]
    history = [mapped_task_id(r) for r in db.rows("task_instance_history", index_cols)]
    runs = db.rows("dag_run", ("dag_id", "run_id", "state"))
    callbacks = read_jsonl(home / CALLBACK_LOG_NAME)
    emails = read_jsonl(home / EMAIL_LOG_NAME)
    outcomes: dict[str, DagOutcome] = {}
    for run in runs:
        dag_id = str(run["dag_id"])
        outcomes[dag_id] = DagOutcome(
            dag_id=dag_id,
            run_state=state_name(run["state"]),
            tries=tries_from_rows(ti_rows, history, dag_id),
            callbacks=count_callbacks(callbacks, dag_id),
            emails=count_emails(emails, dag_id),
            per_map_index=count_per_map_index(callbacks, dag_id),
        )
    return outcomes


def mapped_task_id(row: dict[str, Any]) -> dict[str, Any]:
    """A mapped task instance's row with ``stall[7]`` as its task id, so each map index has its tries."""
    index = row.get("map_index", row.get("region_index"))
    if index is None or int(index) < 0:
        return row
    return {**row, "task_id": f"{row['task_id']}[{index}]"}


def tries_from_rows(
    ti_rows: Iterable[Mapping[str, Any]], history_rows: Iterable[Mapping[str, Any]], dag_id: str
) -> list[TryRow]:
    """
    Every try of ``dag_id``'s task instances, ordered by task and try number.

    Airflow 3.4 keeps each try in ``task_instance``: the current one has ``working_set`` true, earlier
    ones are archived with an ``archived_reason``. Airflow <= 3.3 keeps the current try in
    ``task_instance`` and earlier ones in ``task_instance_history``; there, a task instance waiting for
    its retry still carries the old try number, so a current row in ``up_for_retry`` whose try is already
    in the history is shown as the next try.
    """
    tries: dict[tuple[str, int], TryRow] = {}
    for row in history_rows:
        if row.get("dag_id") != dag_id:
            continue
        key = (str(row["task_id"]), int(row["try_number"]))
        tries[key] = TryRow(key[0], key[1], state_name(row.get("state")), "history")
    for row in ti_rows:
        if row.get("dag_id") != dag_id:
            continue
        task_id, try_number, state = str(row["task_id"]), int(row["try_number"]), state_name(row.get("state"))
        if try_number == 0:  # created, never scheduled: no try yet
            continue
        working_set = row.get("working_set", True)
        if working_set is not None and not working_set:
            continue
        if working_set is None:
            reason = row.get("archived_reason")
            tries[(task_id, try_number)] = TryRow(task_id, try_number, state, "archived", reason)
            continue
        archived = tries.get((task_id, try_number))
        if archived is not None and archived.where == "history" and state == "up_for_retry":
            try_number += 1
        tries[(task_id, try_number)] = TryRow(task_id, try_number, state, "current")
    return [tries[key] for key in sorted(tries)]


# --- what the checks before a run read of a --database --------------------------------------------


def database_tables(url: str) -> list[str]:
    """The tables of the database at ``url``."""
    from sqlalchemy import inspect

    with disposed_engine(url) as found:
        return sorted(inspect(found).get_table_names())


def foreign_data(url: str, tables: list[str]) -> list[str]:
    """What a database the demo marked holds that it did not write: other Dags, variables, connections."""
    from sqlalchemy import bindparam, text

    found: list[str] = []
    with disposed_engine(url) as marked, marked.connect() as conn:
        if "dag" in tables:
            query = text("SELECT dag_id FROM dag WHERE dag_id NOT IN :ours ORDER BY dag_id").bindparams(
                bindparam("ours", expanding=True)
            )
            every_demo_dag = list(EVERY_DAG_ID)
            others = list(conn.execute(query, {"ours": every_demo_dag}).scalars())
            if others:
                found.append(f"Dags {', '.join(others[:5])}{', ...' if len(others) > 5 else ''}")
        for table, what in FOREIGN_ROWS.items():
            if table in tables and (count := conn.execute(text(f"SELECT COUNT(*) FROM {table}")).scalar()):
                found.append(f"{count} {what}")
    return found


def mark_database_as_demo(url: str) -> None:
    from sqlalchemy import text

    with disposed_engine(url) as marked, marked.begin() as conn:
        conn.execute(text(f"CREATE TABLE IF NOT EXISTS {DEMO_TABLE} (note VARCHAR(100))"))


def ensure_database_exists(url: str) -> None:
    """Create the PostgreSQL database of ``url`` (through the ``postgres`` database) if it is missing."""
    from sqlalchemy import text
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import OperationalError

    try:
        with disposed_engine(url) as target_engine, target_engine.connect():
            return
    except OperationalError as exc:
        if "does not exist" not in str(exc):
            reason = str(exc).strip().splitlines()[0]  # without SQLAlchemy's "Background on this error" line
            raise DemoError(f"cannot connect to {display_url(url)}: {reason}") from exc
    target = make_url(url)
    with (
        disposed_engine(target.set(database="postgres"), isolation_level="AUTOCOMMIT") as admin,
        admin.connect() as conn,
    ):
        conn.execute(text(f'CREATE DATABASE "{target.database}"'))
