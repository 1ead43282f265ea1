"""Breeze override: write ``provider_dependencies.json.sha256sum`` safely.

Breeze (``dev/breeze``, package ``airflow_breeze``) keeps a cache of the provider dependencies in
``generated/provider_dependencies.json`` and a sidecar ``generated/provider_dependencies.json.sha256sum``
holding the SHA-256 of all provider ``pyproject.toml``/``provider.yaml`` inputs. On the cache-miss path
(``get_provider_dependencies`` in ``airflow_breeze.utils.provider_dependencies``) affected Breeze versions

* write the checksum *without* a trailing newline, so the ``end-of-file-fixer`` pre-commit hook rewrites
  the committed file in CI, and
* write it *before* the regeneration runs, so a failed regeneration leaves a checksum that vouches for a
  dependencies file that was never produced.

This module replaces ``get_provider_dependencies`` and ``generate_provider_dependencies_if_needed`` (looked
up by name on the real Breeze module) with versions that

* write the checksum as the hex digest followed by exactly one ``\\n``,
* write it only after the regeneration returned and produced a readable JSON file,
* regenerate when the dependencies file or the checksum is missing, or the checksum is stale, and
* still accept an old checksum file without the trailing newline as up to date (stripped comparison),
  leaving that file untouched.

The override only activates where ``airflow_breeze`` is importable; everywhere else :func:`apply` is a no-op
that returns ``False``. :func:`remove` restores the original functions.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import json
import sys
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path
    from types import ModuleType

__all__ = [
    "BREEZE_PACKAGE",
    "PATCHED_FUNCTIONS",
    "TARGET_MODULE",
    "apply",
    "checksum_file_bytes",
    "is_applied",
    "is_checksum_current",
    "main",
    "needs_regeneration",
    "normalize_checksum",
    "read_stored_checksum",
    "remove",
    "write_checksum",
]

BREEZE_PACKAGE = "airflow_breeze"
TARGET_MODULE = "airflow_breeze.utils.provider_dependencies"

#: Functions of the target module that are replaced.
PATCHED_FUNCTIONS: tuple[str, ...] = (
    "get_provider_dependencies",
    "generate_provider_dependencies_if_needed",
)
#: Attributes of the target module the replacements call at run time (looked up on each call, so tests
#: and Breeze's own mocks of these names keep working).
_REQUIRED_HELPERS: tuple[str, ...] = (
    "_calculate_provider_deps_hash",
    "regenerate_provider_dependencies_once",
    "PROVIDER_DEPENDENCIES_JSON_PATH",
    "PROVIDER_DEPENDENCIES_JSON_HASH_PATH",
)


# --------------------------------------------------------------------------------------------------------
# Pure decision logic
# --------------------------------------------------------------------------------------------------------
def normalize_checksum(text: str) -> str:
    """Return the checksum as stored in a file, without surrounding whitespace or newlines."""
    return text.strip()


def is_checksum_current(calculated: str, stored: str | None) -> bool:
    """Whether the stored checksum text matches the calculated one.

    ``stored`` is the raw file content (``None`` if there is no file). Old files written without the
    trailing newline, and files with a ``\\r\\n`` ending, compare equal.
    """
    if stored is None:
        return False
    expected = normalize_checksum(calculated)
    return bool(expected) and normalize_checksum(stored) == expected


def needs_regeneration(
    *, dependencies_file_exists: bool, stored_checksum: str | None, calculated: str
) -> bool:
    """Whether the provider dependencies cache must be regenerated (the cache-miss decision)."""
    return not dependencies_file_exists or not is_checksum_current(calculated, stored_checksum)


def checksum_file_bytes(calculated: str) -> bytes:
    """The exact bytes of a checksum file: the digest followed by exactly one ``\\n``."""
    digest = normalize_checksum(calculated)
    if not digest or any(ch.isspace() for ch in digest):
        raise ValueError(f"Not a usable checksum: {calculated!r}")
    return digest.encode("ascii") + b"\n"


# --------------------------------------------------------------------------------------------------------
# Small I/O helpers
# --------------------------------------------------------------------------------------------------------
def read_stored_checksum(path: Path) -> str | None:
    """Raw checksum file content, or ``None`` if it does not exist."""
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return None


def write_checksum(path: Path, calculated: str) -> bool:
    """Write the checksum file (bytes, so no platform newline translation). Returns whether it wrote.

    A file that already holds exactly the wanted bytes is left alone.
    """
    content = checksum_file_bytes(calculated)
    try:
        if path.read_bytes() == content:
            return False
    except FileNotFoundError:
        pass
    path.write_bytes(content)
    return True


# --------------------------------------------------------------------------------------------------------
# Replacements for the Breeze functions
# --------------------------------------------------------------------------------------------------------
@dataclass
class _PatchState:
    module: ModuleType
    originals: dict[str, Any]
    # (module, attribute, original value, replacement) for every binding that was replaced
    rebound: list[tuple[ModuleType, str, Any, Any]] = field(default_factory=list)


_lock = threading.RLock()
_state: _PatchState | None = None


def _target() -> ModuleType:
    state = _state
    if state is None:
        raise RuntimeError("breeze_overrides.provider_dependencies_checksum is not applied")
    return state.module


def _regenerate_and_record(module: ModuleType, calculated: str) -> dict[str, Any]:
    """Regenerate the dependencies file; write the checksum only once that has succeeded."""
    # Plain print, like Breeze: its rich console may not be initialised this early.
    print("Regenerating provider dependencies file")
    module.regenerate_provider_dependencies_once()  # an exception here leaves the checksum untouched
    json_path: Path = module.PROVIDER_DEPENDENCIES_JSON_PATH
    if not json_path.exists():
        raise FileNotFoundError(f"Regeneration did not produce {json_path}; checksum not written")
    dependencies: dict[str, Any] = json.loads(json_path.read_text())  # invalid JSON: no checksum either
    write_checksum(module.PROVIDER_DEPENDENCIES_JSON_HASH_PATH, calculated)
    return dependencies


@functools.cache
def _get_provider_dependencies() -> dict[str, Any]:
    """Replacement for ``get_provider_dependencies`` (cached, with ``cache_clear`` like the original)."""
    module = _target()
    json_path: Path = module.PROVIDER_DEPENDENCIES_JSON_PATH
    if not json_path.exists():
        return _regenerate_and_record(module, module._calculate_provider_deps_hash())
    result: dict[str, Any] = json.loads(json_path.read_text())
    return result


def _generate_provider_dependencies_if_needed() -> None:
    """Replacement for ``generate_provider_dependencies_if_needed``."""
    module = _target()
    calculated: str = module._calculate_provider_deps_hash()
    if not needs_regeneration(
        dependencies_file_exists=module.PROVIDER_DEPENDENCIES_JSON_PATH.exists(),
        stored_checksum=read_stored_checksum(module.PROVIDER_DEPENDENCIES_JSON_HASH_PATH),
        calculated=calculated,
    ):
        return
    _get_provider_dependencies.cache_clear()
    _regenerate_and_record(module, calculated)


_REPLACEMENTS: dict[str, Any] = {
    "get_provider_dependencies": _get_provider_dependencies,
    "generate_provider_dependencies_if_needed": _generate_provider_dependencies_if_needed,
}


# --------------------------------------------------------------------------------------------------------
# apply / remove
# --------------------------------------------------------------------------------------------------------
def _breeze_modules() -> list[ModuleType]:
    return [
        mod
        for name, mod in list(sys.modules.items())
        if mod is not None and (name == BREEZE_PACKAGE or name.startswith(BREEZE_PACKAGE + "."))
    ]


def _clear_cache(func: Any) -> None:
    cache_clear = getattr(func, "cache_clear", None)
    if callable(cache_clear):
        cache_clear()


def is_applied() -> bool:
    """Whether the override is currently active."""
    return _state is not None


def apply() -> bool:
    """Patch Breeze if ``airflow_breeze`` is importable. Returns whether it patched (is now active).

    Besides the attributes of ``airflow_breeze.utils.provider_dependencies`` itself, every already
    imported ``airflow_breeze.*`` module that bound one of the original functions by name (for example
    ``from ...provider_dependencies import generate_provider_dependencies_if_needed``) is re-pointed to
    the replacement. Modules imported later pick the replacement up from the patched module. Calling
    ``apply()`` again while active is a no-op returning ``True``.
    """
    global _state
    with _lock:
        if _state is not None:
            return True
        try:
            if importlib.util.find_spec(BREEZE_PACKAGE) is None:
                return False
            module = importlib.import_module(TARGET_MODULE)
        except (ImportError, ValueError):  # ValueError: a sys.modules entry without __spec__
            return False
        if any(not hasattr(module, name) for name in (*PATCHED_FUNCTIONS, *_REQUIRED_HELPERS)):
            # Unknown Breeze layout: do not patch half of it.
            return False
        originals = {name: getattr(module, name) for name in PATCHED_FUNCTIONS}
        state = _PatchState(module=module, originals=originals)
        for mod in _breeze_modules():
            for attr, value in list(vars(mod).items()):
                for name, original in originals.items():
                    if value is original:
                        setattr(mod, attr, _REPLACEMENTS[name])
                        state.rebound.append((mod, attr, original, _REPLACEMENTS[name]))
        _get_provider_dependencies.cache_clear()
        _state = state
        return True


def remove() -> bool:
    """Undo :func:`apply`. Returns whether anything was restored."""
    global _state
    with _lock:
        state = _state
        if state is None:
            return False
        for mod, attr, original, replacement in reversed(state.rebound):
            if vars(mod).get(attr) is replacement:  # leave bindings someone else changed since
                setattr(mod, attr, original)
        _get_provider_dependencies.cache_clear()
        for original in state.originals.values():
            _clear_cache(original)
        _state = None
        return True


# --------------------------------------------------------------------------------------------------------
# Launcher: ``python -m breeze_overrides.provider_dependencies_checksum <breeze arguments>``
# --------------------------------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    """Apply the override, then run Breeze's own entry point (``airflow_breeze.breeze:main``)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not apply():
        print(
            f"{TARGET_MODULE} is not importable (or has an unexpected layout); "
            "run this with the Python interpreter of the Breeze installation.",
            file=sys.stderr,
        )
        return 2
    breeze_main = importlib.import_module(f"{BREEZE_PACKAGE}.breeze").main
    saved_argv = sys.argv
    sys.argv = ["breeze", *args]
    try:
        breeze_main()
    except SystemExit as exc:  # click's standalone mode always exits
        code = exc.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        print(code, file=sys.stderr)
        return 1
    finally:
        sys.argv = saved_argv
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
