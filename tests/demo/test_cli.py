"""``airflow-heartbeat-fix demo``: options, every check before anything starts, and its outputs."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from airflow_heartbeat_fix.demo import cli, config, database, result
from parity.expectations import load
from tests.demo._results import CB, DUPLICATES_NEEDS, ROOT, converged_result, recorded_results

if TYPE_CHECKING:
    from airflow_heartbeat_fix.demo.result import RunResult


def test_setup_failure_exits_3_and_stops_everything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = tmp_path / "airflow"
    fake.write_text("#!/bin/sh\necho migrate failed on purpose\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(cli, "airflow_executable", lambda: fake)
    monkeypatch.setattr(cli, "probe_features", lambda config: {})
    home = tmp_path / "home"
    assert cli.main(["--home", str(home), "--runs", "stock"]) == cli.EXIT_ENVIRONMENT
    err = capsys.readouterr().err
    assert "airflow db migrate failed" in err
    assert "migrate failed on purpose" in (home / "stock" / "logs" / "db-migrate.log").read_text()
    assert list((home / "template").iterdir()) == []  # no half-migrated template is kept


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--runs", "stock,broken"], "--runs takes"),
        (["--reset-database"], "--reset-database needs --database"),
        (["--dags", "/nonexistent"], "--dags /nonexistent lacks"),
        (["--executor", "celery", "--broker-url", "redis://h/0"], "CeleryExecutor cannot use SQLite"),
        (["--schedulers", "2"], "SQLite allows only one scheduler"),
        (["--broker-url", "redis://h/0"], "--broker-url is for --executor celery"),
    ],
)
def test_bad_arguments_exit_2_before_starting_anything(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(argv) == cli.EXIT_USAGE
    assert message in capsys.readouterr().err


def test_to_json_round_trips(tmp_path: Path) -> None:
    demo_config = config.DemoConfig(
        home=tmp_path,
        database=None,
        dags_origin="dags",
        dag_sources={},
        airflow_bin=Path("airflow"),
        airflow_version="3.4.0b2",
        heartbeat_timeout=10,
        detection_interval=2,
        timeout=120,
        settle=8,
        runs=("fixed",),
        json_path=None,
    )
    data = json.loads(json.dumps(cli.to_json(demo_config, [converged_result()], ok=True)))
    assert result.run_from_json(data["runs"]["fixed"]) == converged_result()
    fixed = data["runs"]["fixed"]
    assert data["ok"] is True and data["database"] == "sqlite"
    assert fixed["dags"][CB]["callbacks"] == {"1": {"on_retry_callback": 1}, "2": {"on_failure_callback": 1}}
    assert fixed["dags"][CB]["tries"][0]["archived_reason"] == "retry"


@pytest.fixture
def nothing_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Should a check let the demo through, fail at once instead of starting Airflow for minutes."""

    def refuse(demo_config: config.DemoConfig) -> dict[str, object]:
        raise AssertionError("the demo got past its checks and was about to start Airflow")

    monkeypatch.setattr(cli, "probe_features", refuse)


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert "Traceback" not in captured.err and captured.out == ""
    return lines[0]


def test_demo_refuses_a_database_with_tables_it_did_not_create(
    tmp_path: Path, nothing_starts: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """The suite's own metadata database (migrated at session start) must come out of it untouched."""
    from airflow.configuration import conf

    url = conf.get("database", "sql_alchemy_conn")
    before = database.database_tables(url)
    assert "alembic_version" in before

    code = cli.main(["--home", str(tmp_path / "home"), "--database", url])

    line = _one_line(capsys)
    assert code == cli.EXIT_USAGE
    assert f"already has {len(before)} tables" in line
    assert "airflow db reset" in line and "--reset-database" in line
    assert database.database_tables(url) == before


def test_reset_database_says_what_it_will_drop_before_it_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from airflow.configuration import conf

    class Started(Exception):
        pass

    def started(demo_config: config.DemoConfig) -> dict[str, object]:
        raise Started

    monkeypatch.setattr(cli, "probe_features", started)
    url = conf.get("database", "sql_alchemy_conn")
    tables = database.database_tables(url)

    with pytest.raises(Started):
        cli.main(["--home", str(tmp_path / "home"), "--database", url, "--reset-database"])

    assert capsys.readouterr().err.splitlines()[0] == (
        "demo: --reset-database: airflow db reset drops the Airflow tables of "
        f"{database.display_url(url)} ({len(tables)} tables)"
    )
    assert database.database_tables(url) == tables


@pytest.mark.parametrize(
    ("database", "code", "message"),
    [
        pytest.param("not a url", cli.EXIT_USAGE, "--database 'not a url': Could not parse", id="not-a-url"),
        pytest.param("nosuch://h/x", cli.EXIT_USAGE, "--database 'nosuch://h/x': Can't load", id="dialect"),
        pytest.param("sqlite:////nonexistent/x.db", cli.EXIT_ENVIRONMENT,
                     "cannot connect to sqlite:////nonexistent/x.db: (sqlite3.OperationalError) unable",
                     id="unreachable"),
    ],
)  # fmt: skip
def test_unusable_database_url_is_one_line(
    database: str,
    code: int,
    message: str,
    tmp_path: Path,
    nothing_starts: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["--home", str(tmp_path / "home"), "--database", database]) == code
    assert _one_line(capsys).startswith(f"demo: {message}")


def test_database_refusal_allows_empty_own_or_explicitly_reset_databases() -> None:
    url = "postgresql://h/db"
    assert cli.database_refusal([], url, reset_allowed=False) is None
    assert cli.database_refusal(["dag", database.DEMO_TABLE], url, reset_allowed=False) is None
    assert cli.database_refusal(["dag"], url, reset_allowed=True) is None
    refusal = cli.database_refusal(
        [f"t{i}" for i in range(7)], "postgresql://u:secret@h/db", reset_allowed=False
    )
    assert refusal is not None and "7 tables (t0, t1, t2, t3, t4, ...)" in refusal
    assert "secret" not in refusal and refusal.startswith("postgresql://u:***@h/db already has")


def test_demo_refuses_its_own_database_once_it_holds_someone_elses_data(
    tmp_path: Path, nothing_starts: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """A database the demo once marked, then used for real work: the demo must not reset it silently."""
    import sqlite3

    path = tmp_path / "was-demo.db"
    url = f"sqlite:///{path}"
    database.mark_database_as_demo(url)
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.execute("CREATE TABLE dag (dag_id VARCHAR(250))")
        db.execute("CREATE TABLE variable (key VARCHAR(250))")
        db.executemany("INSERT INTO dag VALUES (?)", [(result.CALLBACK_DAG_ID,), ("payroll",)])
        db.execute("INSERT INTO variable VALUES ('api_key')")
    assert database.foreign_data(url, database.database_tables(url)) == ["Dags payroll", "1 variables"]

    code = cli.main(["--home", str(tmp_path / "home"), "--database", url])

    line = _one_line(capsys)
    assert code == cli.EXIT_USAGE
    assert "was a demo database but now holds data the demo did not write (Dags payroll; 1 variables)" in line
    with contextlib.closing(sqlite3.connect(path)) as db:
        assert db.execute("SELECT key FROM variable").fetchall() == [("api_key",)]


def test_second_demo_in_the_same_home_is_refused(
    tmp_path: Path, nothing_starts: None, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    holder = textwrap.dedent(
        f"""
        import fcntl, sys, time
        lock = open({str(home / cli.LOCK_NAME)!r}, "a+")
        fcntl.flock(lock, fcntl.LOCK_EX)
        lock.write("4242\\n"); lock.flush()
        print("locked", flush=True)
        time.sleep(60)
        """
    )
    other = subprocess.Popen([sys.executable, "-c", holder], stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout is not None and other.stdout.readline().strip() == "locked"
        code = cli.main(["--home", str(home)])
    finally:
        other.kill()
        other.wait()
    line = _one_line(capsys)
    assert code == cli.EXIT_USAGE
    assert line == f"demo: another demo is running in {home} (pid 4242); wait for it or pass another --home"


def test_home_lock_is_released_when_the_demo_ends(tmp_path: Path) -> None:
    with (
        cli.home_lock(tmp_path),
        pytest.raises(config.UsageError, match="another demo is running"),
        cli.home_lock(tmp_path),
    ):
        pass
    with cli.home_lock(tmp_path):
        pass


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(["--home", "{file}/h"], "cannot use --home {file}/h: Not a dir", id="home-in-file"),
        pytest.param(["--home", "{foreign}"], "--home {foreign} holds files", id="foreign-home"),
        pytest.param(["--json", "{file}/o.json"], "cannot write --json {file}/o.json", id="json-in-file"),
        pytest.param(["--json", "{tmp}"], "--json {tmp} is a directory", id="json-is-dir"),
        pytest.param(["--html", "{file}/r.html"], "cannot write --html {file}/r.html", id="html-in-file"),
    ],
)  # fmt: skip
def test_unusable_paths_exit_2_with_one_line(
    argv: list[str], message: str, tmp_path: Path, nothing_starts: None, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("not a directory\n")
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("mine\n")
    names = {"file": tmp_path / "file", "foreign": tmp_path / "foreign", "tmp": tmp_path}
    argv = [a.format(**names) for a in argv]
    if "--home" not in argv:
        argv += ["--home", str(tmp_path / "home")]

    code = cli.main(argv)

    line = _one_line(capsys)
    assert code == cli.EXIT_USAGE
    assert line.startswith("demo: " + message.format(**names)), line
    assert (tmp_path / "foreign" / "notes.txt").read_text() == "mine\n"


def test_demo_script_help_builds_nothing_and_names_airflow(tmp_path: Path) -> None:
    """``bash scripts/demo.sh --help`` in a fresh clone: the help at once, no environment built first."""
    script = ROOT / "scripts" / "demo.sh"
    clone = tmp_path / "clone"
    (clone / "scripts").mkdir(parents=True)
    (clone / "scripts" / "demo.sh").write_text(script.read_text())
    (clone / "parity").mkdir()
    (clone / "parity" / "expectations.toml").write_text((ROOT / "parity" / "expectations.toml").read_text())

    result = subprocess.run(
        ["bash", str(clone / "scripts" / "demo.sh"), "--help"], capture_output=True, text=True, timeout=20
    )

    assert result.returncode == 0, result.stderr
    assert "--airflow V" in result.stdout
    assert "about 2 minutes for the default" in " ".join(result.stdout.split())
    assert f"Default release today: {load().newest_stable}" in result.stdout
    assert sorted(clone.iterdir()) == [clone / "parity", clone / "scripts"]  # no .venvs: nothing installed


def test_help_lists_every_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["--help"])
    assert exited.value.code == 0
    epilog = capsys.readouterr().out.split("exit codes:\n", 1)[1]
    listed: dict[int, str] = {}
    for line in epilog.splitlines():  # "  2   refused before ...", wrapped lines indented by six
        if line[:2] == "  " and line[2:6].strip().isdigit():
            code = int(line[2:6])
            listed[code] = line[6:]
        else:
            listed[code] += " " + line.strip()
    assert listed == cli.EXIT_CODES


def test_demo_writes_the_html_report_and_prints_its_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    recorded = iter(recorded_results())

    class RecordedRun:
        def __init__(self, demo_config: config.DemoConfig, label: str, features: dict[str, object]) -> None:
            self.label = label

        def execute(self) -> RunResult:
            result = next(recorded)
            assert result.label == self.label
            return result

    monkeypatch.setattr(cli, "probe_features", lambda config: {})
    monkeypatch.setattr(cli, "DemoRun", RecordedRun)
    home = tmp_path / "home"

    assert cli.main(["--home", str(home), "--json", str(tmp_path / "r.json")]) == cli.EXIT_OK

    out = capsys.readouterr().out
    assert out.splitlines()[-1] == f"report: {home / 'report.html'}"
    assert "<svg" in (home / "report.html").read_text()
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["runs"]["stock"]["crashed_after"] == 21.0
    assert data["runs"]["fixed"]["marks"][0] == {
        "seconds": 17.0, "dag_id": CB, "try_number": 1, "kind": "on_retry_callback"
    }  # fmt: skip


def test_report_from_draws_a_recorded_result_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--report-from``: the text table, the HTML report and the JSON of an earlier ``--json``, no run."""
    from tests.demo._results import RECORDED

    html, json_out = tmp_path / "report.html", tmp_path / "again.json"
    code = cli.main(["--report-from", str(RECORDED), "--html", str(html), "--json", str(json_out)])

    recorded = json.loads(RECORDED.read_text(encoding="utf-8"))
    assert code == (cli.EXIT_OK if recorded["ok"] else cli.EXIT_NOT_CONVERGED)
    out = capsys.readouterr().out
    assert out.startswith("Airflow 3.3.2, sqlite") and f"report: {html}" in out
    assert "<html" in html.read_text(encoding="utf-8").lower()
    assert json.loads(json_out.read_text(encoding="utf-8")) == recorded


def test_report_from_a_file_that_is_no_result_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "other.json").write_text('{"something": "else"}', encoding="utf-8")
    assert cli.main(["--report-from", str(tmp_path / "other.json")]) == cli.EXIT_USAGE
    assert capsys.readouterr().err.count("\n") == 1


def test_demo_says_how_long_and_which_bug_before_the_runs_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    said_before_run: list[str] = []

    class NoRun:
        def __init__(self, demo_config: config.DemoConfig, label: str, features: dict[str, object]) -> None:
            said_before_run.append(capsys.readouterr().err)
            raise KeyboardInterrupt

    monkeypatch.setattr(cli, "probe_features", lambda config: {"needed_fixes": dict(DUPLICATES_NEEDS)})
    monkeypatch.setattr(cli, "DemoRun", NoRun)

    assert cli.main(["--home", str(tmp_path / "home")]) == cli.EXIT_INTERRUPTED

    lines = said_before_run[0].splitlines()
    assert lines[0].startswith("demo: Airflow ")
    assert (
        lines[1]
        == "demo: about 2 minutes (2 runs of about 65 s; at most about 5 minutes with --timeout 120 s)"
    )
    assert lines[2].startswith("demo: stock should show duplicate callbacks: ")
    assert lines[2].endswith("; fixed, one callback of the right kind per try")


def test_help_says_how_long_the_default_demo_takes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "takes about 2 minutes" in " ".join(capsys.readouterr().out.split())
