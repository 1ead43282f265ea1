"""The probe the demo runs to learn what the installed Airflow needs."""

from __future__ import annotations

from importlib.util import find_spec

from airflow_heartbeat_fix.demo import features
from airflow_heartbeat_fix.detection import FIXES, FixState
from airflow_heartbeat_fix.support import installed_airflow_version
from parity.expectations import load


def test_features_probe_needs_the_fixes_parity_declares_for_this_airflow() -> None:
    """
    The demo's only source for "which bug" is this probe: it must name every fix, decide as if the
    fixes were on (the stock cells run it with the switch off), and need exactly the fixes whose bugs
    ``parity/expectations.toml`` lists for the installed release.
    """
    found = features.read()
    version = installed_airflow_version()
    declared = {bug.fix for bug in load().bugs.values() if version in bug.versions}

    assert set(found["needed_fixes"]) == set(FIXES)
    assert FixState.DISABLED.value not in found["needed_fixes"].values()
    needed = {fix for fix, state in found["needed_fixes"].items() if state != FixState.NOT_NEEDED.value}
    assert needed == declared


def test_features_probe_says_whether_emails_go_through_the_backend() -> None:
    found = features.read()
    assert found["emails_via_backend"] is (find_spec(features.EMAIL_BACKEND_MODULE) is not None)
    if found["emails_via_backend"]:  # the module the records backend is called through really imports
        __import__(features.EMAIL_BACKEND_MODULE)
