"""What the demo's Airflow processes write down for it: one JSON line per callback and per email.

The demo Dags use :func:`record_failure` / :func:`record_retry` as their ``on_failure_callback`` /
``on_retry_callback`` (callbacks run in the Dag processor), and the demo points ``[email]
email_backend`` at :func:`send_email`: Airflow 3.3+ routes the alerts that the Dag processor sends for
an ``EmailRequest`` through a non-default backend with the signature of
``airflow.utils.email.send_email``. So callbacks and emails are counted per try without a mail server.
Both logs live in ``$AIRFLOW_HOME``, which the demo gives each run.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

CALLBACK_LOG_NAME = "callback_log.jsonl"
EMAIL_LOG_NAME = "email_log.jsonl"
#: ``--scenario kill-dag-processor``: a Dag run's failure callback, when it starts and when it is done.
DAG_CALLBACK_LOG_NAME = "dag_callback_log.jsonl"
DAG_CALLBACK_STARTED, DAG_CALLBACK_DONE = "started", "done"

# Rendered by Airflow as the email subject (``[email] subject_template``); JSON so it parses back.
SUBJECT_TEMPLATE = (
    '{"dag_id": "{{ ti.dag_id }}", "task_id": "{{ ti.task_id }}", '
    '"run_id": "{{ ti.run_id }}", "try_number": {{ try_number }}}'
)


def log_path(name: str) -> Path:
    home = os.environ.get("AIRFLOW_HOME") or os.path.expanduser("~/airflow")
    return Path(home) / name


def _append(name: str, line: dict[str, Any]) -> None:
    with log_path(name).open("a", encoding="utf-8") as f:
        f.write(json.dumps({**line, "time": time.time(), "pid": os.getpid()}) + "\n")


def _record_callback(kind: str, context: Any) -> None:
    ti = context["ti"]
    fields = ("dag_id", "task_id", "run_id", "map_index", "try_number")
    _append(CALLBACK_LOG_NAME, {**{name: getattr(ti, name) for name in fields}, "kind": kind})


def record_failure(context: Any) -> None:
    """``on_failure_callback`` of the demo Dags."""
    _record_callback("on_failure_callback", context)


def record_retry(context: Any) -> None:
    """``on_retry_callback`` of the demo Dags."""
    _record_callback("on_retry_callback", context)


def record_dag_failure(context: Any, event: str) -> None:
    """A Dag run's ``on_failure_callback`` (run by the Dag processor): ``event`` started or done."""
    dag_run = context.get("dag_run")
    run_id = context.get("run_id") or getattr(dag_run, "run_id", None)
    dag_id = getattr(context.get("dag"), "dag_id", None) or getattr(dag_run, "dag_id", None)
    _append(DAG_CALLBACK_LOG_NAME, {"dag_id": dag_id, "run_id": run_id, "event": event})


def parse_subject(subject: str) -> dict[str, Any] | None:
    """Return the fields of a subject rendered from :data:`SUBJECT_TEMPLATE`, or None."""
    try:
        fields = json.loads(subject)
    except ValueError:
        return None
    return fields if isinstance(fields, dict) else None


def send_email(
    to: str | list[str],
    subject: str,
    html_content: str,
    files: list[str] | None = None,
    dryrun: bool = False,
    cc: str | list[str] | None = None,
    bcc: str | list[str] | None = None,
    mime_subtype: str = "mixed",
    mime_charset: str = "utf-8",
    conn_id: str | None = None,
    from_email: str | None = None,
    custom_headers: dict[str, Any] | None = None,
    **kwargs: Any,
) -> None:
    """Append the email as one JSON line to ``$AIRFLOW_HOME/email_log.jsonl``."""
    _append(EMAIL_LOG_NAME, {"to": to, "subject": subject, "fields": parse_subject(subject)})
