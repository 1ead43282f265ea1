"""
The fixtures of upstream's ``tests_common.pytest_plugin`` that this repository's tests use.

* ``dag_maker``: ``with dag_maker(dag_id=..., **dag_kwargs) as dag:`` builds a Dag and, on leaving the
  block, stores it the way the Dag processor does (``DagBag.bag_dag`` + ``sync_bag_to_db``), sets
  ``dag_maker.dag_model``; ``dag_maker.create_dagrun(**kwargs)`` creates a run from the serialized Dag
  (RUNNING, ``run_id="test"``, logical date = the Dag's start date unless given). Runs, task
  instances, versions and Dags it made are deleted after the test.
* ``session``: the thread's scoped session, as ``create_session()`` hands it out; rolled back after.
* ``cap_structlog``: every structlog event (and stdlib record) logged during the test, unformatted,
  with ``.entries``, ``.messages``, ``.text`` and ``"event" in cap_structlog``.
* ``@pytest.mark.backend("postgres")``: tests for other backends are deselected (upstream skips them),
  so a SQLite run shows no skips; the header says which were left out.

Nothing Airflow is imported at module level: the conftest configures Airflow first.
"""

from __future__ import annotations

import logging
import os
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from testing.dags import ensure_bundle, sync_dag_to_db
from testing.database import backend

if TYPE_CHECKING:
    from collections.abc import Iterator, MutableMapping

    from sqlalchemy.orm import Session

#: Upstream's default start date of a ``dag_maker`` Dag when the test module defines no DEFAULT_DATE.
DEFAULT_DATE = datetime(2016, 1, 1, tzinfo=timezone.utc)

_NOTSET: Any = object()


def current_backend() -> str:
    """``sqlite``, ``postgres`` or ``mysql``: the backend of the configured metadata database."""
    return backend(os.environ.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "sqlite://"))


def _wrong_backend(item: pytest.Item, backend: str) -> bool:
    marker = item.get_closest_marker("backend")
    return marker is not None and backend not in marker.args


def pytest_report_header(config: pytest.Config) -> str:
    backend = current_backend()
    return (
        f"metadata database backend: {backend} "
        f'(tests marked backend(...) without "{backend}" are deselected, not skipped)'
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    backend = current_backend()
    elsewhere = [item for item in items if _wrong_backend(item, backend)]
    if elsewhere:
        config.hook.pytest_deselected(items=elsewhere)
        items[:] = [item for item in items if not _wrong_backend(item, backend)]


@pytest.fixture
def session() -> Iterator[Session]:
    """The thread's scoped session: the one the scheduler loop and ``provide_session`` code use."""
    from airflow.utils.session import create_session

    with create_session() as scoped:
        yield scoped
        scoped.rollback()


class DagMaker:
    """What the ``dag_maker`` fixture returns; upstream's ``DagMaker`` type, for annotations too."""

    def __init__(self, request: pytest.FixtureRequest) -> None:
        self._request = request
        self._made: list[str] = []
        self.dag: Any = None
        self.dag_model: Any = None
        self.dag_run: Any = None
        self.session: Session | None = None
        self.start_date: Any = DEFAULT_DATE  # a datetime, or what the test module passed
        self.bundle_name = "dag_maker"
        self.bundle_version: str | None = None

    def __call__(
        self,
        dag_id: str = "test_dag",
        schedule: Any = timedelta(days=1),
        serialized: bool = True,
        fileloc: str | None = None,
        relative_fileloc: str | None = None,
        bundle_name: str | None = None,
        bundle_version: str | None = None,
        session: Session | None = None,
        **kwargs: Any,
    ) -> DagMaker:
        from airflow import settings
        from airflow.sdk import DAG

        scoped_session: Any = settings.Session  # the thread's scoped session, as upstream takes it
        self.session = session or scoped_session()
        default_args: dict[str, Any] = kwargs.get("default_args") or {}
        self.start_date = (
            kwargs.get("start_date")
            or default_args.get("start_date")
            or getattr(self._request.module, "DEFAULT_DATE", DEFAULT_DATE)
        )
        kwargs["start_date"] = self.start_date
        self.dag = DAG(dag_id, schedule=schedule, **kwargs)
        module_file = self._request.module.__file__
        self.dag.fileloc = fileloc or module_file
        self.dag.relative_fileloc = relative_fileloc or Path(module_file).name
        self.bundle_name = bundle_name or "dag_maker"
        self.bundle_version = bundle_version
        ensure_bundle(self.bundle_name, self.session)
        return self

    def __enter__(self) -> Any:
        self.dag.__enter__()
        return self.dag

    def __exit__(self, exc_type: Any, exc: Any, traceback: Any) -> None:
        from airflow.models.dag import DagModel

        self.dag.__exit__(exc_type, exc, traceback)
        if exc_type is not None:
            return
        self.sync_dag_to_db()
        self.dag_model = self._session.get(DagModel, self.dag.dag_id)
        self._session.commit()

    @property
    def _session(self) -> Session:
        if self.session is None:
            raise RuntimeError("call dag_maker(...) before using it")
        return self.session

    def sync_dag_to_db(self) -> None:
        """Store the Dag as the Dag processor does: bag it and sync the bag (Dag, version, serialized)."""
        sync_dag_to_db(self.dag, self.bundle_name, self.bundle_version, self._session)
        if self.dag.dag_id not in self._made:
            self._made.append(self.dag.dag_id)

    @property
    def serialized_model(self) -> Any:
        from airflow.models.serialized_dag import SerializedDagModel

        return SerializedDagModel.get(self.dag.dag_id, session=self._session)

    @property
    def serialized_dag(self) -> Any:
        """The Dag as the scheduler sees it: deserialized from the latest stored version."""
        return self.serialized_model.dag

    def create_dagrun(self, *, logical_date: Any = _NOTSET, **kwargs: Any) -> Any:
        """A run of the serialized Dag, committed; manual unless ``run_type`` says otherwise."""
        from airflow.utils.state import DagRunState
        from airflow.utils.types import DagRunTriggeredByType, DagRunType

        dag = self.serialized_dag
        run_type = DagRunType(kwargs.get("run_type", DagRunType.MANUAL))
        if logical_date is _NOTSET:
            if run_type != DagRunType.MANUAL:
                raise NotImplementedError("the stand-in dag_maker creates manual runs unless given a date")
            logical_date = self.start_date
        if "data_interval" not in kwargs and logical_date is not None:
            kwargs["data_interval"] = dag.timetable.infer_manual_data_interval(run_after=logical_date)
        data_interval = kwargs.get("data_interval")
        kwargs.setdefault("run_id", "test")
        kwargs.setdefault("state", DagRunState.RUNNING)
        kwargs.setdefault("start_date", self.start_date)
        kwargs.setdefault("triggered_by", DagRunTriggeredByType.TEST)
        kwargs.setdefault("run_after", data_interval[-1] if data_interval else datetime.now(tz=timezone.utc))
        kwargs.setdefault("session", self._session)
        self.dag_run = dag.create_dagrun(logical_date=logical_date, run_type=run_type, **kwargs)
        for ti in self.dag_run.task_instances:
            ti.refresh_from_task(dag.get_task(ti.task_id))
        self._session.commit()
        return self.dag_run

    def cleanup(self) -> None:
        """Delete what this test's Dags left in the database, as upstream's ``dag_maker`` does."""
        from airflow.models.dag import DagModel
        from airflow.models.dag_version import DagVersion
        from airflow.models.dagrun import DagRun
        from airflow.models.taskinstance import TaskInstance
        from sqlalchemy import delete

        if not self._made or self.session is None:
            return
        self.session.rollback()
        for model in (DagRun, TaskInstance, DagVersion, DagModel):
            self.session.execute(delete(model).where(model.dag_id.in_(self._made)))
        self.session.commit()


@pytest.fixture
def dag_maker(request: pytest.FixtureRequest) -> Iterator[DagMaker]:
    maker = DagMaker(request)
    try:
        yield maker
    finally:
        maker.cleanup()


class StructlogCapture:
    """Events logged during a test, as upstream's ``cap_structlog`` records them (messages unformatted)."""

    def __init__(self) -> None:
        self.entries: list[MutableMapping[str, Any]] = []

    def __call__(self, logger: Any, method_name: str, event_dict: MutableMapping[str, Any]) -> Any:
        from structlog import DropEvent

        event_dict["event"] = str(event_dict["event"])
        event_dict.setdefault("log_level", method_name)
        if name := getattr(logger, "name", None):
            event_dict["logger_name"] = name
        self.entries.append(event_dict)
        raise DropEvent

    def __contains__(self, target: object) -> bool:
        if isinstance(target, str):
            return any(entry["event"] == target for entry in self.entries)
        if isinstance(target, dict):
            return any(all(entry.get(k) == v for k, v in target.items()) for entry in self.entries)
        raise TypeError(f"Can't search logs using {type(target)}")

    def __iter__(self) -> Iterator[MutableMapping[str, Any]]:
        return iter(self.entries)

    @property
    def messages(self) -> list[str]:
        return [entry["event"] for entry in self.entries]

    @property
    def text(self) -> str:
        return "".join(f"{message}\n" for message in self.messages)


class _StdlibToCapture(logging.Handler):
    """Hands stdlib records to the capture as structlog-style events (message not formatted)."""

    def __init__(self, capture: StructlogCapture) -> None:
        super().__init__(level=logging.NOTSET)
        self.capture = capture

    def emit(self, record: logging.LogRecord) -> None:
        event = {"event": str(record.msg), "log_level": record.levelname.lower(), "logger": record.name}
        self.capture.entries.append(event)


@pytest.fixture
def cap_structlog() -> Iterator[StructlogCapture]:
    import structlog

    capture = StructlogCapture()
    # Bound loggers hold a reference to this very list: change its contents, never replace it.
    processors = structlog.get_config()["processors"]
    saved = list(processors)
    processors[:] = [capture]
    structlog.configure(processors=processors)
    handler = _StdlibToCapture(capture)
    logging.root.addHandler(handler)
    try:
        yield capture
    finally:
        logging.root.removeHandler(handler)
        processors[:] = saved
        structlog.configure(processors=processors)
