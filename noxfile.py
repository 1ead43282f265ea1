"""
The project's test runner (nox). ``bash scripts/test.sh`` runs it from a pinned bootstrap; directly:
``bash scripts/nox.sh -l`` lists the sessions, ``bash scripts/nox.sh -s lint`` runs one.

Sessions: ``tests(airflow, db, mode)`` (the matrix), ``tests_wrapped_create_session(airflow, db)`` (the
nested-session tests through a tracing wrapper of ``create_session``), ``lint``, ``breeze_overrides``,
``e2e(airflow, db)`` and ``e2e_celery(airflow, scenario)`` (the demo end to end, LocalExecutor and the
Celery topology, one at a time after the matrix), ``parity`` (checks test-results/ against
parity/expectations.toml), and, not run by default, ``demo``, ``bench``, ``bench_kill_to_retry`` and
``e2e_celery_all(airflow, scenario)``.

Every session runs in one environment per Airflow version, ``.venvs/airflow-<version>``, built with uv
and shared by that version's cells: nox gives each session its own virtualenv, and 16 copies of Airflow
would cost minutes. Results: ``test-results/<cell>.xml`` (junit) and ``test-results/<cell>.log``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any

import nox
from nox.command import CommandFailed

if TYPE_CHECKING:
    from collections.abc import Iterator

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from airflow_heartbeat_fix.demo.topology import KILL_SCHEDULER, SCENARIOS  # noqa: E402  (standard library only)
from parity.check import Outcome, actual_outcome  # noqa: E402  (standard library only)
from parity.expectations import SWEEP_DBS, load  # noqa: E402

RESULTS = ROOT / "test-results"
CONSTRAINTS = ROOT / "constraints"
#: The releases come from parity/expectations.toml, the one place that names them: the full matrix
#: for ``versions`` (the newest patch of each minor line), the sweep's databases for the other patches.
EXPECTATIONS = load()
FULL, SWEEP = list(EXPECTATIONS.versions), list(EXPECTATIONS.sweep)
AIRFLOW_VERSIONS = FULL + SWEEP
#: The newest Airflow: its environment also runs lint, breeze_overrides and parity.
NEWEST = FULL[-1]
#: What ``bash scripts/demo.sh`` runs without ``--airflow``: the newest stable release, so that the demo
#: shows the bug the releases operators run have (duplicate callbacks), not a beta's (a crash).
DEMO_DEFAULT = EXPECTATIONS.newest_stable
DBS = list(EXPECTATIONS.dbs)
#: stock: AIRFLOW__HEARTBEAT_FIX__ENABLED=False, Airflow as released.
MODES = list(EXPECTATIONS.modes)
#: (release, db, mode): the full matrix, then the sweep releases on the sweep's databases.
CELLS = EXPECTATIONS.cells()
#: Other dependency sets of a release: ``constraints/airflow-<release>-<name>.txt`` (e.g. the SQLAlchemy
#: 1.4 and psycopg2 that upstream's constraints pin where a fresh resolution takes SQLAlchemy 2), each
#: run on PostgreSQL (its driver is what differs), fixed and stock, in ``.venvs/airflow-<release>-<name>``.
DEPENDENCY_SETS = sorted(path.stem.removeprefix("airflow-") for path in CONSTRAINTS.glob("airflow-*-*.txt"))
#: The default demo (LocalExecutor, SQLite) on the release it runs; the Celery cells below run the newest.
E2E_CELLS = [(DEMO_DEFAULT, "sqlite")]
#: The demo's Celery topology (PostgreSQL, Redis, two schedulers, two workers): the crash and the duplicates.
E2E_CELERY_VERSIONS = [NEWEST, "3.3.2", "3.1.8"]
#: The demo's ``--scenario`` values (each runs the hung reproduction Dags, the kills add a SIGKILL).
CELERY_SCENARIOS = list(SCENARIOS)
#: What CI runs of them (2 to 3 minutes each, alone): adoption by the other scheduler on the release
#: that crashed. ``e2e_celery_all`` runs every pair on demand: CI's 30 minutes go to the releases' matrix.
E2E_CELERY_CELLS = [(NEWEST, KILL_SCHEDULER)]
#: A cell that hangs outside a test (pytest-timeout covers the tests) is killed, with its subprocesses.
CELL_TIMEOUT = 1200
TWINE = "6.2.0"
#: Releases whose purge benchmark runs at small N in every test run (a smoke test, never timed).
BENCH_SMOKE = ["3.3.2", NEWEST]
#: What the distributions must carry: the license, the demo's Dags; the tests with their conftest and the
#: test support they import (``testing/``, which the wheel leaves out).
WHEEL_MUST_HOLD = (
    "licenses/LICENSE",
    "airflow_heartbeat_fix/demo/dags/retry_after_heartbeat_timeout.py",
    "airflow_heartbeat_fix/demo/plugins/heartbeat_fix_audit_listener.py",
)
SDIST_MUST_HOLD = (
    "LICENSE",
    "tests/conftest.py",
    "tests/_stand_in/tests_common/pytest_plugin.py",
    "testing/environment.py",
)
#: What must stay out of the wheel: the test support is not part of the fix.
WHEEL_MUST_NOT_HOLD = ("testing/",)
#: What the package session runs from the unpacked sdist: no Airflow process started, seconds in all.
SDIST_TESTS = (
    "test_detection.py",
    "test_expectations.py",
    "test_packaging.py",
    "test_dags.py",
    "demo",
)
#: One PostgreSQL database name per checkout, so two clones can test at once on one server.
CHECKOUT_TAG = hashlib.sha256(str(ROOT).encode()).hexdigest()[:6]

nox.options.default_venv_backend = "none"


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Two sessions of one Airflow version may start together (``--parallel``): one builds, one waits."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def interpreter(session: nox.Session, minor: str, why: str) -> str:
    """
    CPython ``minor``'s executable (``3.12``): the newest build under ``$(pyenv root)/versions`` (the
    machine image carries 3.10 to 3.13 there), else ``python<minor>`` on PATH; missing, one line.
    """
    import os
    import subprocess

    roots = [os.environ.get("PYENV_ROOT") or "", str(Path.home() / ".pyenv")]
    with suppress(OSError, subprocess.CalledProcessError):
        pyenv_root = subprocess.run(["pyenv", "root"], capture_output=True, text=True, check=True)
        roots.insert(0, pyenv_root.stdout.strip())
    builds = [
        path
        for root in filter(None, roots)
        for path in Path(root, "versions").glob(f"{minor}.*/bin/python{minor}")
        if re.fullmatch(rf"{re.escape(minor)}\.\d+", path.parent.parent.name)
    ]
    if builds:
        return str(max(builds, key=lambda path: int(path.parent.parent.name.rsplit(".", 1)[1])))
    if found := shutil.which(f"python{minor}"):
        return found
    session.error(f"{why} needs CPython {minor}: none under $(pyenv root)/versions or on PATH")


def airflow_venv(session: nox.Session, version: str, extra: str | None = None) -> Path:
    """``.venvs/airflow-<version>``'s bin directory, creating or updating the environment if needed.

    ``extra`` (``celery``): the package's extra on top of ``dev``, in ``.venvs/airflow-<version>-<extra>``,
    so the matrix's environments never carry the Celery provider. ``version`` may name a dependency
    set (``3.1.8-sqlalchemy1.4``), which has its own constraints file.

    Installs when the constraints or pyproject.toml changed (a stamp holds their hash), not on every
    session: uv reinstalls an editable project each time, under the feet of a cell that is running.
    """
    from uv import find_uv_bin

    uv, env = find_uv_bin(), ROOT / ".venvs" / "-".join(["airflow", version, *([extra] if extra else [])])
    constraints = CONSTRAINTS / f"airflow-{version}.txt"
    extras = ",".join(["dev", *([extra] if extra else [])])
    release = version.split("-", 1)[0]  # a dependency set "3.1.8-sqlalchemy1.4" installs Airflow 3.1.8
    python = interpreter(session, EXPECTATIONS.python_of(version), f"Airflow {version}")
    install = [f"apache-airflow=={release}", "-e", f"{ROOT}[{extras}]", "-c", str(constraints)]
    stamp = hashlib.sha256(
        "\n".join([python, *install, constraints.read_text(), (ROOT / "pyproject.toml").read_text()]).encode()
    ).hexdigest()
    with _locked(env.parent / f".{env.name}.lock"):
        built_on = (env / ".python").read_text() if (env / ".python").exists() else None
        if env.exists() and built_on != python:
            shutil.rmtree(env)  # built on another Python (or before this was recorded): a venv keeps its own
        if not (env / "bin" / "python").exists():
            session.run(uv, "venv", "--quiet", "--seed", "--python", python, str(env), external=True)
            (env / ".python").write_text(python)
        if (env / ".installed").exists() and (env / ".installed").read_text() == stamp:
            return env / "bin"
        # --compile-bytecode: this machine sets PYTHONDONTWRITEBYTECODE=1 and uv writes no .pyc by
        # default, so every Airflow subprocess would compile all of Airflow on import (~10 s, not ~3 s).
        # A sweep release's tests start no Airflow subprocess: compiling all of it would cost more.
        compile_bytecode = ["--compile-bytecode"] if release not in SWEEP else []
        session.run(
            *(uv, "pip", "install", "--quiet", *compile_bytecode, "--python", str(env / "bin" / "python")),
            *install,
            env={"UV_PYTHON_DOWNLOADS": "never"},
            external=True,
        )
        (env / ".installed").write_text(stamp)
    return env / "bin"


def postgres(session: nox.Session, *args: str, version: str = NEWEST) -> str:
    """
    ``scripts/postgres.sh ARGS``'s last output line: installs, starts and provisions the local server.

    Its URLs name psycopg 3, SQLAlchemy 2's driver; SQLAlchemy 1.4 (pinned in ``version``'s constraints)
    has no dialect for it, so there they name psycopg2, as upstream's constraints for those lines pin.
    """
    script = str(ROOT / "scripts" / "postgres.sh")
    url = str(session.run("bash", script, *args, silent=True, stderr=None, external=True)).strip()
    url = url.splitlines()[-1]
    return url.replace("+psycopg:", "+psycopg2:") if sqlalchemy_1(version) else url


def postgres_database(session: nox.Session, label: str, *, version: str = NEWEST) -> str:
    """The URL of a fresh PostgreSQL database for ``label``, named apart per checkout (``CHECKOUT_TAG``)."""
    name = "hbfix_" + re.sub(r"[^a-z0-9]+", "_", f"{CHECKOUT_TAG}_{label}".lower())
    return postgres(session, "create-db", name, version=version)


def sqlalchemy_1(version: str) -> bool:
    """Whether ``version``'s constraints pin SQLAlchemy 1.x."""
    pins = (CONSTRAINTS / f"airflow-{version}.txt").read_text().lower().splitlines()
    return any(pin.startswith("sqlalchemy==1.") for pin in pins)


def cell_name(session_name: str, args: dict[str, str]) -> str:
    """The junit/log name: ``3.4.0b2-sqlite-fixed`` for tests(...), ``e2e-3.4.0b2-sqlite``, ``lint``."""
    prefix = [] if session_name == "tests" else [session_name.replace("_", "-")]
    return "-".join(prefix + [args[key] for key in ("airflow", "db", "mode", "scenario") if key in args])


def redis(session: nox.Session) -> str:
    """``scripts/redis.sh start``'s broker URL: installs and starts the local Redis."""
    out = session.run(
        "bash", str(ROOT / "scripts" / "redis.sh"), "start", silent=True, stderr=None, external=True
    )
    return str(out).strip().splitlines()[-1]


#: This machine sets PYTHONDONTWRITEBYTECODE=1. Unset for the sessions' processes, so that the first one
#: in an environment without compiled bytecode (a sweep release's) writes what it imports for the next.
WRITE_BYTECODE: dict[str, str | None] = {"PYTHONDONTWRITEBYTECODE": None}


def isolated_airflow_env(home: Path, **extra: str | None) -> dict[str, str | None]:
    """An Airflow command's environment in ``home``: none of this process's configuration or database."""
    return {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW_CONFIG": None,
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": None,
        **extra,
    }


def run_into(
    session: nox.Session, *argv: str, stdout: Path, stderr: Path | None = None, **kwargs: Any
) -> Any:
    """``argv`` with its output in files (``stderr``: apart; otherwise with stdout, as nox runs it)."""
    with contextlib.ExitStack() as files:
        if stderr is not None:
            kwargs["stderr"] = files.enter_context(stderr.open("w"))
        return session.run(*argv, stdout=files.enter_context(stdout.open("w")), external=True, **kwargs)


def run_pytest(
    session: nox.Session,
    version: str,
    cell: str,
    env: dict[str, str | None],
    *args: str,
    extra: str | None = None,
) -> None:
    """pytest in a fresh AIRFLOW_HOME, junit to test-results/<cell>.xml, output to <cell>.log."""
    bin_dir = airflow_venv(session, version, extra)
    home = RESULTS / "cells" / cell
    shutil.rmtree(home, ignore_errors=True)
    (home / "airflow").mkdir(parents=True)
    env = isolated_airflow_env(
        home / "airflow",
        # The cell's own values (a PostgreSQL database URL) over the defaults: one mapping, one value each.
        **{
            "HEARTBEAT_FIX_TEST_DB_URL": f"sqlite:///{home}/airflow.db",
            "HEARTBEAT_FIX_CELL": cell,
            **WRITE_BYTECODE,
            **env,
        },
    )
    log = RESULTS / f"{cell}.log"
    session.log(f"{cell}: output in {log.relative_to(ROOT)}")
    try:
        run_into(
            session,
            *("timeout", "--kill-after=30", str(CELL_TIMEOUT), str(bin_dir / "python"), "-m", "pytest"),
            *("-q", f"--junitxml={RESULTS / cell}.xml", *args),
            *session.posargs,
            env=env,
            stdout=log,
        )
    except CommandFailed:
        session.warn(f"the end of {log.relative_to(ROOT)}:\n" + "".join(log.open().readlines()[-40:]))
        raise


@nox.session(allow_parallel=True)
def lint(session: nox.Session) -> None:
    """ruff and mypy, in the newest Airflow's environment (mypy reads Airflow's types)."""
    bin_dir = airflow_venv(session, NEWEST)
    session.run(str(bin_dir / "ruff"), "check", ".", external=True)
    session.run(str(bin_dir / "mypy"), external=True)


@nox.session(allow_parallel=True)
def breeze_overrides(session: nox.Session) -> None:
    """The Breeze checksum override's tests: plain pytest, no Airflow database."""
    run_pytest(session, NEWEST, cell_name("breeze_overrides", {}), {}, "breeze_overrides/tests")


@nox.session(allow_parallel=True)
def package(session: nox.Session) -> None:
    """The wheel and sdist build, pass ``twine check --strict`` and carry what they promise."""
    import tarfile
    import zipfile

    from uv import find_uv_bin

    dist = RESULTS / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    session.run(find_uv_bin(), "build", "--quiet", "--out-dir", str(dist), str(ROOT), external=True)
    wheel, sdist = next(dist.glob("*.whl")), next(dist.glob("*.tar.gz"))
    session.run(
        *(find_uv_bin(), "tool", "run", "--from", f"twine=={TWINE}", "twine", "check", "--strict"),
        *(str(wheel), str(sdist)),
        external=True,
    )
    in_wheel = set(zipfile.ZipFile(wheel).namelist())
    with tarfile.open(sdist) as tar:
        in_sdist = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    missing = [f"wheel: {name}" for name in WHEEL_MUST_HOLD if not any(n.endswith(name) for n in in_wheel)]
    missing += [f"sdist: {name}" for name in SDIST_MUST_HOLD if name not in in_sdist]
    missing += [
        f"wheel must not hold {name}"
        for name in WHEEL_MUST_NOT_HOLD
        if any(n.startswith(name) for n in in_wheel)
    ]
    if missing:
        session.error("the distributions differ from what they promise: " + ", ".join(missing))
    # The sdist's own tests, from the unpacked sdist (the package too: PYTHONPATH comes first), so a file
    # they need but MANIFEST.in leaves out fails here. The fast modules; the matrix runs them all.
    unpacked = dist / "sdist"
    with tarfile.open(sdist) as tar:
        tar.extractall(unpacked, filter="data")
    (source,) = unpacked.iterdir()
    run_pytest(
        session,
        NEWEST,
        "package-sdist-tests",
        {"PYTHONPATH": str(source)},
        *(str(source / "tests" / name) for name in SDIST_TESTS),
    )


def project_wheel(session: nox.Session) -> Path:
    """The package's wheel, built once for the sources as they are (the first session builds, the others
    wait on the lock): building it inside each pip run would repeat the same isolated build per release."""
    from uv import find_uv_bin

    sources = [
        ROOT / "pyproject.toml",
        *sorted(ROOT.glob("airflow_heartbeat_fix/**/*.py")),
        *sorted(ROOT.glob("dags/*.py")),
    ]
    sources = [path for path in sources if path.name != "_version.py"]  # written by every build
    tag = hashlib.sha256(b"".join(path.read_bytes() for path in sources)).hexdigest()[:12]
    out = RESULTS / "wheel" / tag
    with _locked(RESULTS / "wheel" / ".lock"):
        if not any(out.glob("*.whl")):
            shutil.rmtree(out, ignore_errors=True)
            session.run(
                find_uv_bin(), "build", "--wheel", "--quiet", "--out-dir", str(out), str(ROOT), external=True
            )
    return next(out.glob("*.whl"))


#: The README's install block: every line CI runs, next to each Airflow 3 release and next to Airflow 2.
README_INSTALL = re.compile(r"<!-- install:start -->(.*?)<!-- install:end -->", re.DOTALL)


def readme_install_lines() -> tuple[list[str], list[str]]:
    """The README's install block: the shell variables it sets, and each ``pip install`` command (a
    Dockerfile ``RUN`` as its command)."""
    found = README_INSTALL.search((ROOT / "README.md").read_text(encoding="utf-8"))
    if found is None:
        raise RuntimeError("README.md has no <!-- install:start --> ... <!-- install:end --> block")
    variables, commands = [], []
    for line in (line.strip().removeprefix("RUN ") for line in found.group(1).splitlines()):
        if line.startswith("pip install"):
            commands.append(line)
        elif re.match(r"^[A-Z_]+=", line):
            variables.append(line)
    return variables, commands


def readme_install_plans(
    session: nox.Session, bin_dir: Path, wheel: Path, out: Path, *, airflow: str, constraints: Path
) -> list[tuple[str, int, set[str]]]:
    """
    Each README install line as pip runs it in ``bin_dir``'s environment (``python`` first on PATH, the
    official image's ``AIRFLOW_VERSION``), of the wheel, ``--dry-run``: as written (``constraints.txt``
    being ``constraints``) and, for a line without a constraints file, with it too. ``(the line, pip's
    exit code, what it would install)``.
    """
    variables, commands = readme_install_lines()
    out.mkdir(parents=True, exist_ok=True)
    dry_run = f"python -m pip install --disable-pip-version-check --dry-run --report REPORT {wheel}"
    variants = []
    for command in commands:
        command = re.sub(r"^pip install (--no-cache-dir )?airflow-heartbeat-fix", dry_run, command)
        with_file = command.replace("-c constraints.txt", f"-c {constraints}")
        variants.append(with_file)
        if with_file == command:  # no constraints file in the line: also with the environment's
            variants.append(f"{command} -c {constraints}")
        else:
            variants.append(command.replace(" -c constraints.txt", ""))
    plans = []
    for number, command in enumerate(variants):
        report = out / f"readme-line-{number}.json"
        report.unlink(missing_ok=True)
        script = "\n".join([*variables, command.replace("REPORT", str(report))])
        code = subprocess.run(
            ["bash", "-c", script],
            env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "AIRFLOW_VERSION": airflow},
            capture_output=True,
            text=True,
        ).returncode
        planned = set()
        if code == 0 and report.exists():
            planned = {item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]}
        plans.append((command.replace(f" --report REPORT {wheel}", " <wheel>"), code, planned))
    return plans


@nox.session(allow_parallel=True)
@nox.parametrize("airflow", AIRFLOW_VERSIONS)
def install_check(session: nox.Session, airflow: str) -> None:
    """``pip install`` of the package next to this Airflow never changes the Airflow that is installed.

    pip, not uv, because that is what operators run, and of the wheel, which is what they install (one
    build for every release, :func:`project_wheel`); ``--dry-run --report`` lists what pip would change
    in the environment built with this release's constraints. ``status -o json`` is recorded beside it
    (``status-<airflow>.json``), and the parity session checks each fix's state against [bugs].
    The ``[celery]`` extra may add the Celery provider, and no other Airflow package (checked where the
    release's constraints pin that provider: the releases the Celery topology runs on).
    """
    bin_dir = airflow_venv(session, airflow)
    wheel = project_wheel(session)
    out = RESULTS / f"install-{airflow}"
    for line, code, planned in readme_install_plans(
        session, bin_dir, wheel, out, airflow=airflow, constraints=CONSTRAINTS / f"airflow-{airflow}.txt"
    ):
        if code != 0 or planned != {"airflow-heartbeat-fix"}:
            session.error(
                f"Airflow {airflow}: the README's `{line}` would install {sorted(planned)} (exit {code})"
            )
    session.log(f"Airflow {airflow}: every README install line would install only airflow-heartbeat-fix")
    targets: list[tuple[str, set[str]]] = []
    if "apache-airflow-providers-celery==" in (CONSTRAINTS / f"airflow-{airflow}.txt").read_text():
        targets.append((f"{wheel}[celery]", {"apache-airflow-providers-celery"}))
    for target, allowed in targets:
        report = out / "celery.json"
        session.run(
            *(str(bin_dir / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"),
            *("--dry-run", "--report", str(report), target),
            external=True,
        )
        changed = [item["metadata"]["name"] for item in json.loads(report.read_text())["install"]]
        moved = [name for name in changed if name.lower().startswith("apache-airflow")]
        if moved := [name for name in moved if name.lower() not in allowed]:
            session.error(
                f"pip install {target} would change Airflow {airflow}'s packages: {', '.join(moved)}"
            )
        session.log(f"Airflow {airflow}: pip install {target} would install only {', '.join(changed)}")
    record_status(session, airflow, bin_dir)


def record_status(session: nox.Session, version: str, bin_dir: Path) -> None:
    """``status -o json`` in the environment of a release or dependency set: status-<version>.json."""
    home = RESULTS / "cells" / f"install-{version}"
    home.mkdir(parents=True, exist_ok=True)
    # stdout only: nox sends stderr to stdout by default, and Airflow 3.1/3.2 log to stderr here. The
    # default switch: what an installation reports (parity checks it against [bugs]).
    run_into(
        session,
        *(str(bin_dir / "airflow-heartbeat-fix"), "status", "-o", "json"),
        env=isolated_airflow_env(home, AIRFLOW__HEARTBEAT_FIX__ENABLED=None, **WRITE_BYTECODE),
        stdout=RESULTS / f"status-{version}.json",
        stderr=home / "status.stderr",
    )
    session.log(f"Airflow {version}: status recorded")


@nox.session(allow_parallel=True)
@nox.parametrize(("airflow", "db", "mode"), CELLS)
def tests(session: nox.Session, airflow: str, db: str, mode: str) -> None:
    """tests/ on an empty database; stock: the fix off, each needed fix's tests a strict xfail."""
    run_suite(session, airflow, db, mode, cell_name("tests", {"airflow": airflow, "db": db, "mode": mode}))


def run_suite(session: nox.Session, airflow: str, db: str, mode: str, cell: str, **env: str | None) -> None:
    """tests/ of ``airflow`` (a release or a dependency set) in one db x mode, into ``cell``."""
    env["AIRFLOW__HEARTBEAT_FIX__ENABLED"] = str(mode == "fixed")
    if db == "postgres":
        env["HEARTBEAT_FIX_TEST_DB_URL"] = postgres_database(session, cell, version=airflow)
    # Tests that set the switch themselves would repeat the fixed cell's run exactly.
    select = "not e2e" if mode == "fixed" else "not e2e and not mode_independent"
    run_pytest(session, airflow, cell, env, "-m", select, *test_paths(airflow, env))


def test_paths(airflow: str, env: dict[str, str | None]) -> list[str]:
    """``tests``, or for a sweep cell only the modules its tests are in (collecting the rest costs time)."""
    if airflow not in SWEEP or env.get("HEARTBEAT_FIX_SWEEP") == "full":
        return ["tests"]
    return sorted({node.split("::", 1)[0] for node in EXPECTATIONS.swept_nodes()})


@nox.session(default=False, allow_parallel=True)
@nox.parametrize(("airflow", "mode"), list(itertools.product(SWEEP, MODES)))
def sweep_full(session: nox.Session, airflow: str, mode: str) -> None:
    """On demand: the whole suite on a sweep release (its databases), as its line's newest patch runs it."""
    for db in SWEEP_DBS:
        cell = cell_name("sweep_full", {"airflow": airflow, "db": db, "mode": mode})
        run_suite(session, airflow, db, mode, cell, HEARTBEAT_FIX_SWEEP="full")


@nox.session(allow_parallel=True)
@nox.parametrize(("dependencies", "mode"), list(itertools.product(DEPENDENCY_SETS, MODES)))
def tests_dependency_set(session: nox.Session, dependencies: str, mode: str) -> None:
    """tests/ of a release on another dependency set (see DEPENDENCY_SETS), on PostgreSQL."""
    cell = cell_name("tests", {"airflow": dependencies, "db": "postgres", "mode": mode})
    # The whole suite, also for a sweep release's set (its line's newest patch runs all of it too).
    run_suite(session, dependencies, "postgres", mode, cell, HEARTBEAT_FIX_SWEEP="full")
    if mode == "fixed":
        record_status(session, dependencies, airflow_venv(session, dependencies))


#: The orphan-adoption tests with the real KubernetesExecutor of cncf-kubernetes 10.17.x (the ``kubernetes``
#: extra, pinned in these releases' constraints), its Kubernetes API replaced: one release per backend.
KUBERNETES_CELLS = [(NEWEST, "postgres", mode) for mode in MODES]
KUBERNETES_CELLS += [("3.3.2", "sqlite", mode) for mode in MODES]


@nox.session(allow_parallel=True)
@nox.parametrize(("airflow", "db", "mode"), KUBERNETES_CELLS)
def tests_kubernetes(session: nox.Session, airflow: str, db: str, mode: str) -> None:
    """tests/unit/jobs/test_heartbeat_fix_adoption.py with the provider installed (its real-executor case)."""
    env: dict[str, str | None] = {"AIRFLOW__HEARTBEAT_FIX__ENABLED": str(mode == "fixed")}
    if db == "postgres":
        env["HEARTBEAT_FIX_TEST_DB_URL"] = postgres_database(
            session, f"k8s_{airflow}_{mode}", version=airflow
        )
    cell = cell_name("kubernetes", {"airflow": airflow, "db": db, "mode": mode})
    module = "tests/unit/jobs/test_heartbeat_fix_adoption.py"
    run_pytest(session, airflow, cell, env, "-m", "not e2e", module, extra="kubernetes")


#: The nested-session tests again, with create_session wrapped by a tracing wrapper installed after
#: activation (as an instrumentation library would): every case must still pass, on SQLAlchemy 1.4 and 2.x.
WRAPPED_CREATE_SESSION_CELLS = [("3.3.2", "postgres"), ("3.0.6", "sqlite")]
NESTED_SESSION_TESTS = (
    "tests/unit/jobs/test_heartbeat_fix_nested_sessions.py",
    "tests/test_nested_sessions.py",
    "tests/test_listener_delivery.py",
)


@nox.session(allow_parallel=True)
@nox.parametrize(("airflow", "db"), WRAPPED_CREATE_SESSION_CELLS)
def tests_wrapped_create_session(session: nox.Session, airflow: str, db: str) -> None:
    """The nested-session tests (in-process) through a create_session wrapper installed after activation."""
    cell = cell_name("wrapped", {"airflow": airflow, "db": db, "mode": "fixed"})
    env: dict[str, str | None] = {
        "AIRFLOW__HEARTBEAT_FIX__ENABLED": "True",
        "HEARTBEAT_FIX_TEST_CREATE_SESSION": "wrapped",
    }
    if db == "postgres":
        env["HEARTBEAT_FIX_TEST_DB_URL"] = postgres_database(session, cell, version=airflow)
    run_pytest(
        session, airflow, cell, env, "-m", "not e2e", "-k", "not TestRealScheduler", *NESTED_SESSION_TESTS
    )


@nox.session(allow_parallel=True)
@nox.parametrize("airflow", BENCH_SMOKE)
def bench_smoke(session: nox.Session, airflow: str) -> None:
    """The purge benchmark at N = 20: fails only if the fixed purge leaves a try unconverged or doubled."""
    bin_dir = airflow_venv(session, airflow)
    home = RESULTS / "cells" / f"bench-{airflow}"
    home.mkdir(parents=True, exist_ok=True)
    run_into(
        session,
        *(str(bin_dir / "python"), "-m", "benchmarks.purge_cost", "--smoke", "--db", "sqlite"),
        *("--db-url", f"sqlite:///{home}/bench.db"),
        env=isolated_airflow_env(home),
        stdout=RESULTS / f"bench-{airflow}.log",
    )


@nox.session(default=False)
def bench(session: nox.Session) -> None:
    """``python -m benchmarks.purge_cost ARGS`` across releases, e.g. ``-- --airflow 3.3.2,3.4.0b2``."""
    for version in AIRFLOW_VERSIONS:
        if any(version in arg for arg in session.posargs):
            airflow_venv(session, version)
    session.run(sys.executable, "-m", "benchmarks.purge_cost", *session.posargs, external=True)


@nox.session(default=False)
def bench_kill_to_retry(session: nox.Session) -> None:
    """
    ``python -m benchmarks.kill_to_retry ARGS``: a SIGKILLed worker's time to its retry, stock vs fixed, on
    real components (``-- --airflow 3.3.2,3.4.0b2 --executor local,celery --output FILE``; the defaults).
    Builds each release's environment (and its ``-celery`` one) first; the driver runs in the newest's.
    """
    args = list(session.posargs)

    def option(name: str, default: str) -> list[str]:
        value = next((args[i + 1] for i, arg in enumerate(args[:-1]) if arg == name), default)
        return value.split(",")

    for version in option("--airflow", "3.3.2,3.4.0b2"):
        for executor in option("--executor", "local,celery"):
            airflow_venv(session, version, "celery" if executor == "celery" else None)
    driver = airflow_venv(session, NEWEST) / "python"
    session.run(str(driver), "-m", "benchmarks.kill_to_retry", *args, external=True)


@nox.session
@nox.parametrize(("airflow", "db"), E2E_CELLS)
def e2e(session: nox.Session, airflow: str, db: str) -> None:
    """The demo end to end, alone: its real scheduler's heartbeat timing needs the CPU."""
    env: dict[str, str | None] = {}
    if db == "postgres":
        env["HEARTBEAT_FIX_DEMO_DATABASE"] = postgres_database(session, f"demo_{airflow}")
    run_pytest(session, airflow, cell_name("e2e", {"airflow": airflow, "db": db}), env, "-m", "e2e", "tests")


def run_celery_demo_tests(session: nox.Session, airflow: str, scenario: str) -> None:
    """tests/e2e on the demo's ``--executor celery --schedulers 2`` (PostgreSQL, Redis) in one scenario."""
    env: dict[str, str | None] = {
        "HEARTBEAT_FIX_DEMO_DATABASE": postgres_database(session, f"celery_{scenario}_{airflow}"),
        "HEARTBEAT_FIX_DEMO_BROKER_URL": redis(session),
        "HEARTBEAT_FIX_DEMO_SCENARIO": scenario,
    }
    cell = cell_name("e2e_celery", {"airflow": airflow, "scenario": scenario})
    run_pytest(session, airflow, cell, env, "-m", "e2e", "tests/e2e", extra="celery")


@nox.session
@nox.parametrize(("airflow", "scenario"), E2E_CELERY_CELLS)
def e2e_celery(session: nox.Session, airflow: str, scenario: str) -> None:
    """The Celery topology end to end, alone (six Airflow processes need the CPU): CI's pairs."""
    run_celery_demo_tests(session, airflow, scenario)


@nox.session(default=False)
@nox.parametrize("airflow", E2E_CELERY_VERSIONS)
@nox.parametrize("scenario", CELERY_SCENARIOS)
def e2e_celery_all(session: nox.Session, airflow: str, scenario: str) -> None:
    """Every scenario on every Celery release (not in CI: about 5 minutes each, redelivery about 10)."""
    run_celery_demo_tests(session, airflow, scenario)


@nox.session
def parity(session: nox.Session) -> None:
    """Every mirrored test in every cell of test-results/ against parity/expectations.toml."""
    bin_dir = airflow_venv(session, NEWEST)
    session.run(str(bin_dir / "python"), "-m", "parity", "--results", str(RESULTS), external=True)


@nox.session(default=False)
def demo(session: nox.Session) -> None:
    """``airflow-heartbeat-fix demo ARGS``; ``--airflow V`` (default :data:`DEMO_DEFAULT`) picks the Airflow.

    ``--executor celery`` runs in ``.venvs/airflow-<V>-celery``, with the local Redis as broker and, unless
    ``--database`` names one, a fresh local PostgreSQL database (Celery cannot use SQLite).
    """
    args, version = list(session.posargs), None
    for at, arg in enumerate(args):
        if arg.startswith("--airflow"):
            version = arg.partition("=")[2] or (args.pop(at + 1) if at + 1 < len(args) else "")
            del args[at]
            break
    if version is None:
        version = DEMO_DEFAULT
        beta = f"--airflow {NEWEST} for the pre-release's; " if NEWEST != DEMO_DEFAULT else ""
        session.log(
            f"Airflow {version}: the newest stable release the suite runs, whose bug is the one most "
            f"deployments have ({beta}--airflow V for any of {', '.join(FULL)})"
        )
    if version not in AIRFLOW_VERSIONS:
        session.error(f"--airflow {version!r}: the demo runs on {', '.join(AIRFLOW_VERSIONS)}")
    if any(arg.startswith(("--database=postgres", "postgres")) for arg in args):
        postgres(session, "start")
    celery = "--executor celery" in " ".join(args) or "--executor=celery" in args
    if celery and not any(arg.startswith("--broker-url") for arg in args):
        args += ["--broker-url", redis(session)]
    if celery and not any(arg.startswith("--database") for arg in args):
        args += ["--database", postgres_database(session, f"demo_celery_{version}")]
    bin_dir = airflow_venv(session, version, "celery" if celery else None)
    session.run(str(bin_dir / "airflow-heartbeat-fix"), "demo", *args, external=True)


#: How the last line counts each junit outcome (parity's reading of a test case): an error is a failure.
_SUMMARY_KIND = {
    Outcome.PASSED: "passed",
    Outcome.FAILED: "failed",
    Outcome.ERROR: "failed",
    Outcome.XFAILED: "xfailed",
    Outcome.SKIPPED: "skipped",
}


def summary(results: Path, report: Path) -> int:
    """Prints each cell's counts and, last, ``N passed, M failed``; returns the exit status.

    A failed session whose junit shows no failing test (lint, a crash, no tests, no report) counts once.
    """
    passed, failed, failing_cells = 0, 0, set()
    for xml in sorted(results.glob("*.xml")):
        counts = dict.fromkeys(("passed", "failed", "xfailed", "skipped"), 0)
        for case in ET.parse(xml).getroot().iter("testcase"):
            counts[_SUMMARY_KIND[actual_outcome(case).outcome]] += 1
        print(f"{xml.stem:26}" + (", ".join(f"{n} {kind}" for kind, n in counts.items() if n) or "no tests"))
        passed, failed = passed + counts["passed"], failed + counts["failed"]
        failing_cells |= {xml.stem} if counts["failed"] else set()
    sessions: list[dict[str, Any]] = json.loads(report.read_text())["sessions"] if report.exists() else []
    sessions = sessions or [{"name": "nox", "result": "no report"}]
    for bad in (s for s in sessions if s.get("result") != "success"):
        print(f"session failed: {(bad.get('signatures') or [bad['name']])[0]}")
        failed += cell_name(bad["name"], bad.get("args", {})) not in failing_cells
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


#: The newest Airflow 2: what ``pip install`` of this package does there, and what the package says.
AIRFLOW_2 = "2.11.2"


@nox.session(allow_parallel=True)
def install_check_airflow2(session: nox.Session) -> None:
    """In an Airflow 2 environment (no ``apache-airflow-core``): pip's plan, the README's lines, the refusal.

    Unpinned, pip would install Airflow 3's core over Airflow 2's files; every README install line, with
    and without Airflow 2's constraints file, makes pip refuse or plan nothing of Airflow, and ``airflow
    version`` still says 2.11.2; installed anyway (``--no-deps``), status, the scheduler and the demo each
    say in one line that nothing is patched.
    """
    from uv import find_uv_bin

    uv, env = find_uv_bin(), ROOT / ".venvs" / f"airflow-{AIRFLOW_2}"
    python, out = env / "bin" / "python", RESULTS / "install-check-airflow2"
    constraints = ROOT / "constraints" / f"airflow-{AIRFLOW_2}.txt"
    with _locked(env.parent / f".{env.name}.lock"):
        if not python.exists():
            session.run(uv, "venv", "--quiet", "--seed", "--python", sys.executable, str(env), external=True)
        session.run(
            *(uv, "pip", "install", "--quiet", "--python", str(python), f"apache-airflow=={AIRFLOW_2}"),
            *("-c", str(constraints)),
            env={"UV_PYTHON_DOWNLOADS": "never"},
            external=True,
        )
    shutil.rmtree(out, ignore_errors=True)
    wheel = project_wheel(session)
    pip = (str(python), "-m", "pip", "--disable-pip-version-check")
    session.run(*pip, "uninstall", "--quiet", "--yes", "airflow-heartbeat-fix", external=True)
    report = out / "unpinned.json"
    out.mkdir(parents=True)
    session.run(*pip, "install", "--quiet", "--dry-run", "--report", str(report), str(wheel), external=True)
    planned = {item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]}
    if "apache-airflow-core" not in planned:
        session.error(f"unpinned pip install no longer plans apache-airflow-core (README): {sorted(planned)}")
    session.log(f"Airflow {AIRFLOW_2}, unpinned: pip would install {', '.join(sorted(planned))}")
    # Every README install line, with and without Airflow 2's constraints file: pip refuses, or plans
    # nothing of Airflow (the pin cannot be formed there, or names a core release that does not exist).
    plans = readme_install_plans(session, env / "bin", wheel, out, airflow=AIRFLOW_2, constraints=constraints)
    for line, code, planned in plans:
        if code == 0 and any(name.startswith("apache-airflow") for name in planned):
            session.error(f"Airflow {AIRFLOW_2}: the README's `{line}` would install {sorted(planned)}")
    refused = sum(code != 0 for _, code, _ in plans)
    session.log(
        f"Airflow {AIRFLOW_2}: {refused} of {len(plans)} README install lines refused, none plans Airflow"
    )
    version = session.run(str(env / "bin" / "airflow"), "version", silent=True, external=True)
    if str(version).strip().splitlines()[-1] != AIRFLOW_2:
        session.error(f"airflow version after the README's lines: {version}")
    session.run(*pip, "install", "--quiet", "--no-deps", str(wheel), external=True)
    home = out / "home"
    env_vars = isolated_airflow_env(
        home,
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__HEARTBEAT_FIX__ENABLED=None,
        XDG_CACHE_HOME=str(out / "cache"),
    )
    cli = str(env / "bin" / "airflow-heartbeat-fix")
    run_into(
        session,
        *(cli, "status", "-o", "json"),
        env=env_vars,
        stdout=out / "status.json",
        stderr=out / "status.stderr",
        success_codes=[1],
    )
    document = json.loads((out / "status.json").read_text())
    if document["ok"] or {row["state"] for row in document["fixes"]} != {"unsupported"}:
        session.error(f"status on Airflow {AIRFLOW_2}: {document}")
    session.run(str(env / "bin" / "airflow"), "db", "migrate", env=env_vars, silent=True, external=True)
    logs = str(
        session.run(
            *(str(env / "bin" / "airflow"), "scheduler", "--num-runs", "1"),
            env=env_vars,
            silent=True,
            external=True,
        )
    )
    ours = [line for line in logs.splitlines() if "airflow-heartbeat-fix" in line]
    if len(ours) != 1 or document["refusal"] not in ours[0] or "Traceback" in logs:
        session.error(f"airflow scheduler on Airflow {AIRFLOW_2} logged: {ours or logs[-2000:]}")
    demo = session.run(cli, "demo", env=env_vars, success_codes=[2], silent=True, external=True)
    if str(demo).strip().splitlines()[-1] != f"demo: {document['refusal']}; the demo would show nothing":
        session.error(f"demo on Airflow {AIRFLOW_2}: {demo}")
    session.log(f"Airflow {AIRFLOW_2}: status, the scheduler and the demo each said: {document['refusal']}")


if __name__ == "__main__":
    # scripts/test.sh runs this after nox, for CI's last line.
    sys.exit(summary(RESULTS, RESULTS / "nox-report.json"))
