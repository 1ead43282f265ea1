"""``airflow-heartbeat-fix``: ``status``, ``scheduler`` (explicitly fixed) and ``demo``."""

from __future__ import annotations

import argparse
import sys


def _status() -> int:
    from airflow_heartbeat_fix import __version__, activation, policy

    facts = activation.facts()
    print(f"airflow-heartbeat-fix {__version__}")
    print(f"Airflow {facts.version}")
    enabled = activation.is_enabled()
    print(f"[heartbeat_fix] enabled = {enabled}")
    hooked = any(isinstance(finder, policy.SchedulerCommandHook) for finder in sys.meta_path)
    print(
        "activation: airflow.policy entry point "
        + ("loaded: a plain `airflow scheduler` runs the fixed scheduler" if hooked else "NOT loaded")
    )
    for fix, title, state, reason in activation.describe():
        print(f"  {fix}: {state}")
        print(f"      {title}")
        print(f"      why: {reason}")
    return 0


def _scheduler(args: list[str]) -> int:
    from airflow_heartbeat_fix.activation import install

    install()
    from airflow.__main__ import main as airflow_main

    sys.argv = ["airflow", "scheduler", *args]
    airflow_main()
    return 0


def _demo(args: list[str]) -> int:
    from airflow_heartbeat_fix.demo import main as demo_main

    return demo_main(args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="airflow-heartbeat-fix",
        description="Fixes for Airflow 3.x heartbeat-timeout callbacks and the retry UniqueViolation crash.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("status", help="which fixes are active on this installation, and why")
    # Their arguments (and --help) belong to `airflow scheduler` and to the demo, not to this parser.
    sub.add_parser(
        "scheduler",
        help="run `airflow scheduler ARGS...` with the fixes installed explicitly",
        add_help=False,
    )
    sub.add_parser(
        "demo", help="end-to-end reproduction: stock vs fixed scheduler, side by side", add_help=False
    )
    known, rest = parser.parse_known_args(argv)
    if known.command == "status":
        return _status()
    if known.command == "scheduler":
        return _scheduler(rest)
    return _demo(rest)


if __name__ == "__main__":
    sys.exit(main())
