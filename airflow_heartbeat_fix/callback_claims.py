"""
A Dag processor callback request claimed by the process that runs its callback, and deleted only once the
callback has run: the database side of ``claimed_callback_delivery``.

Stock Airflow deletes a request when the Dag processor's manager *fetches* it and then holds it in memory
until a file processor runs it: a manager or file processor that dies in between loses it for good. Here
the manager only reads the request (and leaves it stored); the file processor that runs it claims it
first, per request, in two short transactions on its own connection:

1. *mark*: lock the row (``FOR UPDATE SKIP LOCKED``: a row another live process is running is skipped),
   add one to the attempt count kept in the row's own payload, commit. The count says how many processes
   started it; more than one means an earlier one died while running it.
2. *hold*: lock the row again (``SKIP LOCKED``) only if the count is still this attempt's, and keep that
   transaction open while the callback runs; delete the row and commit when it has run (or failed in its
   own code). The lock dies with the process's connection, so a dead process's request is visible again.

Between 1 and 2 another process may take the row (it then sees this attempt's count and runs the next
attempt); step 2 here then finds another count and skips: the request still runs once, but the other
process counts a rerun that was none.

SQLite has no row locks: there a byte-range lock (``fcntl.lockf``) on a file beside the database, held
from step 1 to the delete, does what the row lock does (SQLite's processes share one host), and no
transaction stays open while the callback runs (it would hold SQLite's write lock against the scheduler).
The kernel releases the byte-range lock when the process dies.

The attempt count is a key of the payload Airflow parses with pydantic's default (``extra="ignore"``): the
stock Dag processor does not see it, so no schema change is needed and a rolling upgrade is safe.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, select, text, update

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine
    from sqlalchemy.sql.schema import Column, Table

#: Where the attempt count lives in a request's payload (the JSON the Dag processor parses ignores it).
ATTEMPTS_KEY = "heartbeat_fix_attempts"
#: Tries of a claim that meets a busy database before the batch gives up (its rows wait for the next).
CLAIM_RETRIES = 3
#: PostgreSQL: ``SET LOCAL`` of both, in one statement.
HOLD_SETTINGS = text(
    "SELECT set_config('idle_in_transaction_session_timeout', '0', true), "
    "set_config('tcp_keepalives_idle', '30', true)"
)


@dataclass(frozen=True)
class Payload:
    """The column that holds a stored request, and how to read and write the attempt count in it."""

    column: Column[Any]
    #: 3.0/3.1 ``callback_request.callback_data``: the request's JSON as a string; 3.2+ ``callback.data``:
    #: a dict ({"req_class", "req_data"}) to which a key can be added.
    holds_string: bool

    @classmethod
    def of(cls, table: Table) -> Payload:
        if "callback_data" in table.c:
            return cls(table.c.callback_data, holds_string=True)
        return cls(table.c.data, holds_string=False)

    def attempts(self, value: Any) -> int:
        data = json.loads(value) if self.holds_string else value
        return int(data.get(ATTEMPTS_KEY, 0)) if isinstance(data, dict) else 0

    def with_attempts(self, value: Any, attempts: int) -> Any:
        data = json.loads(value) if self.holds_string else dict(value)
        data[ATTEMPTS_KEY] = attempts
        return json.dumps(data) if self.holds_string else data


def lock_file_of(engine: Engine) -> str | None:
    """The file whose byte ranges stand for SQLite's row locks; ``None`` on a database with row locks."""
    if engine.dialect.name != "sqlite":
        return None
    return f"{engine.url.database}.heartbeat-fix-callbacks.lock"


def _lock_offset(row_id: Any) -> int:
    """A byte offset per request id for ``lockf``: the integer id, or a UUID's low 62 bits."""
    number = row_id.int if isinstance(row_id, uuid.UUID) else int(row_id)
    return number & ((1 << 62) - 1)


def held_elsewhere(lock_file: str, row_ids: list[Any]) -> set[Any]:
    """
    SQLite: the requests whose byte-range lock another process holds (a file processor running them, of
    any Dag processor on this host). The file is opened and closed here: closing a file releases *every*
    ``lockf`` lock of the closing process on it, so a descriptor kept open would be inherited by the file
    processors the caller forks, and their closing it would drop their claims.
    """
    if not row_ids or not os.path.exists(lock_file):
        return set()
    held = set()
    fd = os.open(lock_file, os.O_RDWR)
    try:
        for row_id in row_ids:
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, _lock_offset(row_id), os.SEEK_SET)
            except OSError:
                held.add(row_id)
            else:
                fcntl.lockf(fd, fcntl.LOCK_UN, 1, _lock_offset(row_id), os.SEEK_SET)
    finally:
        os.close(fd)
    return held


@dataclass
class Claimed:
    """A request this process holds: run its callback, then :meth:`Claims.done` (or let the process die)."""

    row_id: Any
    attempt: int
    #: The open transaction holding the row lock (``None`` on SQLite, where the file lock holds it).
    transaction: Any = None


class ClaimLost(Exception):
    """The connection holding a claim broke before the request was deleted: it may run again."""


class Claims:
    """
    One file processor's claims, on one connection of its own for the whole batch.

    ``engine``: the manager's engine, inherited through the fork; :meth:`open` gives the child a pool of
    its own (``dispose(close=False)`` leaves the manager's connections alone, as SQLAlchemy prescribes
    after a fork) so that Airflow's connection arguments and event handlers (TLS, SQLite's pragmas) apply.
    """

    def __init__(self, engine: Engine, table: Table) -> None:
        self._engine = engine
        self._table = table
        self._payload = Payload.of(table)
        self._lock_file = lock_file_of(engine)
        self._lock_fd: int | None = None
        self._connection: Connection | None = None

    def open(self) -> None:
        self._engine.dispose(close=False)
        self._connection = self._engine.connect()
        if self._lock_file is not None:
            self._lock_fd = os.open(self._lock_file, os.O_RDWR | os.O_CREAT, 0o600)

    def close(self) -> None:
        if self._connection is not None:
            try:
                self._connection.close()
            finally:
                self._connection = None
                self._engine.dispose()
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases every lockf lock of this process on the file
            self._lock_fd = None

    @property
    def connection(self) -> Connection:
        if self._connection is None:
            raise RuntimeError("Claims.open() was not called")
        return self._connection

    # -- SQLite: the byte-range lock ------------------------------------------------------------------

    def _file_lock(self, row_id: Any) -> bool:
        if self._lock_fd is None:
            return True
        try:
            fcntl.lockf(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, _lock_offset(row_id), os.SEEK_SET)
        except OSError:
            return False
        return True

    def _file_unlock(self, row_id: Any) -> None:
        if self._lock_fd is not None:
            fcntl.lockf(self._lock_fd, fcntl.LOCK_UN, 1, _lock_offset(row_id), os.SEEK_SET)

    # -- the two steps ---------------------------------------------------------------------------------

    def _locked_row(self, row_id: Any) -> Any:
        query = select(self._table.c.id, self._payload.column).where(self._table.c.id == row_id)
        if self._lock_fd is None:
            query = query.with_for_update(skip_locked=True)
        return self.connection.execute(query).first()

    def claim(self, row_id: Any) -> Claimed | None:
        """
        The request, held by this process; ``None`` if it is gone or another live process runs it. A busy
        database (SQLite's write lock) is tried again a few times before the error is raised.
        """
        from sqlalchemy.exc import OperationalError

        for retry in range(CLAIM_RETRIES):
            try:
                return self._claim(row_id)
            except OperationalError:
                if self.connection.in_transaction():
                    self.connection.rollback()
                self._file_unlock(row_id)
                if retry == CLAIM_RETRIES - 1:
                    raise
                time.sleep(0.5 * (retry + 1))
        return None

    def _claim(self, row_id: Any) -> Claimed | None:
        if not self._file_lock(row_id):
            return None
        connection = self.connection
        with connection.begin():  # step 1: mark
            row = self._locked_row(row_id)
            if row is None:
                self._file_unlock(row_id)
                return None
            attempt = self._payload.attempts(row[1]) + 1
            connection.execute(
                update(self._table)
                .where(self._table.c.id == row_id)
                .values({self._payload.column.key: self._payload.with_attempts(row[1], attempt)})
            )
        if self._lock_fd is not None:  # the file lock holds it; no transaction stays open meanwhile
            return Claimed(row_id, attempt)
        transaction = connection.begin()  # step 2: hold
        if connection.dialect.name == "postgresql":
            # A callback may run for minutes inside this transaction: a server-side idle limit would end
            # it (and free the lock while the callback runs); keepalives free a lost host's lock sooner.
            # Local to the transaction (a pooler in transaction mode hands the session to others after).
            connection.execute(HOLD_SETTINGS)
        row = self._locked_row(row_id)
        if row is None or self._payload.attempts(row[1]) != attempt:
            transaction.rollback()
            return None
        return Claimed(row_id, attempt, transaction)

    def done(self, claimed: Claimed) -> None:
        """The callback ran (or failed in its own code): the request leaves the database."""
        from sqlalchemy.exc import DBAPIError

        statement = delete(self._table).where(self._table.c.id == claimed.row_id)
        try:
            if claimed.transaction is None:
                with self.connection.begin():
                    self.connection.execute(statement)
            else:
                self.connection.execute(statement)
                claimed.transaction.commit()
        except DBAPIError as error:
            raise ClaimLost(str(error).splitlines()[0]) from error
        finally:
            self._file_unlock(claimed.row_id)

    def abandon(self, row_id: Any) -> bool:
        """Delete a request without running it (past its attempts); False if it is gone or held elsewhere."""
        if not self._file_lock(row_id):
            return False
        try:
            with self.connection.begin():
                if self._locked_row(row_id) is None:
                    return False
                self.connection.execute(delete(self._table).where(self._table.c.id == row_id))
            return True
        finally:
            self._file_unlock(row_id)

    def release(self, claimed: Claimed) -> None:
        """Give the request back without deleting it (its attempt stays counted)."""
        try:
            if claimed.transaction is not None:
                claimed.transaction.rollback()
        finally:
            self._file_unlock(claimed.row_id)
