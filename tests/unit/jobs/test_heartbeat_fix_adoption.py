"""
Orphan adoption when a scheduler has died: ``SchedulerJobRunner.adopt_or_reset_orphaned_tasks``.

Shaped like upstream's ``test_adopt_or_reset_orphaned_tasks*`` (``TestSchedulerJob``): task instances
queued by a scheduler job that stopped heartbeating, in a running Dag run, and a real runner calling
the real method, as the scheduler loop does (without a session: ``@provide_session`` hands it the
thread's scoped session and commits it). What varies is the executor's ``try_adopt_task_instances``:

* ``LocalExecutor``: adopts nothing, opens no session (stock Airflow resets every orphan correctly);
* :class:`ScopedSessionExecutor`: adopts the tasks whose id starts with ``adopt`` and, like
  cncf-kubernetes up to 10.17.x (``_alive_other_scheduler_job_ids``), reads the live scheduler jobs in
  a scoped ``create_session()``, which commits and closes the scheduler's session in stock Airflow;
* the real ``KubernetesExecutor`` of cncf-kubernetes 10.17.x with only the Kubernetes API replaced
  (:class:`FakeCluster`); run where the provider is installed (``nox -s tests_kubernetes``).

End to end, a real ``airflow scheduler`` with that executor is started over the orphans, its Kubernetes
API server replaced by :class:`FakeKubernetesApi` (HTTP on loopback, reached through a kubeconfig).

Stock Airflow crashes with ``DetachedInstanceError`` (turned into an ``AssertionError`` naming it, so
the stock cells' strict xfails see an assertion), releases the orphans' row locks before it has written
anything (PostgreSQL), and lets a second scheduler adopt or reset the same task instances.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlsplit

import pytest
from airflow import settings
from airflow.executors.local_executor import LocalExecutor
from airflow.jobs.job import Job, JobState
from airflow.models.dag import DagModel
from airflow.models.taskinstance import TaskInstance
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.utils.session import create_session
from airflow.utils.state import DagRunState, TaskInstanceState
from sqlalchemy import select, text, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm.exc import DetachedInstanceError
from tests_common.test_utils.db import clear_db_dags, clear_db_jobs, clear_db_logs, clear_db_runs

from testing import killed_scheduler as harness
from tests.unit.jobs.test_scheduler_job import _archives_tries, _scheduler_runner

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence
    from pathlib import Path

    from sqlalchemy.orm import Session
    from tests_common.pytest_plugin import DagMaker

    from airflow_heartbeat_fix.demo.processes import Component

pytestmark = pytest.mark.db_test

try:
    from airflow.providers.cncf.kubernetes.executors import kubernetes_executor
except ImportError:
    kubernetes_executor = None

#: Orphans per test: two the executor adopts (their workers are alive), three it hands back to reset.
ADOPTED, RESET = ("adopt_0", "adopt_1"), ("reset_0", "reset_1", "reset_2")


def _clean_db() -> None:
    clear_db_runs()
    clear_db_jobs()
    clear_db_dags()
    clear_db_logs()


class ScopedSessionExecutor(LocalExecutor):
    """
    Adopts the task instances whose task id starts with ``adopt``, after looking up the live scheduler
    jobs in a scoped ``create_session()``: what cncf-kubernetes <= 10.17 does during adoption.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.handed: list[tuple[str, str]] = []
        self.after_session: Any = None

    def try_adopt_task_instances(self, tis: Sequence[TaskInstance]) -> Sequence[TaskInstance]:
        # Read what it needs first (loaded columns), as the KubernetesExecutor reads ti.key first.
        keys = [(ti.run_id, ti.task_id) for ti in tis]
        self.handed.extend(keys)
        with create_session() as session:
            session.scalars(select(Job.id).where(Job.state == JobState.RUNNING)).all()
        if self.after_session is not None:
            self.after_session(tis)
        return [ti for ti, (_, task_id) in zip(tis, keys, strict=True) if not task_id.startswith("adopt")]


class FakeCluster:
    """
    The Kubernetes API as the KubernetesExecutor's adoption sees it: pods with labels and annotations,
    listed through ``DynamicClient`` and relabelled through ``CoreV1Api.patch_namespaced_pod``.
    """

    def __init__(self) -> None:
        self.pods: list[Any] = []
        self.patched: list[tuple[str, dict[str, Any]]] = []
        self.api_client = object()

    def add_worker_pod(self, ti: TaskInstance, scheduler_job_id: int, *, phase: str = "Running") -> None:
        from types import SimpleNamespace

        metadata = SimpleNamespace(
            name=f"pod-{ti.task_id}",
            namespace="default",
            resource_version="1",
            labels={
                "kubernetes_executor": "True",
                "airflow-worker": str(scheduler_job_id),
                "airflow_executor_done": "False",
            },
            annotations={
                "dag_id": ti.dag_id,
                "task_id": ti.task_id,
                "run_id": ti.run_id,
                "try_number": str(ti.try_number),
                "map_index": str(ti.map_index),
            },
        )
        self.pods.append(SimpleNamespace(metadata=metadata, phase=phase))

    # -- kubernetes.client.CoreV1Api ---------------------------------------------------------------
    def patch_namespaced_pod(self, name: str, namespace: str, body: dict[str, Any]) -> None:
        self.patched.append((name, body))
        for pod in self.pods:
            if pod.metadata.name == name:
                pod.metadata.labels.update(body["metadata"]["labels"])

    # -- kubernetes.dynamic.DynamicClient ------------------------------------------------------------
    def dynamic_client(self, api_client: Any) -> Any:
        from types import SimpleNamespace

        cluster = self

        class Resources:
            def get(self, **kwargs: Any) -> str:
                return "v1/Pod"

        class Dynamic:
            resources = Resources()

            def get(self, resource: Any, namespace: Any, **query: Any) -> Any:
                return SimpleNamespace(items=[pod for pod in cluster.pods if _selected(pod, query)])

        return Dynamic()


def _selected(pod: Any, query: dict[str, Any]) -> bool:
    """The field and label selectors the KubernetesExecutor sends (``=``, ``!=``, ``notin (..)``)."""
    field = query.get("field_selector", "")
    if field.startswith("status.phase!=") and pod.phase == field.split("!=", 1)[1]:
        return False
    if field.startswith("status.phase=") and "!=" not in field and pod.phase != field.split("=", 1)[1]:
        return False
    labels = pod.metadata.labels
    selector = query.get("label_selector", "")
    parts, depth, current = [], 0, ""
    for char in selector:  # split on commas outside parentheses
        depth += char == "("
        depth -= char == ")"
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    for part in filter(None, (p.strip() for p in parts)):
        if " notin " in part:
            key, values = part.split(" notin ", 1)
            if labels.get(key) in values.strip("()").split(","):
                return False
        elif "!=" in part:
            key, value = part.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in part:
            key, value = part.split("=", 1)
            if labels.get(key) != value:
                return False
    return True


@contextlib.contextmanager
def _kubernetes_executor(cluster: FakeCluster, job_id: int) -> Iterator[Any]:
    """The provider's real KubernetesExecutor, as ``start()`` leaves it, on ``cluster``'s API."""
    from unittest import mock

    assert kubernetes_executor is not None

    executor = kubernetes_executor.KubernetesExecutor()
    executor.scheduler_job_id = str(job_id)
    executor.kube_client = cluster
    try:
        with mock.patch.object(kubernetes_executor, "DynamicClient", cluster.dynamic_client):
            yield executor
    finally:
        executor._manager.shutdown()


#: How long the fake API server keeps a watch open, sending no event; the watcher then watches again.
WATCH_HOLD_SECONDS = 20.0
#: The discovery documents ``kubernetes.dynamic.DynamicClient`` reads before it can list pods.
DISCOVERY: dict[str, dict[str, Any]] = {
    "/version": {"major": "1", "minor": "31", "gitVersion": "v1.31.0"},
    "/apis": {"kind": "APIGroupList", "apiVersion": "v1", "groups": []},
    "/api/v1": {
        "kind": "APIResourceList",
        "groupVersion": "v1",
        "resources": [
            {
                "name": "pods",
                "singularName": "pod",
                "namespaced": True,
                "kind": "Pod",
                "verbs": ["create", "delete", "get", "list", "patch", "watch"],
            }
        ],
    },
}
_POD_PATH = re.compile(r"^/api/v1/(?:namespaces/(?P<namespace>[^/]+)/)?pods(?:/(?P<name>[^/]+))?$")
#: :meth:`FakeKubernetesApi.answer`'s document for a watch: the handler holds the response open instead.
WATCH = object()


def _pod_document(pod: Any) -> dict[str, Any]:
    """A :class:`FakeCluster` pod as the API server serialises it (an item of a pod list)."""
    meta = pod.metadata
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": meta.name,
            "namespace": meta.namespace,
            "resourceVersion": meta.resource_version,
            "labels": dict(meta.labels),
            "annotations": dict(meta.annotations),
        },
        "status": {"phase": pod.phase},
    }


class FakeKubernetesApi:
    """
    The Kubernetes API server for the real ``kubernetes`` client of a real scheduler process: HTTP on
    127.0.0.1, serving :class:`FakeCluster`'s pods. It answers what the KubernetesExecutor and
    ``DynamicClient`` ask: discovery, pod lists by field and label selector, pod patches, creations and
    deletions, and watches, which stay open without events. Anything else gets a 404 and is kept in
    :attr:`unanswered`.
    """

    def __init__(self, cluster: FakeCluster) -> None:
        self.cluster = cluster
        self.calls: Counter[str] = Counter()
        self.unanswered: list[str] = []
        self.created: list[Any] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def write_kubeconfig(self, path: Path) -> Path:
        """A kubeconfig (JSON, which is YAML) whose one context is this server."""
        context = {"cluster": "fake", "user": "fake", "namespace": "default"}
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
                    "users": [{"name": "fake", "user": {"token": "fake"}}],
                    "contexts": [{"name": "fake", "context": context}],
                    "current-context": "fake",
                }
            )
        )
        return path

    def __enter__(self) -> FakeKubernetesApi:
        threading.Thread(target=self._server.serve_forever, name="fake-kubernetes-api", daemon=True).start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stopping.set()  # ends the held watches
        self._server.shutdown()
        self._server.server_close()

    def hold_watch(self) -> None:
        self._stopping.wait(WATCH_HOLD_SECONDS)

    def answer(self, method: str, path: str, query: dict[str, str], body: Any) -> tuple[int, Any]:
        """The status and JSON document for one request, or :data:`WATCH`."""
        match = _POD_PATH.match(path)
        watch = query.get("watch", "").lower() == "true"
        with self._lock:
            self.calls[f"{method} {path}{' (watch)' if watch else ''}"] += 1
            if method == "GET" and path in DISCOVERY:
                return 200, DISCOVERY[path]
            if match is not None and method == "GET" and not match["name"]:
                if watch:
                    return 200, WATCH
                return 200, self._pod_list(match["namespace"], query)
            pod = next((p for p in self.cluster.pods if match and p.metadata.name == match["name"]), None)
            if match is not None and method == "PATCH" and pod is not None:
                self.cluster.patch_namespaced_pod(pod.metadata.name, pod.metadata.namespace, body)
                return 200, _pod_document(pod)
            if match is not None and method == "DELETE" and pod is not None:
                self.cluster.pods.remove(pod)
                return 200, {"kind": "Status", "apiVersion": "v1", "status": "Success"}
            if match is not None and method == "POST" and not match["name"]:
                self.created.append(body)
                return 201, body
            self.unanswered.append(f"{method} {path}")
            return 404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404}

    def _pod_list(self, namespace: str | None, query: dict[str, str]) -> dict[str, Any]:
        selectors = {
            "field_selector": query.get("fieldSelector", ""),
            "label_selector": query.get("labelSelector", ""),
        }
        items = [
            _pod_document(pod)
            for pod in self.cluster.pods
            if namespace in (None, pod.metadata.namespace) and _selected(pod, selectors)
        ]
        return {"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "1"}, "items": items}


def _handler_for(api: FakeKubernetesApi) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self._reply("GET")

        def do_PATCH(self) -> None:
            self._reply("PATCH")

        def do_POST(self) -> None:
            self._reply("POST")

        def do_DELETE(self) -> None:
            self._reply("DELETE")

        def _reply(self, method: str) -> None:
            url = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            status, document = api.answer(method, url.path, dict(parse_qsl(url.query)), body)
            payload = b"" if document is WATCH else json.dumps(document).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            if document is not WATCH:  # a watch's body ends when the connection closes (HTTP/1.0)
                self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            self.wfile.flush()
            if document is WATCH:
                api.hold_watch()

        def log_message(self, format: str, *args: Any) -> None:
            """Silent: :attr:`FakeKubernetesApi.calls` counts the requests."""

    return Handler


# ---------------------------------------------------------------------------------------------------
# A real `airflow scheduler` restarted over the orphans

#: Starts of ``airflow scheduler`` over the same orphans, each after the last one exited, as Kubernetes
#: restarts a crashed scheduler container: the second shows whether the crash repeats (a crash loop).
STARTS = 2
#: Once the orphans are dealt with, a scheduler must stay up this long (several orphan checks) to pass.
STAY_UP_SECONDS = 5.0


@dataclass(frozen=True)
class SchedulerStart:
    """One ``airflow scheduler`` started over the orphans, as its process and its log showed it."""

    job_id: int
    #: how it ended (its loop's crash, or its exit); ``None``: it stayed up, and was then stopped
    ended: str | None
    traceback: bool
    seconds: float

    def describe(self) -> str:
        if self.ended is None:
            return f"stayed up ({self.seconds:.0f} s){', traceback logged' if self.traceback else ''}"
        return f"{self.ended} ({self.seconds:.0f} s)"


def _orphans_left(job_id: int) -> int:
    """The live tries still queued by scheduler job ``job_id`` in a state adoption takes."""
    from airflow.utils.state import State

    table = TaskInstance.__table__
    live = [table.c.working_set.is_(True)] if _archives_tries() else []
    with create_session(scoped=False) as reader:
        rows = reader.execute(
            select(table.c.id).where(
                table.c.queued_by_job_id == job_id, table.c.state.in_(State.adoptable_states), *live
            )
        ).all()
    return len(rows)


def _how_it_ended(scheduler: Component, dead_job_id: int) -> str | None:
    """
    ``scheduler``'s loop crash as it logged it, or its exit; ``None`` once it has outlived the dead job's
    orphans by :data:`STAY_UP_SECONDS`. A crashed scheduler's process group is killed at once: its
    KubernetesExecutor would wait 20 s for the watcher process, which ignores SIGTERM, before it exits.
    """
    deadline, settled_at = time.monotonic() + harness.RESTART_TIMEOUT, None
    while time.monotonic() < deadline:
        if crash := harness.loop_crash(scheduler.read_log()):
            scheduler.kill_group()
            return f"crashed: {crash}"
        if (code := scheduler.popen.poll()) is not None:
            return f"exited with code {code}"
        if settled_at is None and not _orphans_left(dead_job_id):
            settled_at = time.monotonic()
        if settled_at is not None and time.monotonic() - settled_at >= STAY_UP_SECONDS:
            return None
        time.sleep(0.2)
    raise TimeoutError(
        f"{scheduler.name} neither ended nor dealt with the orphans in {harness.RESTART_TIMEOUT:.0f}s:\n"
        + scheduler.tail()
    )


def _start_over_orphans(
    started: list[Component], home: Path, dead_job_id: int, config: dict[str, str], *, fix_enabled: bool
) -> list[SchedulerStart]:
    """Up to :data:`STARTS` ``airflow scheduler`` processes, each started once the one before has ended."""
    starts: list[SchedulerStart] = []
    known = {dead_job_id}
    for number in range(1, STARTS + 1):
        began = time.monotonic()
        scheduler = harness.start_scheduler(f"scheduler-{number}", home, fix_enabled=fix_enabled, **config)
        started.append(scheduler)
        job_id = harness.scheduler_job(scheduler, known=known)
        known.add(job_id)
        harness.check_activation(scheduler, fix_enabled)
        ended = _how_it_ended(scheduler, dead_job_id)
        seconds = time.monotonic() - began
        starts.append(SchedulerStart(job_id, ended, "Traceback" in scheduler.read_log(), seconds))
        if ended is None:
            break
    return starts


def _adopt(runner: Any) -> int:
    """
    The scheduler loop's call, in a thread whose session holds nothing yet (as in a restarted
    scheduler: the scan loads only its ``load_only`` columns); a crash of the loop becomes an assertion.
    """
    settings.Session.remove()
    try:
        return runner.adopt_or_reset_orphaned_tasks()
    except DetachedInstanceError as error:
        raise AssertionError(f"the scheduler loop raised DetachedInstanceError: {error}") from error
    except (RuntimeError, SQLAlchemyError) as error:
        raise AssertionError(f"the scheduler loop raised {error!r}") from error
    finally:
        settings.Session.remove()


def _reset_records_history() -> bool:
    """Whether this release's reset records the abandoned try first (3.1.6+: ``prepare_db_for_next_try``)."""
    from airflow.jobs.scheduler_job_runner import SchedulerJobRunner  # Airflow's own, never patched

    adopt = SchedulerJobRunner.adopt_or_reset_orphaned_tasks
    return "prepare_db_for_next_try" in getattr(adopt, "__wrapped__", adopt).__code__.co_names


def _live_job(session: Session) -> Job:
    job = Job()
    job.job_type = "SchedulerJob"
    job.state = JobState.RUNNING
    session.add(job)
    session.flush()
    return job


def _runner(session: Session, executor: Any) -> Any:
    job = _live_job(session)
    runner = _scheduler_runner(job, executor)
    executor.job_id = job.id
    session.commit()
    return runner


def _outcome(session: Session, run_id: str, task_id: str) -> tuple[Any, Any, int]:
    """``(state, queued_by_job_id)`` of the live try of the task, and how many earlier tries are recorded."""
    table = TaskInstance.__table__
    same = (table.c.run_id == run_id, table.c.task_id == task_id)
    if _archives_tries():
        live = session.execute(
            select(table.c.state, table.c.queued_by_job_id).where(*same, table.c.working_set.is_(True))
        ).one()
        recorded = len(session.execute(select(table.c.id).where(*same, table.c.working_set.is_(None))).all())
    else:
        from airflow.models.taskinstancehistory import TaskInstanceHistory

        live = session.execute(select(table.c.state, table.c.queued_by_job_id).where(*same)).one()
        history = TaskInstanceHistory.__table__
        recorded = len(
            session.execute(
                select(history.c.try_number).where(history.c.run_id == run_id, history.c.task_id == task_id)
            ).all()
        )
    return live.state, live.queued_by_job_id, recorded


@pytest.mark.need_serialized_dag
class TestSchedulerJob:
    @pytest.fixture(autouse=True)
    def per_test(self) -> Iterator[None]:
        _clean_db()
        yield
        _clean_db()

    @pytest.fixture
    def dead_job(self, session: Session) -> Job:
        """A scheduler job that stopped heartbeating an hour ago and was marked failed."""
        job = _live_job(session)
        job.state = JobState.FAILED
        job.latest_heartbeat = datetime.now(timezone.utc) - timedelta(hours=1)
        session.commit()
        return job

    @pytest.fixture
    def orphans(self, dag_maker: DagMaker, session: Session, dead_job: Job) -> list[TaskInstance]:
        """The dead job's running task instances, in a running Dag run."""
        with dag_maker(dag_id="orphans", schedule=None, session=session):
            for task_id in (*ADOPTED, *RESET):
                EmptyOperator(task_id=task_id)
        dag_run = dag_maker.create_dagrun(run_id="orphaned_run", state=DagRunState.RUNNING)
        now = datetime.now(timezone.utc)
        tis = dag_run.get_task_instances(session=session)
        for ti in tis:
            ti.state = TaskInstanceState.RUNNING
            ti.try_number = 1
            ti.queued_by_job_id = dead_job.id
            ti.start_date = ti.last_heartbeat_at = now - timedelta(seconds=30)
            ti.hostname = "worker-of-the-dead-scheduler"
        session.commit()
        return sorted(tis, key=lambda ti: ti.task_id)

    def _assert_adopted_or_reset_once(
        self, session: Session, adopted_by: int, adopted: Sequence[str]
    ) -> None:
        outcomes = {task_id: _outcome(session, "orphaned_run", task_id) for task_id in (*ADOPTED, *RESET)}
        expected = {
            task_id: (TaskInstanceState.RUNNING, adopted_by, 0)
            if task_id in adopted
            else (None, None, int(_reset_records_history()))  # reset (with its running try recorded)
            for task_id in (*ADOPTED, *RESET)
        }
        assert outcomes == expected

    def test_adopt_or_reset_orphaned_tasks_nothing(self, session: Session, dead_job: Job) -> None:
        runner = _runner(session, ScopedSessionExecutor())
        assert _adopt(runner) == 0

    # The real KubernetesExecutor's case needs the ``kubernetes`` extra: parity/expectations.toml declares
    # it not applicable without it, so only ``nox -s tests_kubernetes`` runs it.
    @pytest.mark.parametrize("executor", ["local_executor", "scoped_session_executor", "kubernetes_executor"])
    def test_adopt_or_reset_orphaned_tasks(
        self, session: Session, orphans: list[TaskInstance], dead_job: Job, executor: str
    ) -> None:
        with contextlib.ExitStack() as stack:
            if executor == "local_executor":
                runner, adopted = _runner(session, LocalExecutor()), ()
            elif executor == "scoped_session_executor":
                runner, adopted = _runner(session, ScopedSessionExecutor()), ADOPTED
            else:
                cluster = FakeCluster()
                for ti in orphans:
                    if ti.task_id in ADOPTED:
                        cluster.add_worker_pod(ti, dead_job.id)
                job = _live_job(session)
                k8s = stack.enter_context(_kubernetes_executor(cluster, job.id))
                runner, adopted = _scheduler_runner(job, k8s), ADOPTED
                session.commit()
            assert _adopt(runner) == len(RESET) + len(ADOPTED) - len(adopted)
        self._assert_adopted_or_reset_once(session, runner.job.id, adopted)

    def test_restarted_scheduler_adopts_or_resets_orphaned_tasks(
        self, session: Session, orphans: list[TaskInstance], dead_job: Job, tmp_path: Path
    ) -> None:
        """
        A real ``airflow scheduler`` with the real KubernetesExecutor, started over the orphans of a
        scheduler that was killed (its job still RUNNING, an hour stale), stays up: it adopts the two
        orphans with a worker pod (relabelled to its job through the API) and resets the other three,
        one of them QUEUED. Only the Kubernetes API server is fake (:class:`FakeKubernetesApi`). A
        scheduler that crashes is started again, once, as Kubernetes restarts a crashed container:
        stock crashes both times, the orphans untouched (a crash loop).
        """
        from airflow_heartbeat_fix.activation import is_enabled

        dead_job.state = JobState.RUNNING  # killed before it could mark itself failed
        by_id = {ti.task_id: ti for ti in orphans}
        by_id["reset_2"].state = TaskInstanceState.QUEUED  # queued, its pod never created
        # Paused, so the scheduler schedules nothing it resets again: no worker pod is ever created.
        session.execute(update(DagModel).where(DagModel.dag_id == "orphans").values(is_paused=True))
        session.commit()
        cluster = FakeCluster()
        cluster.add_worker_pod(by_id["adopt_0"], dead_job.id)
        cluster.add_worker_pod(by_id["adopt_1"], dead_job.id, phase="Pending")
        started: list[Component] = []
        with FakeKubernetesApi(cluster) as api:
            kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
            config = {
                **harness.RESTART_CONFIG,
                "AIRFLOW__CORE__EXECUTOR": "KubernetesExecutor",
                "AIRFLOW__KUBERNETES_EXECUTOR__IN_CLUSTER": "False",
                "AIRFLOW__KUBERNETES_EXECUTOR__CONFIG_FILE": str(kubeconfig),
                "AIRFLOW__KUBERNETES_EXECUTOR__NAMESPACE": "default",
            }
            try:
                starts = _start_over_orphans(started, tmp_path, dead_job.id, config, fix_enabled=is_enabled())
            finally:
                for scheduler in started:
                    scheduler.stop()
        owners = {pod.metadata.name: pod.metadata.labels["airflow-worker"] for pod in cluster.pods}
        summary = "; ".join(
            [
                *(f"start {number}: {start.describe()}" for number, start in enumerate(starts, 1)),
                f"orphans left {_orphans_left(dead_job.id)}",
                f"pods owned by {owners}",
                f"API calls {dict(api.calls)}",
            ]
        )
        print(summary)
        assert [start.ended for start in starts] == [None], summary
        assert not starts[0].traceback, summary
        assert api.unanswered == [] and api.created == [], summary
        assert owners == dict.fromkeys(("pod-adopt_0", "pod-adopt_1"), str(starts[0].job_id)), summary
        with create_session(scoped=False) as reader:
            self._assert_adopted_or_reset_once(reader, starts[0].job_id, ADOPTED)

    @pytest.mark.parametrize("error", ["cluster_api_error", "database_error"])
    def test_adopt_or_reset_orphaned_tasks_executor_raises(
        self, session: Session, orphans: list[TaskInstance], error: str
    ) -> None:
        """An executor that fails inside its own session never ends the loop: what it was handed is reset."""
        executor = ScopedSessionExecutor()

        def fail_in_own_session(tis: Sequence[TaskInstance]) -> None:
            with create_session() as own:
                if error == "database_error":
                    own.execute(text("SELECT no_such_column FROM job"))
                raise RuntimeError("the cluster API is unreachable")

        executor.after_session = fail_in_own_session
        runner = _runner(session, executor)
        assert _adopt(runner) == len(ADOPTED) + len(RESET)
        self._assert_adopted_or_reset_once(session, runner.job.id, adopted=())

    @pytest.mark.backend("postgres")
    def test_adopt_or_reset_orphaned_tasks_keeps_row_locks(
        self, session: Session, orphans: list[TaskInstance]
    ) -> None:
        """Until the adoption commits, no other scheduler can lock the orphans it is adopting or resetting."""
        lockable: list[int] = []

        def another_scheduler_scans(tis: Sequence[TaskInstance]) -> None:
            assert settings.engine is not None
            with settings.engine.connect() as other:
                rows = other.execute(
                    text("SELECT id FROM task_instance WHERE run_id = 'orphaned_run' FOR UPDATE SKIP LOCKED")
                ).all()
                other.rollback()
            lockable.append(len(rows))

        executor = ScopedSessionExecutor()
        executor.after_session = another_scheduler_scans
        runner = _runner(session, executor)
        with contextlib.suppress(AssertionError):  # stock then crashes; the locks are what is asserted here
            _adopt(runner)
        assert lockable == [0], "the executor's session committed the adoption's row locks away"
        self._assert_adopted_or_reset_once(session, runner.job.id, ADOPTED)

    @pytest.mark.backend("postgres")
    def test_adopt_or_reset_orphaned_tasks_two_schedulers_at_once(
        self, session: Session, orphans: list[TaskInstance]
    ) -> None:
        """Two schedulers adopting the dead job's orphans together hand each one to one executor, once."""
        first_inside, second_done = threading.Event(), threading.Event()
        first, second = ScopedSessionExecutor(), ScopedSessionExecutor()

        def let_the_second_go(tis: Sequence[TaskInstance]) -> None:
            first_inside.set()
            second_done.wait(timeout=30)

        first.after_session = let_the_second_go
        runners = [_runner(session, first), _runner(session, second)]
        errors: list[BaseException] = []

        def run(runner: Any, wait_for: threading.Event | None, done: threading.Event | None) -> None:
            try:
                if wait_for is not None:
                    wait_for.wait(timeout=30)
                _adopt(runner)
            except BaseException as error:
                errors.append(error)
            finally:
                if done is not None:
                    done.set()

        threads = [
            threading.Thread(target=run, args=(runners[0], None, None)),
            threading.Thread(target=run, args=(runners[1], first_inside, second_done)),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        handed = sorted(first.handed + second.handed)
        assert handed == sorted(("orphaned_run", task_id) for task_id in (*ADOPTED, *RESET)), (
            f"the orphans were handed to the executors {handed} (errors: {errors})"
        )
        assert errors == []
        adopted_by = runners[0].job.id if first.handed else runners[1].job.id
        self._assert_adopted_or_reset_once(session, adopted_by, ADOPTED)
