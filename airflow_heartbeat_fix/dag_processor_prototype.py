"""
PROTOTYPE (issue 33, phase 1; not wired into the ``airflow.policy`` activation): callback requests that
leave the metadata database only after their callback has run.

``python -m airflow_heartbeat_fix.dag_processor_prototype dag-processor ARGS`` runs ``airflow dag-processor``
with it installed. The manager fetches requests without deleting them (skipping the ones a live process
holds and the ones it has queued or handed out itself); the file processor it forks claims each request in
turn (:mod:`airflow_heartbeat_fix.callback_claims`), runs it through Airflow's own ``_execute_callbacks``
one request at a time (so one failing request never stops the next: apache/airflow#70990 for 3.0.0 to
3.3.1), and deletes it once it has run. Which row each request is reaches the file processor through the
fork: the manager names the rows of the batch in a module variable right before it forks.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from airflow_heartbeat_fix.callback_claims import Claims

log = logging.getLogger("airflow_heartbeat_fix")

#: What the manager logs after each fetch that found requests (the tests kill it the moment it appears).
FETCHED = "heartbeat-fix: fetched"

#: Set in the manager right before it forks a file processor (the forked child reads it), else None.
_batch_rows: list[Any] | None = None
_manager_pid: int | None = None
_url: str | None = None
_original_execute_callbacks: Any = None
_original_parse_file: Any = None


def _claimed_execute_callbacks(dagbag: Any, callback_requests: list[Any], logger: Any) -> None:
    """The file processor's side: claim, run one request, delete; the next."""
    rows = _batch_rows
    if rows is None or _url is None or len(rows) != len(callback_requests):
        _original_execute_callbacks(dagbag, callback_requests, logger)
        return
    from airflow.models.db_callback_request import DbCallbackRequest

    claims = Claims(_url, DbCallbackRequest.__table__)
    try:
        for request, row_id in zip(callback_requests, rows, strict=True):
            if os.getppid() != _manager_pid:
                logger.warning("heartbeat-fix: the Dag processor is gone; its requests are left to the next")
                return
            claimed = claims.claim(row_id)
            if claimed is None:
                logger.info("heartbeat-fix: callback request %s is run by another Dag processor", row_id)
                continue
            if claimed.attempt > 1:
                logger.warning(
                    "heartbeat-fix: callback request %s runs again (attempt %d): the file processor "
                    "running it before died",
                    row_id,
                    claimed.attempt,
                )
            try:
                _original_execute_callbacks(dagbag, [request], logger)
            except Exception:
                if os.getppid() != _manager_pid:
                    claims.release(claimed)
                    raise
                logger.exception("heartbeat-fix: failed to execute callback request %s", row_id)
            claims.done(claimed)
    finally:
        claims.close()


def _parse_file_running_callbacks(msg: Any, logger: Any) -> Any:
    """
    A message with callback requests is not refused by the Dag version inflation check (3.2.0 to 3.3.1
    return before running them, apache/airflow#70987): the check answers at ``warning`` level for it.
    """
    from airflow.dag_processing import processor

    check = getattr(processor, "check_dag_file_stability", None)
    if not msg.callback_requests or check is None:
        return _original_parse_file(msg, logger)

    def not_refusing(path: Any) -> Any:
        result = check(path)
        if result.get_error_format_dict(msg.file, msg.bundle_path):
            logger.warning(
                "heartbeat-fix: the Dag version inflation check refuses %s; its %d callback request(s) "
                "run all the same",
                msg.file,
                len(msg.callback_requests),
            )
            result.check_level = type(result.check_level).warning
        return result

    processor.check_dag_file_stability = not_refusing
    try:
        return _original_parse_file(msg, logger)
    finally:
        processor.check_dag_file_stability = check


def _manager_class() -> type:
    from airflow.dag_processing.manager import DagFileProcessorManager
    from airflow.models.db_callback_request import DbCallbackRequest
    from airflow.utils.session import create_session
    from airflow.utils.sqlalchemy import with_row_locks
    from sqlalchemy import delete, select

    class ClaimingDagFileProcessorManager(DagFileProcessorManager):  # type: ignore[misc,valid-type]
        """Fetches without deleting; names each forked file processor's rows; deletes what stock drops."""

        def _claim_state(self) -> dict[str, Any]:
            state = self.__dict__.get("_hbfix_claims")
            if state is None:
                state = self.__dict__["_hbfix_claims"] = {"row_of": {}, "in_flight": {}}
            return state

        def run(self) -> Any:
            global _manager_pid
            _manager_pid = os.getpid()
            return super().run()

        def _known_rows(self) -> set[Any]:
            state = self._claim_state()
            alive = {id(proc) for proc in self._processors.values()}
            state["in_flight"] = {key: ids for key, ids in state["in_flight"].items() if key in alive}
            known = {row for ids in state["in_flight"].values() for row in ids}
            known.update(row for _, row in state["row_of"].values())
            return known

        def _fetch_without_delete(self) -> list[Any]:
            state = self._claim_state()
            names = [bundle.name for bundle in self._dag_bundles]
            known = self._known_rows()
            query = select(DbCallbackRequest)
            if "bundle_name" in DbCallbackRequest.__table__.c:
                query = query.where(DbCallbackRequest.bundle_name.in_(names))
            if known:
                query = query.where(DbCallbackRequest.id.not_in(known))
            query = query.order_by(DbCallbackRequest.priority_weight.desc()).limit(
                self.max_callbacks_per_loop
            )
            fetched = []
            with create_session() as session:
                locked = with_row_locks(query, of=DbCallbackRequest, session=session, skip_locked=True)
                for row in session.scalars(locked).all():
                    request = row.get_callback_request()
                    if request.bundle_name not in names:
                        continue
                    state["row_of"][id(request)] = (request, row.id)
                    fetched.append(request)
            if fetched:
                self.log.info(
                    "%s %d callback request(s), left stored until they have run", FETCHED, len(fetched)
                )
            return fetched

        # 3.3+ names the fetch fetch_callbacks (its documented override point); 3.0-3.2 _fetch_callbacks.
        def fetch_callbacks(self) -> list[Any]:
            return self._fetch_without_delete()

        def _fetch_callbacks(self, *args: Any, **kwargs: Any) -> list[Any]:
            return self._fetch_without_delete()

        def _add_callback_to_queue(self, request: Any) -> None:
            super()._add_callback_to_queue(request)
            queued = any(r is request for rs in self._callback_to_execute.values() for r in rs)
            if not queued:  # stock skipped it (its bundle is gone) after deleting it at its fetch
                _, row_id = self._claim_state()["row_of"].pop(id(request))
                with create_session() as session:
                    session.execute(delete(DbCallbackRequest).where(DbCallbackRequest.id == row_id))

        def _create_process(self, dag_file: Any) -> Any:
            global _batch_rows
            state = self._claim_state()
            requests = list(self._callback_to_execute.get(dag_file, []))
            rows = [state["row_of"][id(request)][1] for request in requests]
            _batch_rows = rows
            try:
                proc = super()._create_process(dag_file)
            finally:
                _batch_rows = None
            for request in requests:
                state["row_of"].pop(id(request), None)
            state["in_flight"][id(proc)] = rows
            return proc

    return ClaimingDagFileProcessorManager


def install() -> None:
    global _url, _original_execute_callbacks, _original_parse_file
    from airflow import settings
    from airflow.cli.commands import dag_processor_command
    from airflow.dag_processing import processor

    if settings.engine is None:
        raise RuntimeError("Airflow's metadata database is not configured in this process")
    _url = settings.engine.url.render_as_string(hide_password=False)
    _original_execute_callbacks = processor._execute_callbacks
    processor._execute_callbacks = _claimed_execute_callbacks
    _original_parse_file = processor._parse_file
    processor._parse_file = _parse_file_running_callbacks
    dag_processor_command.DagFileProcessorManager = _manager_class()


if __name__ == "__main__":
    install()
    from airflow.__main__ import main

    sys.argv = ["airflow", *sys.argv[1:]]
    main()
