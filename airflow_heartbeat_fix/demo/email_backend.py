"""A fake ``[email] email_backend`` for the demo: records each email instead of sending it.

Airflow 3.3+ routes failure/retry alerts that the Dag processor sends for an ``EmailRequest`` through
``[email] email_backend`` when it is not the SMTP default, calling it with the signature of
``airflow.utils.email.send_email``. The demo points that option at :func:`send_email`, so email requests
can be counted per try without a mail server.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

EMAIL_LOG_NAME = "email_log.jsonl"

# Rendered by Airflow as the email subject (``[email] subject_template``); JSON so it parses back.
SUBJECT_TEMPLATE = (
    '{"dag_id": "{{ ti.dag_id }}", "task_id": "{{ ti.task_id }}", '
    '"run_id": "{{ ti.run_id }}", "try_number": {{ try_number }}}'
)


def email_log_path() -> Path:
    home = os.environ.get("AIRFLOW_HOME") or os.path.expanduser("~/airflow")
    return Path(home) / EMAIL_LOG_NAME


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
    line = {
        "to": to,
        "subject": subject,
        "fields": parse_subject(subject),
        "time": time.time(),
        "pid": os.getpid(),
    }
    with email_log_path().open("a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")
