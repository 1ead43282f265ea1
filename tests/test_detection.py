"""Which fixes an installation needs: the pure decision table, and the facts read off this Airflow."""

from __future__ import annotations

import pytest

from airflow_heartbeat_fix import activation
from airflow_heartbeat_fix.detection import (
    ADOPTION_FIX,
    CLAIMED_FIX,
    DAG_PROCESSOR_FIXES,
    EVENT_TYPE_FIX,
    HEARTBEAT_EVENTS_FIX,
    INFLATION_FIX,
    ISOLATED_FIX,
    LOCK_FIX,
    NESTED_FIX,
    PURGE_FIX,
    SCHEDULER_FIXES,
    SINK_FIX,
    UNRECOGNISED_CREATE_SESSION,
    FixState,
    decide,
)
from airflow_heartbeat_fix.facts import (
    AirflowFacts,
    DagProcessorFacts,
    adoption_keeps_orphans_attached,
    callback_payload,
    executor_events_read_heartbeat,
    executor_events_type_callbacks,
    fetch_deletes_requests,
    file_processors_forked,
    inflation_check_blocks_callbacks,
    listeners_before_next_try,
    metastore_expunges,
    nested_session_ends_transaction,
    processor_runs_task_callbacks,
    purge_converges,
    purge_locks_each_ti,
    queue_front,
    requests_isolated,
    sink_commits_caller_session,
)

A, N, D, U = FixState.ACTIVE, FixState.NOT_NEEDED, FixState.DISABLED, FixState.UNSUPPORTED


@pytest.mark.parametrize(
    ("sink_commits", "converges", "locks", "missing", "enabled", "expected"),
    [
        pytest.param(True, False, False, (), True, (A, A, A), id="3.2/3.3 shape"),
        pytest.param(True, True, False, (), True, (A, N, A), id="3.4 beta shape"),
        pytest.param(False, True, False, (), True, (N, N, A), id="sink fixed upstream, lock hole left"),
        pytest.param(False, True, True, (), True, (N, N, N), id="all fixed upstream"),
        pytest.param(True, True, True, (), True, (A, N, N), id="purge locks per task instance upstream"),
        pytest.param(True, False, False, (), False, (D, D, D), id="off switch"),
        pytest.param(False, True, True, (), False, (N, N, N), id="off switch, nothing needed"),
        pytest.param(False, True, False, (), False, (N, N, D), id="off switch, lock needed"),
        pytest.param(None, False, False, (), True, (U, U, U), id="unknown sink: purge and lock need it"),
        pytest.param(None, True, False, (), True, (U, N, U), id="unknown sink under upstream purge"),
        pytest.param(True, None, False, (), True, (A, U, U), id="unknown purge: lock needs a converged one"),
        pytest.param(True, False, None, (), True, (A, A, U), id="unknown lock shape"),
        pytest.param(
            True, False, False, ("_purge_task_instances_without_heartbeats",), True, (A, U, U), id="no purge"
        ),
        pytest.param(
            True, False, False, ("_process_executor_events",), True, (U, U, U), id="no executor events"
        ),
    ],
)
def test_decide(sink_commits, converges, locks, missing, enabled, expected):
    facts = AirflowFacts("9.9.9", sink_commits, converges, missing, purge_locks_each_ti=locks)
    decided = decide(facts, enabled=enabled)
    assert (decided[SINK_FIX].state, decided[PURGE_FIX].state, decided[LOCK_FIX].state) == expected
    for decision in decided.values():
        if decision.state is U:
            assert "9.9.9" in decision.reason or "not active" in decision.reason


def test_unsupported_shape_is_not_patched():
    facts = AirflowFacts("9.9.9", None, None, purge_locks_each_ti=None, nested_session_ends_transaction=None)
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


def test_lock_shapes():
    class Unlocked:
        def _purge_task_instances_without_heartbeats(self, tis, session):
            for ti in tis:
                ti.refresh_from_db(session=session)
                self.executor.send_callback(ti)
                ti.handle_failure(session=session)

    class RefreshLocked:
        def _purge_task_instances_without_heartbeats(self, tis, session):
            for ti in tis:
                ti.refresh_from_db(session=session, lock_for_update=True)
                self.executor.send_callback(ti)

    class RowLocked:
        def _purge_task_instances_without_heartbeats(self, tis, session):
            for ti in tis:
                session.execute(with_row_locks(ti, session=session))  # noqa: F821
                self.executor.send_callback(ti)

    assert purge_locks_each_ti(Unlocked) is False
    assert purge_locks_each_ti(RefreshLocked) is True
    assert purge_locks_each_ti(RowLocked) is True
    assert purge_locks_each_ti(object) is None


@pytest.mark.parametrize(
    ("typed", "missing", "enabled", "expected"),
    [
        pytest.param(False, (), True, A, id="3.0.4-3.1.0 shape"),
        pytest.param(True, (), True, N, id="typed upstream (3.1.1+)"),
        pytest.param(False, (), False, D, id="off switch"),
        pytest.param(True, (), False, N, id="off switch, nothing needed"),
        pytest.param(None, (), True, U, id="unknown shape"),
        pytest.param(False, ("process_executor_events",), True, U, id="no executor events"),
    ],
)
def test_decide_executor_event_typing(typed, missing, enabled, expected):
    facts = AirflowFacts("9.9.9", True, False, missing, executor_events_type_callbacks=typed)
    assert decide(facts, enabled=enabled)[EVENT_TYPE_FIX].state is expected


def test_executor_event_shapes():
    class Untyped:
        @classmethod
        def process_executor_events(cls, executor, session):
            executor.send_callback(TaskCallbackRequest(ti=None, msg=""))  # noqa: F821

    class Typed:
        @classmethod
        def process_executor_events(cls, executor, session):
            executor.send_callback(TaskCallbackRequest(ti=None, task_callback_type="failed"))  # noqa: F821

    assert executor_events_type_callbacks(Untyped) is False
    assert executor_events_type_callbacks(Typed) is True
    assert executor_events_type_callbacks(object) is None


def test_dag_processor_without_task_callbacks_is_said_in_the_purge_reason():
    def raises(dagbag, requests, log):
        for _request in requests:
            raise NotImplementedError("Haven't coded Task callback yet")

    def runs(dagbag, requests, log):
        for request in requests:
            _execute_task_callbacks(dagbag, request, log)  # noqa: F821

    assert processor_runs_task_callbacks(raises) is False
    assert processor_runs_task_callbacks(runs) is True
    assert processor_runs_task_callbacks(None) is True  # not found: nothing is claimed
    facts = AirflowFacts("3.0.3", True, False, processor_runs_task_callbacks=False)
    purge = decide(facts, enabled=True)[PURGE_FIX]
    assert purge.state is A
    assert "callbacks never run: upgrade to 3.0.4+" in purge.reason
    assert "never run" not in decide(AirflowFacts("3.0.4", True, False), enabled=True)[PURGE_FIX].reason


def test_facts_of_this_airflow_are_recognised():
    """Every supported version has the shape detection reads, and each fact is what
    ``parity/expectations.toml`` declares of this release (its [bugs] and their versions)."""
    from parity.expectations import load

    facts = activation.facts()
    has = {name for name, bug in load().bugs.items() if facts.version in bug.versions}
    assert facts.missing_hooks == ()
    assert facts.sink_commits_caller_session is ("sink_commits_scheduler_session" in has)
    assert facts.purge_converges is ("unconverged_purge" not in has)
    assert facts.purge_locks_each_ti is ("purge_revalidates_unlocked" not in has)
    assert facts.executor_events_type_callbacks is ("untyped_executor_event_callbacks" not in has)
    assert facts.adoption_keeps_orphans_attached is ("adoption_session_ended_by_executor" not in has)
    assert facts.nested_session_ends_transaction is ("nested_session_ends_loop_transaction" in has)
    assert facts.listeners_before_next_try is ("nested_session_crash_on_retry" in has)
    assert facts.executor_events_read_heartbeat is ("stale_executor_event_fails_live_try" not in has)
    # #63080 removed the metastore's expunge_all() in 3.2.0.
    assert facts.metastore_expunges is facts.version.startswith(("3.0.", "3.1."))
    assert facts.create_session_recognised is True
    processor = facts.dag_processor
    assert processor is not None and processor.missing_hooks == ()
    assert processor.fetch_deletes_requests is ("callbacks_deleted_at_fetch" in has)
    assert processor.callback_payload == (
        "callback_data" if facts.version.startswith(("3.0.", "3.1.")) else "data"
    )
    assert processor.file_processors_forked is True  # Linux
    assert processor.requests_isolated is ("bad_request_drops_batch" not in has)
    assert processor.inflation_check_blocks_callbacks is ("inflation_check_drops_callbacks" in has)
    # 3.1.8 replaced _add_files_to_queue's add_at_front flag with mode.
    old_queue = facts.version.startswith("3.0.") or facts.version in [f"3.1.{n}" for n in range(8)]
    assert processor.queue_front == (("add_at_front", True) if old_queue else ("mode", "front"))


@pytest.mark.parametrize("enabled", [True, False])
def test_decide_without_a_callback_sink_is_not_applicable(enabled: bool) -> None:
    """An Airflow whose task callbacks no longer go through DatabaseCallbackSink: nothing to patch."""
    decided = decide(AirflowFacts("4.0.0", None, None, has_callback_sink=False), enabled=enabled)
    assert list(decided) == list(SCHEDULER_FIXES)  # the Dag processor's facts were not read
    assert {d.state for d in decided.values()} == {FixState.NOT_APPLICABLE}
    assert all("has no DatabaseCallbackSink" in d.reason for d in decided.values())


@pytest.mark.parametrize(
    ("attached", "missing", "enabled", "expected"),
    [
        pytest.param(False, (), True, A, id="every release to 3.4.0b2"),
        pytest.param(True, (), True, N, id="re-reads the orphans upstream"),
        pytest.param(False, (), False, D, id="off switch"),
        pytest.param(None, (), True, U, id="unknown shape"),
        pytest.param(False, ("adopt_or_reset_orphaned_tasks",), True, U, id="no adoption"),
    ],
)
def test_decide_orphan_adoption(attached, missing, enabled, expected):
    facts = AirflowFacts("9.9.9", True, False, missing, adoption_keeps_orphans_attached=attached)
    assert decide(facts, enabled=enabled)[ADOPTION_FIX].state is expected


def test_adoption_shapes():
    class Stock:
        def adopt_or_reset_orphaned_tasks(self, session):
            tis = session.scalars(query).all()  # noqa: F821
            for ti in executor.try_adopt_task_instances(tis):  # noqa: F821
                ti.prepare_db_for_next_try(session=session)
            session.flush()

    class Reselects:
        def adopt_or_reset_orphaned_tasks(self, session):
            tis = session.scalars(query).all()  # noqa: F821
            to_reset = executor.try_adopt_task_instances(tis)  # noqa: F821
            for ti in session.scalars(select_by_id(to_reset)):  # noqa: F821
                ti.prepare_db_for_next_try(session=session)

    assert adoption_keeps_orphans_attached(Stock) is False
    assert adoption_keeps_orphans_attached(Reselects) is True
    assert adoption_keeps_orphans_attached(object) is None


@pytest.mark.parametrize(
    ("ends", "missing", "recognised", "enabled", "expected"),
    [
        pytest.param(True, (), True, True, (A, A), id="every release to 3.4.0b2"),
        pytest.param(False, (), True, True, (N, A), id="create_session joins an enclosing one upstream"),
        pytest.param(True, (), True, False, (D, D), id="off switch"),
        pytest.param(None, (), True, True, (U, U), id="unknown create_session: adoption needs the hold"),
        pytest.param(True, ("_do_scheduling",), True, True, (U, U), id="a loop path is missing"),
        pytest.param(True, (), False, True, (U, U), id="create_session replaced without calling Airflow's"),
    ],
)
def test_decide_nested_sessions(ends, missing, recognised, enabled, expected):
    """The orphan adoption's executor sessions are nested sessions: it needs the hold, or upstream's."""
    facts = AirflowFacts(
        "9.9.9",
        True,
        False,
        missing,
        adoption_keeps_orphans_attached=False,
        nested_session_ends_transaction=ends,
        create_session_recognised=recognised,
    )
    decided = decide(facts, enabled=enabled)
    assert (decided[NESTED_FIX].state, decided[ADOPTION_FIX].state) == expected
    if not recognised:
        assert decided[NESTED_FIX].reason == UNRECOGNISED_CREATE_SESSION


@pytest.mark.parametrize(
    ("facts", "said", "not_said"),
    [
        pytest.param({"metastore_expunges": True}, ["expunge_all() it"], ["UniqueViolation"], id="3.0/3.1"),
        pytest.param({}, [], ["expunge_all", "UniqueViolation"], id="3.2/3.3"),
        pytest.param({"listeners_before_next_try": True}, ["UniqueViolation"], ["expunge"], id="3.4"),
    ],
)
def test_nested_sessions_reason_says_what_bites_here(facts, said, not_said):
    reason = decide(AirflowFacts("9.9.9", True, False, **facts), enabled=True)[NESTED_FIX].reason
    assert "inside prohibit_commit its commit raises" in reason
    assert all(part in reason for part in said)
    assert not any(part in reason for part in not_said)


def test_nested_session_shapes():
    import contextlib

    @contextlib.contextmanager
    def stock():
        session = settings.Session()  # noqa: F821
        try:
            yield session
            session.commit()
        except Exception:
            session.rollback()
            raise
        finally:
            session.close()

    @contextlib.contextmanager
    def joins():
        session = settings.Session()  # noqa: F821
        with session.begin_nested():
            yield session

    @contextlib.contextmanager
    def unknown():
        yield None

    assert nested_session_ends_transaction(stock.__wrapped__) is True
    assert nested_session_ends_transaction(joins.__wrapped__) is False
    assert nested_session_ends_transaction(unknown.__wrapped__) is None
    assert nested_session_ends_transaction(None) is None
    assert nested_session_ends_transaction(object) is None


def test_metastore_and_listener_shapes():
    class Metastore31:
        def get_variable(self, key, session):
            session.expunge_all()

    class TaskInstance34:
        def fetch_handle_failure_context(self, ti):
            ti.notify_failure()
            ti.prepare_db_for_next_try()

    class TaskInstance33:
        def fetch_handle_failure_context(self, ti):
            ti.prepare_db_for_next_try()
            get_listener_manager().hook.on_task_instance_failed()  # noqa: F821

    assert (
        metastore_expunges(Metastore31),
        metastore_expunges(TaskInstance33),
        metastore_expunges(None),
    ) == (
        True,
        False,
        False,
    )
    assert listeners_before_next_try(TaskInstance34) is True
    assert listeners_before_next_try(TaskInstance33) is False
    assert listeners_before_next_try(None) is False


def _processor(**facts: object) -> AirflowFacts:
    """A scheduler with nothing to fix, and a Dag processor shaped as ``facts`` say (3.3.1's by default)."""
    shape: dict[str, object] = {
        "fetch_deletes_requests": True,
        "callback_payload": "data",
        "requests_isolated": False,
        "inflation_check_blocks_callbacks": True,
        **facts,
    }
    return AirflowFacts("9.9.9", False, True, dag_processor=DagProcessorFacts(**shape))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("facts", "enabled", "expected"),
    [
        pytest.param({}, True, (A, A, A), id="3.2.0-3.3.1 shape"),
        pytest.param(
            {"requests_isolated": True, "inflation_check_blocks_callbacks": False},
            True,
            (A, N, N),
            id="3.3.2+",
        ),
        pytest.param({"inflation_check_blocks_callbacks": False}, True, (A, A, N), id="3.0/3.1"),
        pytest.param({}, False, (D, D, D), id="off switch"),
        pytest.param({"fetch_deletes_requests": False}, True, (N, A, A), id="fetch keeps requests upstream"),
        pytest.param({"fetch_deletes_requests": None}, True, (U, A, A), id="fetch not recognised"),
        pytest.param({"callback_payload": None}, True, (U, A, A), id="payload column not recognised"),
        pytest.param({"file_processors_forked": False}, True, (U, A, A), id="spawned file processors"),
        pytest.param({"missing_hooks": ("_create_process",)}, True, (U, U, U), id="no _create_process"),
        pytest.param({"requests_isolated": None}, True, (A, U, A), id="execute_callbacks not recognised"),
        pytest.param({"queue_front": None}, True, (U, A, A), id="file queue not recognised"),
    ],
)
def test_decide_dag_processor(
    facts: dict[str, object], enabled: bool, expected: tuple[FixState, ...]
) -> None:
    decided = decide(_processor(**facts), enabled=enabled)
    assert tuple(decided[fix].state for fix in DAG_PROCESSOR_FIXES) == expected
    assert list(decided)[-3:] == list(DAG_PROCESSOR_FIXES)


def test_dag_processor_reasons_name_the_upstream_changes():
    decided = decide(_processor(requests_isolated=True, file_processors_forked=False), enabled=True)
    assert "apache/airflow#70990" in decided[ISOLATED_FIX].reason
    assert "apache/airflow#70987" in decided[INFLATION_FIX].reason
    assert "fresh interpreters" in decided[CLAIMED_FIX].reason
    missing = decide(_processor(missing_hooks=("_create_process",)), enabled=True)[CLAIMED_FIX].reason
    assert "DagFileProcessorManager has no _create_process" in missing
    queue = decide(_processor(queue_front=None), enabled=True)[CLAIMED_FIX].reason
    assert "takes neither mode nor add_at_front" in queue


def test_dag_processor_fact_readers():
    def deleting(self, session):
        for row in session.scalars(query):  # noqa: F821
            requests.append(row.get_callback_request())  # noqa: F821
            session.delete(row)

    def keeping(self, session):
        return [row.get_callback_request() for row in session.scalars(query)]  # noqa: F821

    assert fetch_deletes_requests(deleting) is True
    assert fetch_deletes_requests(keeping) is False
    assert fetch_deletes_requests(len) is None
    assert callback_payload(("id", "callback_data")) == "callback_data"
    assert callback_payload(("id", "data", "state")) == "data"
    assert callback_payload(("id",)) is None

    def forking(cls, **kwargs):
        return super().start(**kwargs)

    def maybe_spawning(cls, **kwargs):
        use_exec = supervisor._should_use_exec()  # noqa: F821
        return use_exec

    assert file_processors_forked(forking, should_use_exec=lambda: True) is True
    assert file_processors_forked(maybe_spawning, should_use_exec=lambda: False) is True
    assert file_processors_forked(maybe_spawning, should_use_exec=lambda: True) is False

    def isolated(dagbag, requests, log):
        for request in requests:
            try:
                _execute_task_callbacks(dagbag, request, log)  # noqa: F821
            except Exception:
                log.exception("Failed to execute callback request")

    def not_isolated(dagbag, requests, log):
        for request in requests:
            _execute_task_callbacks(dagbag, request, log)  # noqa: F821

    assert requests_isolated(isolated) is True
    assert requests_isolated(not_isolated) is False
    assert requests_isolated(len) is None

    def refusing_first(msg, log):
        result = check_dag_file_stability(msg.file)  # noqa: F821
        if errors := result.get_error_format_dict(msg.file, msg.bundle_path):
            return errors
        if msg.callback_requests:
            return None

    def callbacks_first(msg, log):
        result = check_dag_file_stability(msg.file)  # noqa: F821
        if not msg.callback_requests and (errors := result.get_error_format_dict(msg.file, msg.bundle_path)):
            return errors
        return None

    def no_check(msg, log):
        if msg.callback_requests:
            return None

    assert inflation_check_blocks_callbacks(refusing_first) is True
    assert inflation_check_blocks_callbacks(callbacks_first) is False
    assert inflation_check_blocks_callbacks(no_check) is False
    assert inflation_check_blocks_callbacks(len) is None


@pytest.mark.parametrize(
    ("reads_heartbeat", "missing", "enabled", "expected"),
    [
        pytest.param(False, (), True, A, id="every release to 3.4.0b2"),
        pytest.param(True, (), True, N, id="reads the heartbeat upstream (apache/airflow#69336)"),
        pytest.param(False, (), False, D, id="off switch"),
        pytest.param(True, (), False, N, id="off switch, nothing needed"),
        pytest.param(None, (), True, U, id="unknown shape"),
        pytest.param(False, ("_process_executor_events",), True, U, id="no executor events"),
    ],
)
def test_decide_heartbeat_judged_executor_events(reads_heartbeat, missing, enabled, expected):
    facts = AirflowFacts("9.9.9", True, False, missing, executor_events_read_heartbeat=reads_heartbeat)
    decision = decide(facts, enabled=enabled)[HEARTBEAT_EVENTS_FIX]
    assert decision.state is expected
    if expected is A:
        assert "without reading its heartbeat" in decision.reason


def test_executor_event_heartbeat_shapes():
    class Stock:
        @classmethod
        def process_executor_events(cls, executor, job_id, session):
            for ti in tis:  # noqa: F821
                if ti.state == TaskInstanceState.RUNNING:  # noqa: F821
                    ti.handle_failure(error="killed externally", session=session)

    class ReadsHeartbeat:
        @classmethod
        def process_executor_events(cls, executor, job_id, session):
            for ti in tis:  # noqa: F821
                if ti.last_heartbeat_at < cutoff:  # noqa: F821
                    ti.handle_failure(error="killed externally", session=session)

    class Unknown:
        @classmethod
        def process_executor_events(cls, executor, job_id, session):
            return 0

    assert executor_events_read_heartbeat(Stock) is False
    assert executor_events_read_heartbeat(ReadsHeartbeat) is True
    assert executor_events_read_heartbeat(Unknown) is None
    assert executor_events_read_heartbeat(object) is None


def test_queue_front_is_read_off_the_queue_signature() -> None:
    class Current:
        def _add_files_to_queue(self, files: list[object], *, mode: str) -> None: ...

    class Legacy:
        def _add_files_to_queue(self, files: list[object], add_at_front: bool) -> None: ...

    class Unknown:
        def _add_files_to_queue(self, files: list[object], where: str) -> None: ...

    assert queue_front(Current) == ("mode", "front")
    assert queue_front(Legacy) == ("add_at_front", True)
    assert queue_front(Unknown) is None
    assert queue_front(object) is None
