"""A run's result as JSON, both ways."""

from __future__ import annotations

import dataclasses
import json

from airflow_heartbeat_fix.demo import result
from tests.demo._results import RECORDED, recorded_results


def test_every_field_survives_json_both_ways() -> None:
    """What ``--json`` writes reads back equal, nested outcomes, integer try numbers and marks included."""
    for run_result in recorded_results():
        written = json.loads(json.dumps(result.run_to_json(run_result)))
        assert result.run_from_json(written) == run_result
        assert written == json.loads(json.dumps(dataclasses.asdict(run_result)))  # the stdlib's JSON form


def test_a_recorded_run_reads_back_with_the_fields_added_since_as_their_defaults() -> None:
    """``demo-3.3.2-sqlite.json`` predates the topology and the scenarios: those come back as defaults."""
    for raw in json.loads(RECORDED.read_text(encoding="utf-8"))["runs"].values():
        read = result.run_from_json(raw)
        assert read.topology == "LocalExecutor, 1 scheduler" and read.scenario == "hung"
        written = result.run_to_json(read)
        assert {key: written[key] for key in raw if key not in ("dags", "scheduler")} == {
            k: v for k, v in raw.items() if k not in ("dags", "scheduler")
        }
        # ``alive`` is derived from ``crashed`` and ``exit_code`` now, not recorded; ``actions`` is newer.
        recorded = {k: v for k, v in raw["scheduler"].items() if k != "alive"}
        assert {k: written["scheduler"][k] for k in recorded} == recorded
        assert written["scheduler"]["actions"] == {}
        assert read.scheduler.alive is raw["scheduler"]["alive"]
        for dag_id, dag in raw["dags"].items():
            assert {key: written["dags"][dag_id][key] for key in dag} == dag
