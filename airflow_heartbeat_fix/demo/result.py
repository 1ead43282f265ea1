"""
What one demo run found: the Dags it is about, the tries, callbacks and emails per Dag, the scheduler's
fate, the timeline, and the verdict fields; and that result as JSON, both ways.

``--json`` writes :func:`run_to_json` of each run; :func:`run_from_json` reads one back (``--report-from``
draws a recorded result's reports again). Both go through one pydantic ``TypeAdapter`` of
:class:`RunResult`, so the JSON form follows the dataclasses with no hand-written inverse.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from pydantic import TypeAdapter

RETRY_DAG_ID = "retry_after_heartbeat_timeout"
CALLBACK_DAG_ID = "duplicate_heartbeat_callbacks"
DAG_IDS = (RETRY_DAG_ID, CALLBACK_DAG_ID)
#: ``--scenario many``: fifty mapped task instances that freeze at once, each to fail with one callback.
MANY_DAG_ID = "many_hung_tasks"
MANY_SCENARIO = "many"
#: How many task instances ``dags/many_hung_tasks.py`` maps (it imports this), each to get one callback.
MANY_TASKS = 50
#: ``--scenario redelivery``: one task that outlives Redis's visibility timeout and must succeed in its
#: first try although a redelivered copy of it is refused and reported FAILED.
REDELIVERY_DAG_ID = "redelivered_task"
REDELIVERY_SCENARIO = "redelivery"
#: How long ``dags/redelivered_task.py``'s task runs (it imports this): past the latest redelivery (120 s).
REDELIVERY_TASK_SECONDS = 150
#: The Dags whose callbacks the reports count per try.
CALLBACK_DAG_IDS = (CALLBACK_DAG_ID, REDELIVERY_DAG_ID)

#: ``--scenario kill-dag-processor``: runs of one Dag that fail at once; each run's failure callback
#: runs in the Dag processor, which is SIGKILLed once the first has started, and restarted.
KILLED_DAG_ID = "dag_processor_killed"
KILL_DAG_PROCESSOR_SCENARIO = "kill-dag-processor"
KILLED_RUNS = ("incident-1", "incident-2", "incident-3")

RETRY_CALLBACK = "on_retry_callback"
FAILURE_CALLBACK = "on_failure_callback"
EMAIL = "email"

TERMINAL_RUN_STATES = frozenset({"success", "failed"})


def scenario_dag_ids(scenario: str) -> tuple[str, ...]:
    """The Dags a run of ``scenario`` deploys and triggers."""
    if scenario == KILL_DAG_PROCESSOR_SCENARIO:
        return (KILLED_DAG_ID,)
    if scenario == REDELIVERY_SCENARIO:
        return (REDELIVERY_DAG_ID,)
    return (*DAG_IDS, MANY_DAG_ID) if scenario == MANY_SCENARIO else DAG_IDS


#: Every Dag any scenario deploys (a database holding others is not the demo's).
EVERY_DAG_ID = (*DAG_IDS, MANY_DAG_ID, KILLED_DAG_ID, REDELIVERY_DAG_ID)


def report_dag_ids(scenario: str) -> tuple[str, ...]:
    """
    The Dags whose tries the reports show one by one (``--scenario many``'s mapped Dag has a summary,
    ``kill-dag-processor``'s Dag runs rows of their own).
    """
    if scenario == KILL_DAG_PROCESSOR_SCENARIO:
        return ()
    return (REDELIVERY_DAG_ID,) if scenario == REDELIVERY_SCENARIO else DAG_IDS


def state_name(value: Any) -> str | None:
    """A state as its text, whether the database driver returned an enum member or a string."""
    if value is None:
        return None
    return str(getattr(value, "value", value))


@dataclass(frozen=True)
class TryRow:
    """One try of a task instance: ``where`` is current, archived (3.4) or history (<= 3.3)."""

    task_id: str
    try_number: int
    state: str | None
    where: str
    archived_reason: str | None = None


@dataclass(frozen=True)
class StateChange:
    """A try's task instance state as first seen ``seconds`` after the trigger (polled every second)."""

    seconds: float
    dag_id: str
    try_number: int
    state: str | None


@dataclass(frozen=True)
class Mark:
    """One callback or email (``kind``) about one try, ``seconds`` after the trigger."""

    seconds: float
    dag_id: str
    try_number: int
    kind: str


@dataclass
class DagOutcome:
    dag_id: str
    run_state: str | None = None
    tries: list[TryRow] = field(default_factory=list)
    #: try number -> callback kind -> how many the Dag processor ran
    callbacks: dict[int, dict[str, int]] = field(default_factory=dict)
    #: try number -> emails sent through the demo's email backend
    emails: dict[int, int] = field(default_factory=dict)
    #: mapped Dags only: map index -> callbacks recorded for it
    per_map_index: dict[int, int] = field(default_factory=dict)


@dataclass
class SchedulerOutcome:
    crashed: bool = False
    exit_code: int | None = None
    error: str | None = None
    fixes: dict[str, str] = field(default_factory=dict)  # fix -> state, as the scheduler logged them
    #: fix -> lines the schedulers logged when that fix acted (``airflow-heartbeat-fix (<fix>): ...``)
    actions: dict[str, int] = field(default_factory=dict)

    @property
    def alive(self) -> bool:
        """Neither crashed nor exited; derived, so an ``alive`` key in an older result file is ignored."""
        return not self.crashed and self.exit_code is None


@dataclass
class RunResult:
    label: str
    fix_enabled: bool
    airflow_version: str
    database: str
    home: str
    #: executor, schedulers, workers (:attr:`~airflow_heartbeat_fix.demo.topology.Topology.label`)
    topology: str = "LocalExecutor, 1 scheduler"
    scheduler: SchedulerOutcome = field(default_factory=SchedulerOutcome)
    dags: dict[str, DagOutcome] = field(default_factory=dict)
    converged: bool = False
    converge_seconds: float | None = None
    elapsed_seconds: float = 0.0
    stop_reason: str = ""
    problems: list[str] = field(default_factory=list)
    reproduced: bool | None = None
    leftover_pids: list[int] = field(default_factory=list)
    #: fix -> state with the fixes enabled, as the package's detection decides on this Airflow
    needed_fixes: dict[str, str] = field(default_factory=dict)
    #: whether this Airflow sends the Dag processor's email requests through ``[email] email_backend``
    emails_via_backend: bool = True
    #: for the timeline: state changes, callbacks and emails, the crash, all in seconds after the trigger
    timeline: list[StateChange] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)
    crashed_after: float | None = None
    watched_seconds: float = 0.0
    #: ``--scenario``, and what it did to the components (``SIGKILL scheduler-1 at 23 s``)
    scenario: str = "hung"
    injected: list[str] = field(default_factory=list)
    #: ``--scenario many``: how many mapped task instances the Dag has
    many_expected: int = 0
    #: ``--scenario kill-dag-processor``: each Dag run's state, and how many of its failure callbacks
    #: started and finished (run id -> count)
    killed_runs: dict[str, str | None] = field(default_factory=dict)
    dag_callbacks_started: dict[str, int] = field(default_factory=dict)
    dag_callbacks_done: dict[str, int] = field(default_factory=dict)
    #: What the schedulers logged about terminal executor events for running tries: the fix setting one
    #: aside, and the stock path failing a running try on one ("... state attribute is running")
    events_set_aside: int = 0
    running_tries_failed_by_event: int = 0


@functools.cache
def _adapter() -> TypeAdapter[RunResult]:
    # Imported here: building the adapter costs more than the rest of the demo's start-up.
    from pydantic import TypeAdapter

    return TypeAdapter(RunResult)


def run_to_json(result: RunResult) -> dict[str, Any]:
    """``result`` as plain JSON values (integer keys become strings, as ``json.dumps`` writes them)."""
    data: dict[str, Any] = _adapter().dump_python(result, mode="json")
    return data


def run_from_json(data: Mapping[str, Any]) -> RunResult:
    """A run back from its :func:`run_to_json` form (string keys back to try numbers and map indexes)."""
    return _adapter().validate_python(dict(data))


# --- what a run saw over time ---------------------------------------------------------------------


def try_states(dags: Mapping[str, DagOutcome]) -> dict[tuple[str, int], str | None]:
    """``(dag_id, try_number) -> state`` of every try seen now."""
    return {(dag_id, t.try_number): t.state for dag_id, o in dags.items() for t in o.tries}


def state_changes(
    before: Mapping[tuple[str, int], str | None], now: Mapping[tuple[str, int], str | None], seconds: float
) -> list[StateChange]:
    """The tries that are new or changed state between two polls."""
    return [
        StateChange(seconds, dag_id, try_number, state)
        for (dag_id, try_number), state in sorted(now.items())
        if (dag_id, try_number) not in before or before[(dag_id, try_number)] != state
    ]


def all_try_numbers(results: Iterable[RunResult]) -> dict[str, list[int]]:
    """
    Per Dag the reports show, every try number any run saw (at least 1 and 2), so the runs line up side
    by side.
    """
    results = list(results)
    shown = [dag_id for result in results for dag_id in report_dag_ids(result.scenario)] or list(DAG_IDS)
    numbers: dict[str, set[int]] = {dag_id: {1, 2} for dag_id in shown}
    for result in results:
        for dag_id, outcome in result.dags.items():
            if dag_id not in numbers:
                continue
            numbers[dag_id].update(t.try_number for t in outcome.tries)
            numbers[dag_id].update(outcome.callbacks)
            numbers[dag_id].update(outcome.emails)
    return {dag_id: sorted(n) for dag_id, n in numbers.items()}


def find_try(outcome: DagOutcome, try_number: int) -> TryRow | None:
    """The row of try ``try_number`` of ``outcome``, or None when that try was never created."""
    return next((t for t in outcome.tries if t.try_number == try_number), None)


def total_callbacks(outcome: DagOutcome, try_number: int) -> int:
    """Callbacks of every kind that try ``try_number`` got."""
    return sum(outcome.callbacks.get(try_number, {}).values())
