"""``airflow-heartbeat-fix``: ``status``, ``scheduler`` and ``dag-processor`` (fixed explicitly), ``demo``."""

from __future__ import annotations

import argparse
import configparser
import contextlib
import json
import os
import platform
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
  0  a scheduler and a Dag processor started now apply every fix this Airflow needs, none is
     needed, or [heartbeat_fix] enabled = False switched them off
  1  a fix would not be applied although it cannot be ruled out as needed (an Airflow outside the
     supported range, code not recognised, the airflow.policy entry point missing), or Airflow's
     configuration cannot be read
  2  usage error
"""


def _say(message: str) -> None:
    print(f"airflow-heartbeat-fix: {message}", file=sys.stderr)


def _policy_entry_point_registered() -> bool:
    """Read from package metadata, not from this process (importing the policy registers the hook)."""
    return any(ep.value == POLICY_MODULE for ep in metadata.entry_points(group="airflow.policy"))


#: The state a row shows for a fix that would be active but that no hook will install.
UNHOOKED = (
    "the airflow.policy entry point is not registered (reinstall the package): "
    "a plain `airflow scheduler` or `airflow dag-processor` runs Airflow's own classes"
)


RUNS_STOCK = "runs Airflow's own classes"
#: The command each target's fixes are activated in, as ``status`` names it.
COMMANDS = {"scheduler": "airflow scheduler", "dag_processor": "airflow dag-processor"}


def _activation_line(active: list[str], stock: str) -> str:
    """Which plain command runs which fixes: ``a plain `airflow scheduler` runs with A, B; ...``."""
    from airflow_heartbeat_fix.activation import target_of

    parts = []
    for target, command in COMMANDS.items():
        own = [fix for fix in active if target_of(fix) == target]
        parts.append(f"a plain `{command}` " + (f"runs with {', '.join(own)}" if own else stock))
    return "; ".join(parts)


def _airflow_version() -> str:
    from airflow import __version__

    return str(__version__)


def status_document() -> dict[str, Any]:
    """What a plain ``airflow scheduler`` started now would run, from the same activation as a dry run."""
    from airflow_heartbeat_fix import __version__, activation, support
    from airflow_heartbeat_fix.config_check import config_warnings
    from airflow_heartbeat_fix.detection import FixDecision, FixState

    in_range = support.check()
    # Outside the range, the version comes from metadata: nothing of that Airflow's code is read.
    airflow_version = str(in_range.airflow_version) if in_range.refusal else _airflow_version()
    switch = activation.read_switch()
    decided = activation.dry_run()
    registered = _policy_entry_point_registered()
    active = [d.fix for d in decided.values() if d.state is FixState.ACTIVE]
    if active and not registered:
        # The rows say what the plain scheduler runs: without the hook, none of these.
        decided = {**decided, **{fix: FixDecision(fix, FixState.UNSUPPORTED, UNHOOKED) for fix in active}}
        active = []
    # Switched off, nothing is missing: the operator chose Airflow's own classes.
    not_applied = [] if not switch.enabled else [d.fix for d in activation.not_applied(decided)]
    if in_range.refusal:
        activation_line = f"{in_range.refusal}; a plain `airflow scheduler` {RUNS_STOCK}"
    elif not switch.enabled:
        activation_line = f"{activation.OFF_BY_CONFIGURATION}: a plain `airflow scheduler` {RUNS_STOCK}"
    elif not registered and not_applied:
        activation_line = "airflow.policy entry point NOT registered: `airflow scheduler` runs unfixed"
    else:
        activation_line = _activation_line(active, RUNS_STOCK)
    return {
        "package_version": __version__,
        "airflow_version": airflow_version,
        "python_version": platform.python_version(),
        "supported_airflow": f"{support.AIRFLOW_CORE}{in_range.supported or ''}",
        "refusal": in_range.refusal,
        "enabled": switch.enabled,
        "config_problem": switch.problem,
        "config_warnings": config_warnings(),
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
    from airflow_heartbeat_fix._compat import airflow_console

    console = airflow_console()
    if output == "json":
        console.print_as_json(document)
    elif output == "yaml":
        console.print_as_yaml(document)
    else:
        print(
            f"airflow-heartbeat-fix {document['package_version']} on Airflow {document['airflow_version']}, "
            f"Python {document['python_version']}"
        )
        print(f"supported: {document['supported_airflow']}")
        print(f"[heartbeat_fix] enabled = {document['enabled']}")
        print(f"activation: {document['activation']}")
        console.print_as(_status_rows(document, output), output=output)
    for problem in [document["config_problem"], *document["config_warnings"]]:
        if problem:
            _say(problem)


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


def config_error(exc: configparser.Error) -> str:
    """The one line for an ``airflow.cfg`` Airflow cannot parse (configparser's own spans three)."""
    return "cannot read Airflow's configuration: " + " ".join(str(exc).split())


def _print_error(message: str, output: str) -> None:
    """``-o json``/``yaml`` still print a document (``ok`` false, the error); the line goes to stderr."""
    from airflow_heartbeat_fix import __version__

    document = {"package_version": __version__, "ok": False, "error": message}
    if output == "json":
        print(json.dumps(document, indent=2))
    elif output == "yaml":
        print("".join(f"{key}: {json.dumps(value)}\n" for key, value in document.items()), end="")
    _say(message)


def _status(output: str) -> int:
    try:
        with _stdout_to_stderr():
            document = status_document()
    except configparser.Error as exc:
        _print_error(config_error(exc), output)
        return EXIT_NOT_APPLIED
    try:
        _print_status(document, output)
    except BrokenPipeError:  # `status | head`: the reader has what it wanted; the answer is the exit code
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    if document["refusal"]:
        _say(document["refusal"])
    elif not document["ok"]:
        _say("a process started now would run without: " + ", ".join(document["not_applied"]))
    return EXIT_OK if document["ok"] else EXIT_NOT_APPLIED


def _switched_on() -> bool:
    """The switch, read after activation stopped early (out of range): a broken file still refuses."""
    from airflow_heartbeat_fix import activation

    try:
        return activation.is_enabled()
    except configparser.Error:
        return True


def _explicit(command: str, args: list[str]) -> int:
    """
    Explicit setup fails loudly: refuse to start a scheduler (``command`` ``scheduler``) or a Dag processor
    (``dag-processor``) without a fix that cannot be applied. Switched off by the operator, it starts
    Airflow's own (the start line says so).
    """
    from airflow_heartbeat_fix import activation

    target, name = command.replace("-", "_"), command.replace("-", " ").replace("dag", "Dag")
    if not {"-h", "--help"} & set(args):
        try:
            decided = activation.install(target=target, raise_errors=True)
        except activation.ActivationError as exc:
            cause = exc.__cause__
            if isinstance(cause, configparser.Error):
                _say(config_error(cause))
            else:
                _say(f"refusing to start the {name}: {exc}")
            return EXIT_NOT_APPLIED
        if (missing := activation.not_applied(decided)) and _switched_on():
            activation.uninstall()
            reasons = "; ".join(dict.fromkeys(d.reason for d in missing))
            fixes = ", ".join(d.fix for d in missing)
            _say(f"refusing to start the {name} without {fixes}: {reasons}")
            return EXIT_NOT_APPLIED
    from airflow_heartbeat_fix._compat import airflow_cli_main

    airflow_main = airflow_cli_main()
    sys.argv = ["airflow", command, *args]
    airflow_main()
    return EXIT_OK


def _demo(args: list[str]) -> int:
    from airflow_heartbeat_fix.demo.cli import main as demo_main

    return demo_main(args)


def _parser() -> argparse.ArgumentParser:
    from airflow_heartbeat_fix import __version__, summary

    parser = argparse.ArgumentParser(
        prog="airflow-heartbeat-fix",
        description=summary(),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="{status,scheduler,dag-processor,demo}"
    )
    status = sub.add_parser(
        "status", help="what a scheduler and a Dag processor started now would run, and why"
    )
    status.add_argument(
        "-o", "--output", choices=("table", "json", "yaml", "plain"), default="table", help="output format"
    )
    # Listed for --help only: their arguments belong to `airflow scheduler` and to the demo.
    sub.add_parser("scheduler", help="run `airflow scheduler ARGS...` with the fixes installed explicitly")
    sub.add_parser(
        "dag-processor", help="run `airflow dag-processor ARGS...` with the fixes installed explicitly"
    )
    sub.add_parser("demo", help="end-to-end reproduction: stock vs fixed scheduler, side by side")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("scheduler", "dag-processor"):
        return _explicit(args[0], args[1:])
    if args and args[0] == "demo":
        return _demo(args[1:])
    parsed = _parser().parse_args(args)  # exits 2 with one line on unknown options
    return _status(parsed.output)


if __name__ == "__main__":
    sys.exit(main())
