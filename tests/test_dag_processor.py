"""
The Dag processor fixes' decisions (pure functions of ``airflow_heartbeat_fix.dag_processor`` and
``callback_delivery``), the manager class they build, and its fix gauges. The real Dag processor runs in
``tests/unit/dag_processing/test_heartbeat_fix_callback_delivery.py``.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from airflow_heartbeat_fix import activation
from airflow_heartbeat_fix.callback_delivery import describe, past_limit
from airflow_heartbeat_fix.dag_processor import (
    DagProcessorGaugesMixin,
    FetchShape,
    Verdict,
    build_manager_class,
    files_to_requeue,
    interrupted_first,
    judge,
    queue_first,
)
from airflow_heartbeat_fix.detection import (
    CLAIMED_FIX,
    DAG_PROCESSOR,
    DAG_PROCESSOR_FIXES,
    INFLATION_FIX,
    ISOLATED_FIX,
    FixState,
)
from airflow_heartbeat_fix.metrics import gauge_name

pytestmark = pytest.mark.mode_independent

R, S, U = Verdict.RUN, Verdict.ABANDON_STARTED, Verdict.ABANDON_UNCLAIMED


@pytest.mark.parametrize(
    ("attempts", "handed_at", "unclaimed", "expected"),
    [
        pytest.param(0, None, 0, (R, 0), id="new request"),
        pytest.param(1, None, 0, (R, 0), id="a dead processor of another manager started it"),
        pytest.param(1, 0, 0, (R, 0), id="handed out, started, died: a rerun"),
        pytest.param(0, 0, 0, (R, 1), id="handed out, never started: counted"),
        pytest.param(0, 0, 2, (U, 3), id="the third hand-out never started: abandoned"),
        pytest.param(2, 1, 2, (R, 0), id="started again: the count of hand-outs restarts"),
        pytest.param(3, 2, 0, (S, 0), id="three processors died running it: abandoned"),
        pytest.param(3, None, 0, (S, 0), id="after a restart too"),
    ],
)
def test_judge(attempts: int, handed_at: int | None, unclaimed: int, expected: tuple[Verdict, int]) -> None:
    assert judge(attempts, handed_at, unclaimed, max_attempts=3) == expected


def test_a_request_runs_at_most_max_attempts_times() -> None:
    assert [past_limit(attempt, 3) for attempt in (1, 2, 3, 4)] == [False, False, False, True]


def test_interrupted_requests_first_in_a_batch() -> None:
    attempts = {"a": 0, "b": 1, "c": 0, "d": 2}
    assert interrupted_first(list("abcd"), attempts.__getitem__) == ["b", "d", "a", "c"]


def test_files_with_waiting_requests_are_queued_again_once_their_processor_is_gone() -> None:
    waiting: dict[str, list[Any]] = {"parsed": [1], "running": [2], "queued": [3], "nothing": []}
    assert files_to_requeue(waiting, processing={"running"}, queued={"queued"}) == ["parsed"]


def test_queue_first_puts_files_first_in_the_installed_managers_queue() -> None:
    """3.0.0 to 3.1.7 take ``add_at_front``, later releases ``mode``: a wrong one ends the Dag processor."""
    from pathlib import Path

    from airflow.dag_processing.manager import DagFileInfo, DagFileProcessorManager

    manager = DagFileProcessorManager(max_runs=1)
    parsed, waiting = (
        DagFileInfo(rel_path=Path(name), bundle_name="dags-folder") for name in ("a.py", "b.py")
    )
    queue_first(manager, [parsed])
    queue_first(manager, [waiting])
    assert list(manager._file_queue) == [waiting, parsed]


def test_fetch_shape_is_read_off_the_stock_fetch() -> None:
    def legacy(self: Any, session: Any) -> None:
        query = select(DbCallbackRequest).order_by(DbCallbackRequest.priority_weight.asc())  # noqa: F821
        session.scalars(query)

    def current(self: Any, session: Any) -> None:
        names = [b.name for b in self._dag_bundles if not b.supports_versioning or b.is_initialized]
        select(DbCallbackRequest).where(DbCallbackRequest.bundle_name.in_(names)).order_by(  # noqa: F821
            DbCallbackRequest.priority_weight.desc()  # noqa: F821
        )

    assert FetchShape.of(legacy) == FetchShape(ascending=True, by_bundle=False, ready_bundles_only=False)
    assert FetchShape.of(current) == FetchShape(ascending=False, by_bundle=True, ready_bundles_only=True)


def test_fetch_shape_of_the_installed_release_agrees_with_its_source() -> None:
    """On every Python: before 3.12 the names a comprehension uses are not in the function's own code."""
    import inspect

    from airflow.dag_processing.manager import DagFileProcessorManager

    from airflow_heartbeat_fix.facts import stock_callback_fetch

    fetch = stock_callback_fetch(DagFileProcessorManager)
    source = inspect.getsource(fetch)
    assert FetchShape.of(fetch) == FetchShape(
        ascending=".asc()" in source,
        by_bundle="self._dag_bundles" in source,
        ready_bundles_only=".is_initialized" in source,
    )


def test_describe_names_the_request() -> None:
    from airflow.callbacks.callback_requests import DagCallbackRequest

    request = DagCallbackRequest(
        filepath="f.py", bundle_name="dags-folder", bundle_version=None, dag_id="d", run_id="r"
    )
    assert describe(request) == "DagCallbackRequest for d/r"


def test_the_manager_class_carries_the_active_fixes_only() -> None:
    from airflow.dag_processing.manager import DagFileProcessorManager

    claimed = build_manager_class((CLAIMED_FIX, ISOLATED_FIX), base=DagFileProcessorManager)
    assert claimed.__mro__[1] is DagProcessorGaugesMixin
    assert issubclass(claimed, DagFileProcessorManager)
    assert "_fetch_without_delete" in dir(claimed)
    isolated = build_manager_class((ISOLATED_FIX,), base=DagFileProcessorManager)
    assert "_fetch_without_delete" not in dir(isolated)
    assert isolated.heartbeat_fixes == (ISOLATED_FIX,)


def test_dag_processor_target_installs_and_uninstalls(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.cli.commands import dag_processor_command
    from airflow.dag_processing import processor

    monkeypatch.setenv("AIRFLOW__HEARTBEAT_FIX__ENABLED", "True")
    activation.uninstall(DAG_PROCESSOR)
    originals = activation._dag_processor_originals()
    try:
        decided = activation.install(target=DAG_PROCESSOR)
        assert list(decided) == list(DAG_PROCESSOR_FIXES)
        assert decided[CLAIMED_FIX].state is FixState.ACTIVE
        assert dag_processor_command.DagFileProcessorManager is not originals["manager"]
        assert processor._execute_callbacks.__wrapped__ is originals["execute_callbacks"]
        inflation = decided[INFLATION_FIX].state is FixState.ACTIVE
        assert (processor._parse_file is not originals["parse_file"]) is inflation
    finally:
        activation.uninstall(DAG_PROCESSOR)
    assert dag_processor_command.DagFileProcessorManager is originals["manager"]
    assert processor._execute_callbacks is originals["execute_callbacks"]
    assert processor._parse_file is originals["parse_file"]


def test_the_dag_processor_emits_a_gauge_per_fix_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[tuple[str, int]] = []
    from airflow_heartbeat_fix import metrics

    monkeypatch.setattr(metrics.Stats, "gauge", lambda name, value, *a, **k: sent.append((name, value)))
    DagProcessorGaugesMixin.emit_fix_gauges(SimpleNamespace(heartbeat_fixes=(CLAIMED_FIX,)))  # type: ignore[arg-type]
    assert sent == [(gauge_name(fix), int(fix == CLAIMED_FIX)) for fix in DAG_PROCESSOR_FIXES]


# -- the fixed fetch, in-process, on the real table ------------------------------------------------------

BUNDLE = "dags-folder"


@pytest.fixture
def stored() -> Any:
    """Two Dag callback requests stored by Airflow's own sink; the table emptied before and after."""
    from airflow.callbacks.callback_requests import DagCallbackRequest
    from airflow.callbacks.database_callback_sink import DatabaseCallbackSink
    from airflow.models.db_callback_request import DbCallbackRequest
    from airflow.utils.session import create_session
    from sqlalchemy import delete

    def empty() -> None:
        with create_session() as session:
            session.execute(delete(DbCallbackRequest))

    empty()
    for run_id in ("a", "b"):
        DatabaseCallbackSink().send(
            DagCallbackRequest(
                filepath="f.py", bundle_name=BUNDLE, bundle_version=None, dag_id="d", run_id=run_id
            )
        )
    yield
    empty()


def _manager() -> Any:
    from airflow.dag_processing.manager import DagFileProcessorManager

    manager = build_manager_class((CLAIMED_FIX,), base=DagFileProcessorManager)(max_runs=1)
    manager._dag_bundles = [SimpleNamespace(name=BUNDLE, supports_versioning=False, is_initialized=True)]
    return manager


def _rows() -> list[Any]:
    from airflow.models.db_callback_request import DbCallbackRequest
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        return list(session.scalars(select(DbCallbackRequest.id)))


def _set_payload(row_id: Any, change: Any) -> None:
    from airflow.models.db_callback_request import DbCallbackRequest
    from airflow.utils.session import create_session

    from airflow_heartbeat_fix.callback_claims import Payload

    payload = Payload.of(DbCallbackRequest.__table__)
    with create_session() as session:
        row = session.get(DbCallbackRequest, row_id)
        setattr(row, payload.column.key, change(payload, getattr(row, payload.column.key)))


@pytest.mark.db_test
@pytest.mark.usefixtures("stored")
class TestFetch:
    def test_fetch_leaves_requests_stored_and_never_fetches_them_twice(self) -> None:
        manager = _manager()
        assert len(manager._fetch_without_delete()) == 2
        assert len(_rows()) == 2
        assert manager._fetch_without_delete() == []  # queued here: not fetched again

    def test_a_request_past_its_attempts_is_deleted_unrun(self) -> None:
        first, second = _rows()
        _set_payload(first, lambda payload, value: payload.with_attempts(value, 3))
        fetched = _manager()._fetch_without_delete()
        assert len(fetched) == 1
        assert _rows() == [second]

    def test_an_unreadable_request_is_deleted(self) -> None:
        first, second = _rows()

        def unreadable(payload: Any, value: Any) -> Any:
            return "{not json" if payload.holds_string else {**value, "req_class": "NoSuchRequest"}

        _set_payload(first, unreadable)
        assert len(_manager()._fetch_without_delete()) == 1
        assert _rows() == [second]

    def test_a_request_no_file_processor_claims_is_abandoned_after_the_limit(self) -> None:
        manager = _manager()
        delivery = manager._delivery
        for _ in range(delivery.max_attempts):
            fetched = manager._fetch_without_delete()
            assert len(fetched) == 2
            for request in fetched:  # handed out, as _create_process does; the processor exits unclaimed
                row_id, attempts = delivery.fetched.pop(id(request))
                delivery.handed[row_id] = attempts
        assert manager._fetch_without_delete() == []
        assert _rows() == []
