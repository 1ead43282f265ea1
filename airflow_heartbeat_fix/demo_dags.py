# ruff: noqa: E501  (generated Dag sources below keep their own lines)
"""
The demo Dags, shipped inside the package so ``airflow-heartbeat-fix demo`` works from an installed wheel.

Generated from the repository's ``dags/`` (the source of truth; ``tests/test_dags.py`` checks the two
match). Regenerate with ``python -m airflow_heartbeat_fix.demo_dags dags > airflow_heartbeat_fix/demo_dags.py``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

_MARK = "# --- " + "generated below ---"


def render_module(sources: dict[str, str]) -> str:
    """This module's text, with ``SOURCES`` set to ``sources``."""
    head = Path(__file__).read_text(encoding="utf-8").split(_MARK, 1)[0]
    # json.dumps: double-quoted literals, which is what ruff format keeps.
    body = "".join(f"    {json.dumps(name)}: {json.dumps(text)},\n" for name, text in sorted(sources.items()))
    return f"{head}{_MARK}\n\n# fmt: off\nSOURCES: dict[str, str] = {{\n{body}}}\n# fmt: on\n"


def read_sources(dags_dir: Path) -> dict[str, str]:
    return {p.name: p.read_text(encoding="utf-8") for p in sorted(dags_dir.glob("*.py"))}


if __name__ == "__main__":
    sys.stdout.write(render_module(read_sources(Path(sys.argv[1]))))

# --- generated below ---

# fmt: off
SOURCES: dict[str, str] = {
    "duplicate_heartbeat_callbacks.py": "\"\"\"Reproduce duplicate failure/retry callbacks (and email alerts) after a task heartbeat timeout.\n\nAirflow <= 3.3.x (upstream thread \"Fix duplicate heartbeat-timeout task callbacks\"): the scheduler's\nheartbeat-timeout purge sends a ``TaskCallbackRequest`` but leaves the task instance RUNNING. Until the\nexecutor event finally fails it, the scheduler treats the same try as still running: the executor-event\npath (\"killed externally\") and any later heartbeat scan send another ``on_retry_callback`` /\n``on_failure_callback`` (and email request) for the same try.\n\nThe task freezes its own supervisor with SIGSTOP so heartbeats stop like a hung worker. With\n``retries=1`` a correct scheduler runs exactly one ``on_retry_callback`` (try 1) and one\n``on_failure_callback`` (try 2), and sends one email request per try.\n\nEvery callback invocation appends one JSON line (dag_id, task_id, run_id, try_number, kind, time) to\n``$AIRFLOW_HOME/callback_log.jsonl`` (callbacks run in the Dag processor). Email requests are counted\nwithout a mail server by pointing ``[email] email_backend`` at\n``airflow_heartbeat_fix.demo_email.send_email``, which appends to ``$AIRFLOW_HOME/email_log.jsonl``.\n\"\"\"\n\nfrom __future__ import annotations\n\nimport json\nimport os\nimport signal\nimport time\nfrom datetime import datetime, timedelta\nfrom pathlib import Path\nfrom typing import Any\n\nfrom airflow.sdk import dag, task\n\nCALLBACK_LOG_NAME = \"callback_log.jsonl\"\n\n\ndef _callback_log_path() -> Path:\n    home = os.environ.get(\"AIRFLOW_HOME\") or os.path.expanduser(\"~/airflow\")\n    return Path(home) / CALLBACK_LOG_NAME\n\n\ndef _record(kind: str, context: Any) -> None:\n    ti = context[\"ti\"]\n    line = {\n        \"dag_id\": ti.dag_id,\n        \"task_id\": ti.task_id,\n        \"run_id\": ti.run_id,\n        \"try_number\": ti.try_number,\n        \"kind\": kind,\n        \"time\": time.time(),\n        \"pid\": os.getpid(),\n    }\n    with _callback_log_path().open(\"a\", encoding=\"utf-8\") as f:\n        f.write(json.dumps(line) + \"\\n\")\n\n\ndef record_failure(context: Any) -> None:\n    _record(\"on_failure_callback\", context)\n\n\ndef record_retry(context: Any) -> None:\n    _record(\"on_retry_callback\", context)\n\n\n@dag(\n    schedule=None,\n    start_date=datetime(2024, 1, 1),\n    catchup=False,\n    tags=[\"repro\"],\n    default_args={\n        \"retries\": 1,\n        \"retry_delay\": timedelta(seconds=1),\n        \"on_failure_callback\": record_failure,\n        \"on_retry_callback\": record_retry,\n        \"email\": [\"alerts@example.com\"],\n        \"email_on_failure\": True,\n        \"email_on_retry\": True,\n    },\n)\ndef duplicate_heartbeat_callbacks() -> None:\n    @task\n    def stall() -> None:\n        # Stop the supervisor, not this process: heartbeats stop while the task \"runs\" forever.\n        os.kill(os.getppid(), signal.SIGSTOP)\n        time.sleep(600)\n\n    stall()\n\n\nduplicate_heartbeat_callbacks()\n",
    "retry_after_heartbeat_timeout.py": "\"\"\"Reproduce the scheduler crash when a heartbeat-timed-out task still has retries left.\n\nAirflow 3.4.0b1/b2 (upstream thread \"scheduler dies with UniqueViolation on task_instance_current_key\"):\nwhen the scheduler's heartbeat-timeout purge sends its task callback request, ``DatabaseCallbackSink.send``\ncommits and closes the scheduler loop's own scoped session. The task instance that is about to be\nretried is detached, so ``prepare_db_for_next_try`` cannot archive try 1 and the insert of try 2\ncollides with the still-current row: ``UniqueViolation`` (PostgreSQL) or ``UNIQUE constraint failed``\n(SQLite) on ``task_instance_current_key``. The scheduler loop exits, and restarts crash again.\n\nThe task freezes its own supervisor (the process that heartbeats to the API server) with SIGSTOP, the\nway a hung worker would, so the scheduler sees no heartbeat after\n``[scheduler] task_instance_heartbeat_timeout`` seconds. No callback needs to be configured: the purge\nalways sends a task callback request.\n\nExpected with the fix (or on Airflow 3.3.x): try 1 is FAILED and archived for retry, try 2 is created\n(UP_FOR_RETRY, then running), and the scheduler keeps running.\n\"\"\"\n\nfrom __future__ import annotations\n\nimport os\nimport signal\nimport time\nfrom datetime import datetime, timedelta\n\nfrom airflow.sdk import dag, task\n\n\n@dag(\n    schedule=None,\n    start_date=datetime(2024, 1, 1),\n    catchup=False,\n    tags=[\"repro\"],\n    default_args={\"retry_delay\": timedelta(seconds=1)},\n)\ndef retry_after_heartbeat_timeout() -> None:\n    @task(retries=1)\n    def stall() -> None:\n        # Stop the supervisor, not this process: heartbeats stop while the task \"runs\" forever.\n        os.kill(os.getppid(), signal.SIGSTOP)\n        time.sleep(600)\n\n    stall()\n\n\nretry_after_heartbeat_timeout()\n",
}
# fmt: on
