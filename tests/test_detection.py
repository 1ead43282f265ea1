"""Which fixes an installation needs: the pure decision table, and the facts read off this Airflow."""

from __future__ import annotations

import pytest

from airflow_heartbeat_fix import activation
from airflow_heartbeat_fix.detection import (
    PURGE_FIX,
    SINK_FIX,
    AirflowFacts,
    FixState,
    decide,
    purge_converges,
    sink_commits_caller_session,
)

A, N, D, U = FixState.ACTIVE, FixState.NOT_NEEDED, FixState.DISABLED, FixState.UNSUPPORTED


@pytest.mark.parametrize(
    ("sink_commits", "converges", "missing", "enabled", "expected"),
    [
        pytest.param(True, False, (), True, (A, A), id="3.2/3.3 shape"),
        pytest.param(True, True, (), True, (A, N), id="3.4 beta shape"),
        pytest.param(False, True, (), True, (N, N), id="both fixed upstream"),
        pytest.param(True, False, (), False, (D, D), id="off switch"),
        pytest.param(False, True, (), False, (N, N), id="off switch, nothing needed"),
        pytest.param(None, False, (), True, (U, U), id="unknown sink: purge needs it"),
        pytest.param(True, None, (), True, (A, U), id="unknown purge"),
        pytest.param(True, False, ("_purge_task_instances_without_heartbeats",), True, (A, U), id="no purge"),
        pytest.param(True, False, ("_process_executor_events",), True, (U, U), id="no executor events"),
    ],
)
def test_decide(sink_commits, converges, missing, enabled, expected):
    facts = AirflowFacts("9.9.9", sink_commits, converges, missing)
    decided = decide(facts, enabled=enabled)
    assert (decided[SINK_FIX].state, decided[PURGE_FIX].state) == expected
    for decision in decided.values():
        if decision.state is U:
            assert "9.9.9" in decision.reason or "sink" in decision.reason


def test_unsupported_shape_is_not_patched():
    facts = AirflowFacts("9.9.9", None, None)
    assert not [d for d in decide(facts, enabled=True).values() if d.state is A]


def test_sink_shapes():
    from airflow.utils.session import NEW_SESSION, provide_session

    class Stock:
        @provide_session
        def send(self, callback, session=NEW_SESSION): ...

    class Fixed:
        def send(self, callback, *, session=None): ...

    class Unknown:
        def send(self, callback): ...

    assert sink_commits_caller_session(Stock) is True
    assert sink_commits_caller_session(Fixed) is False
    assert sink_commits_caller_session(Unknown) is None
    assert sink_commits_caller_session(object) is None


def test_purge_shapes():
    class Converged:
        def _find_task_instances_without_heartbeats(self, session):
            return with_row_locks(session)  # noqa: F821

        def _purge_task_instances_without_heartbeats(self, tis, session):
            self.executor.send_callback(tis)
            tis.handle_failure()

    class Unconverged(Converged):
        def _purge_task_instances_without_heartbeats(self, tis, session):
            self.executor.send_callback(tis)

    assert purge_converges(Converged) is True
    assert purge_converges(Unconverged) is False
    assert purge_converges(object) is None


def test_facts_of_this_airflow_are_recognised():
    """Every supported version has the shape detection reads; which bugs it has is checked at collection
    (tests/conftest.py compares detection with parity/expectations.toml)."""
    facts = activation.facts()
    assert facts.missing_hooks == ()
    assert facts.sink_commits_caller_session is not None
    assert facts.purge_converges is not None
