"""Regression tests for the Breeze provider-dependencies checksum override.

The tests run against a stand-in of Breeze's module layout built in ``tmp_path``:
``airflow_breeze/utils/provider_dependencies.py`` with the function names and signatures of the real
module (``get_provider_dependencies``, ``generate_provider_dependencies_if_needed``,
``regenerate_provider_dependencies_once``, ``_calculate_provider_deps_hash`` and the two path constants
imported from ``airflow_breeze.utils.path_utils``) and the behaviour of affected Breeze versions: on a
cache miss the checksum is written without a trailing newline, and before the regeneration runs.
``airflow_breeze/commands/main_command.py`` binds ``generate_provider_dependencies_if_needed`` by name,
as Breeze's real entry command does.

Set ``BREEZE_OVERRIDES_SKIP_APPLY=1`` to run the regression tests against the unpatched stand-in; the
cache-miss tests must then fail (see the README).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

from breeze_overrides import provider_dependencies_checksum as override

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path
    from types import ModuleType

SKIP_APPLY = os.environ.get("BREEZE_OVERRIDES_SKIP_APPLY") == "1"

PROVIDERS = {
    "amazon": ("[project]\nname = 'apache-airflow-providers-amazon'\n", "package-name: amazon\n"),
    "google": ("[project]\nname = 'apache-airflow-providers-google'\n", "package-name: google\n"),
}

# ---------------------------------------------------------------------------------------------------------
# The stand-in Breeze package
# ---------------------------------------------------------------------------------------------------------
_PATH_UTILS = """\
from __future__ import annotations

from pathlib import Path

AIRFLOW_ROOT_PATH = Path({root!r})
AIRFLOW_PROVIDERS_ROOT_PATH = AIRFLOW_ROOT_PATH / "providers"
PROVIDER_DEPENDENCIES_JSON_PATH = AIRFLOW_ROOT_PATH / "generated" / "provider_dependencies.json"
PROVIDER_DEPENDENCIES_JSON_HASH_PATH = (
    AIRFLOW_ROOT_PATH / "generated" / "provider_dependencies.json.sha256sum"
)
"""

# Behaves like the affected Breeze versions (unfixed cache-miss path), written for these tests.
_PROVIDER_DEPENDENCIES = """\
from __future__ import annotations

import hashlib
import json
from functools import cache
from pathlib import Path

from airflow_breeze.utils.path_utils import (
    AIRFLOW_PROVIDERS_ROOT_PATH,
    PROVIDER_DEPENDENCIES_JSON_HASH_PATH,
    PROVIDER_DEPENDENCIES_JSON_PATH,
)

REGENERATIONS: list[int] = []


def get_all_provider_pyproject_toml_provider_yaml_files():
    for provider_dir in sorted(p for p in AIRFLOW_PROVIDERS_ROOT_PATH.iterdir() if p.is_dir()):
        yield provider_dir / "pyproject.toml"
        yield provider_dir / "provider.yaml"


@cache
def regenerate_provider_dependencies_once() -> None:
    # Stands in for running scripts/ci/prek/update_providers_dependencies.py.
    REGENERATIONS.append(1)
    providers = sorted(p.name for p in AIRFLOW_PROVIDERS_ROOT_PATH.iterdir() if p.is_dir())
    data = {{name: {{"deps": [], "cross-providers-deps": [], "state": "ready"}} for name in providers}}
    PROVIDER_DEPENDENCIES_JSON_PATH.write_text(json.dumps(data, indent=2) + "\\n")


def _calculate_provider_deps_hash():
    digest = hashlib.sha256()
    for path in sorted(get_all_provider_pyproject_toml_provider_yaml_files()):
        digest.update(path.read_bytes())
    return digest.hexdigest()


@cache
def get_provider_dependencies() -> dict:
    if not PROVIDER_DEPENDENCIES_JSON_PATH.exists():
        calculated_hash = _calculate_provider_deps_hash()
        {hash_write}
        print("Regenerating provider dependencies file")
        regenerate_provider_dependencies_once()
    return json.loads(PROVIDER_DEPENDENCIES_JSON_PATH.read_text())


def generate_provider_dependencies_if_needed():
    if not PROVIDER_DEPENDENCIES_JSON_PATH.exists() or not PROVIDER_DEPENDENCIES_JSON_HASH_PATH.exists():
        get_provider_dependencies.cache_clear()
        get_provider_dependencies()
    else:
        calculated_hash = _calculate_provider_deps_hash()
        if calculated_hash.strip() != PROVIDER_DEPENDENCIES_JSON_HASH_PATH.read_text().strip():
            PROVIDER_DEPENDENCIES_JSON_PATH.unlink(missing_ok=True)
            get_provider_dependencies.cache_clear()
            get_provider_dependencies()
"""
_UNFIXED_HASH_WRITE = "PROVIDER_DEPENDENCIES_JSON_HASH_PATH.write_text(calculated_hash)"

_MAIN_COMMAND = """\
from __future__ import annotations

from airflow_breeze.utils.provider_dependencies import generate_provider_dependencies_if_needed


def main() -> None:
    generate_provider_dependencies_if_needed()
"""

_BREEZE = """\
from __future__ import annotations

import sys

from airflow_breeze.commands.main_command import main as _main_command

SEEN_ARGV: list[list[str]] = []


def main() -> None:
    SEEN_ARGV.append(list(sys.argv))
    _main_command()
    raise SystemExit(0)  # click's standalone mode always exits
"""


@dataclass
class FakeBreeze:
    root: Path
    module: ModuleType  # airflow_breeze.utils.provider_dependencies
    main_command: ModuleType
    json_path: Path
    hash_path: Path
    expected_hash: str

    @property
    def regenerations(self) -> int:
        return len(self.module.REGENERATIONS)

    def write_dependencies(self) -> None:
        self.json_path.write_text(json.dumps({"amazon": {"state": "old"}}) + "\n")


def _purge_breeze_modules() -> None:
    for name in [n for n in sys.modules if n == "airflow_breeze" or n.startswith("airflow_breeze.")]:
        del sys.modules[name]


def _build_tree(tmp_path: Path, *, omit_function: str | None = None) -> tuple[Path, Path]:
    root = tmp_path / "airflow"
    for name, (pyproject, provider_yaml) in PROVIDERS.items():
        provider_dir = root / "providers" / name
        provider_dir.mkdir(parents=True)
        (provider_dir / "pyproject.toml").write_text(pyproject)
        (provider_dir / "provider.yaml").write_text(provider_yaml)
    (root / "generated").mkdir()

    src = tmp_path / "breeze_src"
    package = src / "airflow_breeze"
    (package / "utils").mkdir(parents=True)
    (package / "commands").mkdir()
    for init in (package, package / "utils", package / "commands"):
        (init / "__init__.py").write_text("")
    (package / "utils" / "path_utils.py").write_text(_PATH_UTILS.format(root=str(root)))
    source = _PROVIDER_DEPENDENCIES.format(hash_write=_UNFIXED_HASH_WRITE)
    if omit_function is not None:
        source = source.replace(f"def {omit_function}(", f"def _renamed_{omit_function}(")
    (package / "utils" / "provider_dependencies.py").write_text(source)
    (package / "commands" / "main_command.py").write_text(_MAIN_COMMAND)
    (package / "breeze.py").write_text(_BREEZE)
    return root, src


def _expected_hash(root: Path) -> str:
    digest = hashlib.sha256()
    files = [p for name in PROVIDERS for p in (root / "providers" / name).iterdir()]
    for path in sorted(files):
        digest.update(path.read_bytes())
    return digest.hexdigest()


@pytest.fixture
def breeze_src(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, Path]]:
    """The stand-in tree on sys.path, nothing imported, override not applied."""
    override.remove()
    _purge_breeze_modules()
    root, src = _build_tree(tmp_path)
    monkeypatch.syspath_prepend(str(src))
    yield root, src
    override.remove()
    _purge_breeze_modules()


@pytest.fixture
def breeze(breeze_src: tuple[Path, Path]) -> FakeBreeze:
    """The stand-in imported like Breeze does, with the override applied (unless SKIP_APPLY)."""
    root, _ = breeze_src
    main_command = importlib.import_module("airflow_breeze.commands.main_command")
    module = importlib.import_module("airflow_breeze.utils.provider_dependencies")
    if not SKIP_APPLY:
        assert override.apply() is True
    return FakeBreeze(
        root=root,
        module=module,
        main_command=main_command,
        json_path=module.PROVIDER_DEPENDENCIES_JSON_PATH,
        hash_path=module.PROVIDER_DEPENDENCIES_JSON_HASH_PATH,
        expected_hash=_expected_hash(root),
    )


def _assert_single_trailing_newline(data: bytes, expected_hash: str) -> None:
    assert data.endswith(b"\n")
    assert not data.endswith(b"\n\n")
    assert data.count(b"\n") == 1
    assert data == expected_hash.encode("ascii") + b"\n"


def test_stand_in_reproduces_the_unfixed_breeze_behaviour(
    breeze_src: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Self-check of the stand-in, independent of the override: unpatched, it shows both defects."""
    root, _ = breeze_src
    module = importlib.import_module("airflow_breeze.utils.provider_dependencies")
    hash_path = module.PROVIDER_DEPENDENCIES_JSON_HASH_PATH

    module.get_provider_dependencies()
    assert hash_path.read_bytes() == _expected_hash(root).encode("ascii")  # no trailing newline

    hash_path.unlink()
    module.PROVIDER_DEPENDENCIES_JSON_PATH.unlink()
    module.get_provider_dependencies.cache_clear()
    monkeypatch.setattr(module, "regenerate_provider_dependencies_once", _failing_regeneration)
    with pytest.raises(RegenerationFailed):
        module.get_provider_dependencies()
    assert hash_path.exists()  # written although the regeneration failed


# ---------------------------------------------------------------------------------------------------------
# Cache-miss path: the checksum ends with exactly one newline
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("dependencies_present", "checksum"),
    [
        pytest.param(False, None, id="dependencies-and-checksum-missing"),
        pytest.param(False, "current-without-newline", id="dependencies-missing"),
        pytest.param(True, None, id="checksum-missing"),
        pytest.param(True, "stale", id="checksum-stale"),
        pytest.param(True, "stale-without-newline", id="checksum-stale-old-format"),
    ],
)
def test_cache_miss_writes_checksum_with_single_trailing_newline(
    breeze: FakeBreeze, dependencies_present: bool, checksum: str | None
) -> None:
    if dependencies_present:
        breeze.write_dependencies()
    if checksum == "current-without-newline":
        breeze.hash_path.write_text(breeze.expected_hash)
    elif checksum == "stale":
        breeze.hash_path.write_text("0" * 64 + "\n")
    elif checksum == "stale-without-newline":
        breeze.hash_path.write_text("0" * 64)

    breeze.main_command.main()  # Breeze's entry command, which bound the function by name

    assert breeze.regenerations == 1
    _assert_single_trailing_newline(breeze.hash_path.read_bytes(), breeze.expected_hash)
    assert set(breeze.module.get_provider_dependencies()) == set(PROVIDERS)


def test_get_provider_dependencies_cache_miss_writes_checksum_with_newline(breeze: FakeBreeze) -> None:
    result = breeze.module.get_provider_dependencies()

    assert set(result) == set(PROVIDERS)
    _assert_single_trailing_newline(breeze.hash_path.read_bytes(), breeze.expected_hash)
    # still cached, and still clearable, like the original
    assert breeze.module.get_provider_dependencies() is result
    breeze.module.get_provider_dependencies.cache_clear()


def test_cache_miss_then_second_run_is_a_cache_hit(breeze: FakeBreeze) -> None:
    breeze.main_command.main()
    written = breeze.hash_path.read_bytes()
    breeze.module.regenerate_provider_dependencies_once.cache_clear()

    breeze.main_command.main()

    assert breeze.regenerations == 1
    assert breeze.hash_path.read_bytes() == written


# ---------------------------------------------------------------------------------------------------------
# Cache hit: nothing is rewritten; old checksum files without the newline are still accepted
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "checksum_bytes_suffix",
    [
        pytest.param(b"\n", id="current-format"),
        pytest.param(b"", id="old-format-without-newline"),
        pytest.param(b"\r\n", id="crlf"),
    ],
)
def test_up_to_date_cache_is_not_rewritten(breeze: FakeBreeze, checksum_bytes_suffix: bytes) -> None:
    breeze.write_dependencies()
    breeze.hash_path.write_bytes(breeze.expected_hash.encode("ascii") + checksum_bytes_suffix)
    os.utime(breeze.hash_path, ns=(1_000_000_000, 1_000_000_000))
    before = breeze.hash_path.read_bytes()
    dependencies_before = breeze.json_path.read_bytes()

    breeze.main_command.main()

    assert breeze.regenerations == 0
    assert breeze.hash_path.read_bytes() == before
    assert breeze.hash_path.stat().st_mtime_ns == 1_000_000_000
    assert breeze.json_path.read_bytes() == dependencies_before


# ---------------------------------------------------------------------------------------------------------
# Regeneration failure: no checksum written / updated
# ---------------------------------------------------------------------------------------------------------
class RegenerationFailed(RuntimeError):
    pass


def _failing_regeneration() -> None:
    raise RegenerationFailed("update_providers_dependencies.py failed")


@pytest.mark.parametrize(
    ("dependencies_present", "old_checksum"),
    [
        pytest.param(False, None, id="dependencies-and-checksum-missing"),
        pytest.param(True, None, id="checksum-missing"),
        pytest.param(True, b"0" * 64 + b"\n", id="checksum-stale"),
        pytest.param(False, b"0" * 64, id="dependencies-missing-stale-old-format"),
    ],
)
def test_failed_regeneration_writes_no_checksum(
    breeze: FakeBreeze,
    monkeypatch: pytest.MonkeyPatch,
    dependencies_present: bool,
    old_checksum: bytes | None,
) -> None:
    if dependencies_present:
        breeze.write_dependencies()
    if old_checksum is not None:
        breeze.hash_path.write_bytes(old_checksum)
    monkeypatch.setattr(breeze.module, "regenerate_provider_dependencies_once", _failing_regeneration)

    with pytest.raises(RegenerationFailed):
        breeze.main_command.main()

    if old_checksum is None:
        assert not breeze.hash_path.exists()
    else:
        assert breeze.hash_path.read_bytes() == old_checksum


def test_regeneration_without_output_writes_no_checksum(
    breeze: FakeBreeze, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(breeze.module, "regenerate_provider_dependencies_once", lambda: None)

    with pytest.raises(FileNotFoundError):
        breeze.module.get_provider_dependencies()

    assert not breeze.hash_path.exists()


def test_regeneration_with_invalid_json_writes_no_checksum(
    breeze: FakeBreeze, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken_regeneration() -> None:
        breeze.json_path.write_text("{not json")

    monkeypatch.setattr(breeze.module, "regenerate_provider_dependencies_once", broken_regeneration)

    with pytest.raises(ValueError):
        breeze.main_command.main()

    assert not breeze.hash_path.exists()


# ---------------------------------------------------------------------------------------------------------
# apply() / remove()
# ---------------------------------------------------------------------------------------------------------
@pytest.fixture
def no_breeze(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    override.remove()
    saved = {n: m for n, m in sys.modules.items() if n == "airflow_breeze" or n.startswith("airflow_breeze.")}
    _purge_breeze_modules()
    yield
    override.remove()
    _purge_breeze_modules()
    sys.modules.update(saved)


@pytest.mark.usefixtures("no_breeze")
def test_apply_is_noop_when_airflow_breeze_is_not_installed() -> None:
    if importlib.util.find_spec("airflow_breeze") is not None:
        pytest.skip("a real airflow_breeze is importable in this environment")

    assert override.apply() is False
    assert override.is_applied() is False
    assert override.remove() is False
    assert "airflow_breeze" not in sys.modules


@pytest.mark.usefixtures("no_breeze")
def test_apply_is_noop_when_airflow_breeze_import_is_blocked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "airflow_breeze", None)  # makes any import of it fail

    assert override.apply() is False
    assert override.is_applied() is False


def test_apply_refuses_unknown_layout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    override.remove()
    _purge_breeze_modules()
    _, src = _build_tree(tmp_path, omit_function="_calculate_provider_deps_hash")
    monkeypatch.syspath_prepend(str(src))
    try:
        module = importlib.import_module("airflow_breeze.utils.provider_dependencies")
        original = module.get_provider_dependencies

        assert override.apply() is False
        assert module.get_provider_dependencies is original
    finally:
        _purge_breeze_modules()


def test_apply_rebinds_by_name_imports_and_remove_restores(breeze_src: tuple[Path, Path]) -> None:
    main_command = importlib.import_module("airflow_breeze.commands.main_command")
    module = importlib.import_module("airflow_breeze.utils.provider_dependencies")
    original_get = module.get_provider_dependencies
    original_generate = module.generate_provider_dependencies_if_needed
    assert main_command.generate_provider_dependencies_if_needed is original_generate

    assert override.apply() is True
    assert override.apply() is True  # idempotent
    assert override.is_applied() is True
    assert module.get_provider_dependencies is not original_get
    assert module.generate_provider_dependencies_if_needed is not original_generate
    assert (
        main_command.generate_provider_dependencies_if_needed
        is module.generate_provider_dependencies_if_needed
    )
    # a module imported after apply() binds the replacement too
    late: dict[str, Any] = {}
    exec("from airflow_breeze.utils.provider_dependencies import get_provider_dependencies", late)
    assert late["get_provider_dependencies"] is module.get_provider_dependencies

    assert override.remove() is True
    assert override.is_applied() is False
    assert module.get_provider_dependencies is original_get
    assert module.generate_provider_dependencies_if_needed is original_generate
    assert main_command.generate_provider_dependencies_if_needed is original_generate
    assert override.remove() is False


def test_launcher_applies_override_and_runs_breeze(breeze_src: tuple[Path, Path]) -> None:
    root, _ = breeze_src
    hash_path = root / "generated" / "provider_dependencies.json.sha256sum"

    argv_before = list(sys.argv)

    assert override.main(["testing", "core-tests"]) == 0

    assert sys.argv == argv_before

    breeze_module = sys.modules["airflow_breeze.breeze"]
    assert breeze_module.SEEN_ARGV == [["breeze", "testing", "core-tests"]]
    _assert_single_trailing_newline(hash_path.read_bytes(), _expected_hash(root))


@pytest.mark.usefixtures("no_breeze")
def test_launcher_without_breeze_fails_cleanly(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "airflow_breeze", None)

    assert override.main([]) == 2
    assert "not importable" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------------
# Pure decision functions
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("calculated", "expected"),
    [
        ("abc123", b"abc123\n"),
        ("abc123\n", b"abc123\n"),
        ("abc123\r\n", b"abc123\n"),
        ("  abc123  \n\n", b"abc123\n"),
    ],
)
def test_checksum_file_bytes(calculated: str, expected: bytes) -> None:
    assert override.checksum_file_bytes(calculated) == expected


@pytest.mark.parametrize("calculated", ["", "\n", "abc 123", "abc\n123"])
def test_checksum_file_bytes_rejects_unusable_checksums(calculated: str) -> None:
    with pytest.raises(ValueError):
        override.checksum_file_bytes(calculated)


@pytest.mark.parametrize(
    ("stored", "current"),
    [
        (None, False),
        ("abc", True),
        ("abc\n", True),
        ("abc\r\n", True),
        ("abc\n\n", True),
        ("abd\n", False),
        ("", False),
    ],
)
def test_is_checksum_current(stored: str | None, current: bool) -> None:
    assert override.is_checksum_current("abc", stored) is current


def test_empty_calculated_checksum_is_never_current() -> None:
    assert override.is_checksum_current("", "") is False


@pytest.mark.parametrize(
    ("exists", "stored", "regenerate"),
    [
        (False, None, True),
        (False, "abc\n", True),
        (True, None, True),
        (True, "old\n", True),
        (True, "abc\n", False),
        (True, "abc", False),
    ],
)
def test_needs_regeneration(exists: bool, stored: str | None, regenerate: bool) -> None:
    decision = override.needs_regeneration(
        dependencies_file_exists=exists, stored_checksum=stored, calculated="abc"
    )
    assert decision is regenerate


def test_write_checksum_skips_identical_content(tmp_path: Path) -> None:
    path = tmp_path / "x.sha256sum"
    assert override.write_checksum(path, "abc") is True
    assert path.read_bytes() == b"abc\n"
    assert override.write_checksum(path, "abc\n") is False
    path.write_bytes(b"abc")
    assert override.write_checksum(path, "abc") is True
    assert path.read_bytes() == b"abc\n"


def test_read_stored_checksum_missing_file(tmp_path: Path) -> None:
    assert override.read_stored_checksum(tmp_path / "missing") is None
