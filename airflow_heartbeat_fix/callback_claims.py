"""
PROTOTYPE (issue 33, phase 1; not wired into activation): a Dag processor callback request claimed by
the process that runs its callback, and deleted only once the callback has run.

Stock Airflow deletes a request when the Dag processor's manager *fetches* it and then holds it in memory
until a file processor runs it: a manager or file processor that dies in between loses it for good. Here
the manager only reads the request (and leaves it stored); the file processor that runs it claims it
first, per request, in two short transactions on a connection of its own:

1. *mark*: lock the row (``FOR UPDATE SKIP LOCKED``: a row another live process is running is skipped),
   add one to the attempt count kept in the row's own payload, commit. The count says how many processes
   started it; more than one means an earlier one died while running it.
2. *hold*: lock the row again (``SKIP LOCKED``) only if the count is still this attempt's; keep that
   transaction open while the callback runs; delete the row and commit when it has run (or failed in its
   own code). The lock dies with the process's connection, so a dead process's request is visible again.

Between 1 and 2 another process may take the row (it then sees this attempt's count and runs the next
one); this process's step 2 then finds another count and skips: the request still runs once, but the
other process counts it as a rerun.

SQLite has no row locks: there a byte-range lock (``fcntl.lockf``) on a file beside the database, held
from step 1 to the delete, does what the row lock does (SQLite's processes share one host); the kernel
releases it when the process dies.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import create_engine, delete, select, update
from sqlalchemy.pool import NullPool

if TYPE_CHECKING:
    from collections.abc import Iterator

    from sqlalchemy.engine import Connection, Engine
    from sqlalchemy.sql.schema import Column, Table

#: Where the attempt count lives in a request's payload (the JSON the Dag processor parses ignores it).
ATTEMPTS_KEY = "heartbeat_fix_attempts"


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
        return int(data.get(ATTEMPTS_KEY, 0))

    def with_attempts(self, value: Any, attempts: int) -> Any:
        data = json.loads(value) if self.holds_string else dict(value)
        data[ATTEMPTS_KEY] = attempts
        return json.dumps(data) if self.holds_string else data


def _lock_offset(row_id: Any) -> int:
    """A byte offset per request id for ``lockf``: the integer id, or a UUID's low 62 bits."""
    number = row_id.int if isinstance(row_id, uuid.UUID) else int(row_id)
    return number & ((1 << 62) - 1)


@dataclass
class Claimed:
    """A request this process holds: run its callback, then :meth:`Claims.done` (or let the process die)."""

    row_id: Any
    attempt: int
    connection: Connection | None
    transaction: Any


class Claims:
    """One file processor's claims, on its own connection (the manager's pool is not fork-safe)."""

    def __init__(self, url: str, table: Table, *, lock_file: str | None = None) -> None:
        self._engine: Engine = create_engine(url, poolclass=NullPool)
        self._table = table
        self._payload = Payload.of(table)
        self._sqlite = self._engine.dialect.name == "sqlite"
        self._lock_fd: int | None = None
        if self._sqlite:
            path = lock_file or f"{self._engine.url.database}.heartbeat-fix-callbacks.lock"
            self._lock_fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)

    def close(self) -> None:
        self._engine.dispose()
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases every lockf lock of this process on the file
            self._lock_fd = None

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

    def _locked_row(self, connection: Connection, row_id: Any) -> Any:
        query = select(self._table.c.id, self._payload.column).where(self._table.c.id == row_id)
        if not self._sqlite:
            query = query.with_for_update(skip_locked=True)
        return connection.execute(query).first()

    def claim(self, row_id: Any) -> Claimed | None:
        """The request, held by this process; ``None`` if it is gone or another live process runs it."""
        if not self._file_lock(row_id):
            return None
        with self._engine.begin() as connection:  # step 1: mark
            row = self._locked_row(connection, row_id)
            if row is None:
                self._file_unlock(row_id)
                return None
            attempt = self._payload.attempts(row[1]) + 1
            connection.execute(
                update(self._table)
                .where(self._table.c.id == row_id)
                .values({self._payload.column.key: self._payload.with_attempts(row[1], attempt)})
            )
        if self._sqlite:  # the file lock holds it; no transaction stays open while the callback runs
            return Claimed(row_id, attempt, None, None)
        connection = self._engine.connect()  # step 2: hold
        transaction = connection.begin()
        row = self._locked_row(connection, row_id)
        if row is None or self._payload.attempts(row[1]) != attempt:
            transaction.rollback()
            connection.close()
            return None
        return Claimed(row_id, attempt, connection, transaction)

    def done(self, claimed: Claimed) -> None:
        """The callback ran (or failed in its own code): the request leaves the database."""
        if claimed.connection is None:
            with self._engine.begin() as connection:
                connection.execute(delete(self._table).where(self._table.c.id == claimed.row_id))
            self._file_unlock(claimed.row_id)
            return
        claimed.connection.execute(delete(self._table).where(self._table.c.id == claimed.row_id))
        claimed.transaction.commit()
        claimed.connection.close()

    def release(self, claimed: Claimed) -> None:
        """Give the request back without running it (its attempt stays counted)."""
        if claimed.connection is None:
            self._file_unlock(claimed.row_id)
            return
        claimed.transaction.rollback()
        claimed.connection.close()

    @contextlib.contextmanager
    def holding(self, row_id: Any) -> Iterator[Claimed | None]:
        """:meth:`claim`, then :meth:`done` if the block ends normally, :meth:`release` if it raises."""
        claimed = self.claim(row_id)
        if claimed is None:
            yield None
            return
        try:
            yield claimed
        except BaseException:
            self.release(claimed)
            raise
        self.done(claimed)
