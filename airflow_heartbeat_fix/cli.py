"""``airflow-heartbeat-fix``: ``status``, ``scheduler`` (explicitly fixed) and ``demo``."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from importlib import metadata
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

#: Exit codes, as documented in ``--help`` and the README.
EXIT_OK, EXIT_NOT_APPLIED, EXIT_USAGE = 0, 1, 2
POLICY_MODULE = "airflow_heartbeat_fix.policy"

EPILOG = """\
exit codes:
  0  every fix this Airflow needs is applied by a scheduler started now (or none is needed)
  1  a needed fix would not be applied (disabled, unsupported, or activation missing)
  2  usage error
"""


def _say(message: str) -> None:
    print(f"airflow-heartbeat-fix: {message}", file=sys.stderr)


def _policy_entry_point_registered() -> bool:
    """Read from package metadata, not from this process (importing the policy registers the hook)."""
    return any(ep.value == POLICY_MODULE for ep in metadata.entry_points(group="airflow.policy"))


def status_document() -> dict[str, Any]:
    """What a scheduler started now would run, from the same activation done as a dry run."""
    from airflow import __version__ as airflow_version

    from airflow_heartbeat_fix import __version__, activation
    from airflow_heartbeat_fix.detection import FixState

    switch = activation.read_switch()
    decided = activation.dry_run()
    registered = _policy_entry_point_registered()
    active = [d.fix for d in decided.values() if d.state is FixState.ACTIVE]
    not_applied = [d.fix for d in activation.not_applied(decided)]
    if active and not registered:
        not_applied.append("airflow.policy hook")
    if not registered and active:
        activation_line = "airflow.policy entry point NOT registered: `airflow scheduler` runs unfixed"
    elif active:
        activation_line = f"a plain `airflow scheduler` runs with {', '.join(active)}"
    else:
        activation_line = "a plain `airflow scheduler` runs Airflow's own classes"
    return {
        "package_version": __version__,
        "airflow_version": airflow_version,
        "enabled": switch.raw,
        "config_problem": switch.problem,
        "policy_entry_point_registered": registered,
        "activation": activation_line,
        "ok": not not_applied,
        "not_applied": not_applied,
        "fixes": activation.describe(decided),
    }


def _status_rows(document: dict[str, Any], output: str) -> list[dict[str, str]]:
    """
    One row per fix. Only ``table`` renders its cells as rich markup (where "[heartbeat_fix]" would
    vanish); ``plain`` prints them as they are, so escaping there would show the backslash.
    """
    from rich.markup import escape

    keep = escape if output == "table" else str
    return [{k: keep(row[k]) for k in ("fix", "state", "reason")} for row in document["fixes"]]


def _print_status(document: dict[str, Any], output: str) -> None:
    from airflow.cli.simple_table import AirflowConsole

    console = AirflowConsole()
    if output == "json":
        console.print_as_json(document)
    elif output == "yaml":
        console.print_as_yaml(document)
    else:
        print(f"airflow-heartbeat-fix {document['package_version']} on Airflow {document['airflow_version']}")
        print(f"[heartbeat_fix] enabled = {document['enabled']}")
        print(f"activation: {document['activation']}")
        console.print_as(_status_rows(document, output), output=output)
    if document["config_problem"]:
        _say(document["config_problem"])


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """
    Send whatever Airflow writes to stdout while it loads to stderr instead, at the file descriptor.

    Airflow 3.2.0-3.2.2 log to stdout on import (alembic's plugin setup at INFO, through a logger that
    holds the stream), which would corrupt ``status -o json``; stdout carries the document only.
    """
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _status(output: str) -> int:
    with _stdout_to_stderr():
        document = status_document()
    _print_status(document, output)
    if not document["ok"]:
        _say("a scheduler started now would run without: " + ", ".join(document["not_applied"]))
        return EXIT_NOT_APPLIED
    return EXIT_OK


def _scheduler(args: list[str]) -> int:
    """Explicit setup fails loudly: refuse to start a scheduler without a fix this Airflow needs."""
    from airflow_heartbeat_fix import activation

    if not {"-h", "--help"} & set(args):
        try:
            decided = activation.install(raise_errors=True)
        except activation.ActivationError as exc:
            _say(f"refusing to start the scheduler: {exc}")
            return EXIT_NOT_APPLIED
        if missing := activation.not_applied(decided):
            activation.uninstall()
            reasons = "; ".join(f"{d.fix} is {d.state.value}: {d.reason}" for d in missing)
            _say(f"refusing to start the scheduler without a fix this Airflow needs: {reasons}")
            return EXIT_NOT_APPLIED
    from airflow.__main__ import main as airflow_main

    sys.argv = ["airflow", "scheduler", *args]
    airflow_main()
    return EXIT_OK


def _demo(args: list[str]) -> int:
    from airflow_heartbeat_fix.demo import main as demo_main

    return demo_main(args)


def _parser() -> argparse.ArgumentParser:
    from airflow_heartbeat_fix import __version__

    parser = argparse.ArgumentParser(
        prog="airflow-heartbeat-fix",
        description="Fixes for Airflow 3.x heartbeat-timeout callbacks and the retry UniqueViolation crash.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{status,scheduler,demo}")
    status = sub.add_parser("status", help="what a scheduler started now would run, and why")
    status.add_argument(
        "-o", "--output", choices=("table", "json", "yaml", "plain"), default="table", help="output format"
    )
    # Listed for --help only: their arguments belong to `airflow scheduler` and to the demo.
    sub.add_parser("scheduler", help="run `airflow scheduler ARGS...` with the fixes installed explicitly")
    sub.add_parser("demo", help="end-to-end reproduction: stock vs fixed scheduler, side by side")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "scheduler":
        return _scheduler(args[1:])
    if args and args[0] == "demo":
        return _demo(args[1:])
    parsed = _parser().parse_args(args)  # exits 2 with one line on unknown options
    return _status(parsed.output)


if __name__ == "__main__":
    sys.exit(main())
