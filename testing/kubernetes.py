"""
The Kubernetes API as the KubernetesExecutor of cncf-kubernetes 10.17.x sees it during orphan adoption: a
cluster of pods (:class:`FakeCluster`), reached in-process through its clients, or over HTTP on loopback
through a kubeconfig (:class:`FakeKubernetesApi`, for a real ``airflow scheduler``). What is outside the
bug (a Kubernetes API server) is replaced; the executor and its clients are real.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlsplit

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from airflow.models.taskinstance import TaskInstance

try:
    from airflow.providers.cncf.kubernetes.executors import kubernetes_executor
except ImportError:  # only nox -s tests_kubernetes installs the provider
    kubernetes_executor = None


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
def kubernetes_executor_on(cluster: FakeCluster, job_id: int) -> Iterator[Any]:
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
