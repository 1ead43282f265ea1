"""The probe the demo runs to learn what the installed Airflow needs."""

from __future__ import annotations


def test_features_probe_reads_this_airflow() -> None:
    """The demo's only source for "which bug": the package's detection on the installed Airflow."""
    from airflow_heartbeat_fix import activation, detection
    from airflow_heartbeat_fix.demo import features

    found = features.read()
    decided = detection.decide(activation.facts(), enabled=True)
    assert found["needed_fixes"] == {fix: d.state.value for fix, d in decided.items()}
    assert isinstance(found["emails_via_backend"], bool)
