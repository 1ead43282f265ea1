"""
Spellings of ``[heartbeat_fix]`` that Airflow would silently ignore: a variable that is nearly
``AIRFLOW__HEARTBEAT_FIX__ENABLED``, a section that is nearly ``[heartbeat_fix]``, an option the section
does not have. An operator who meant to switch the fixes off would otherwise find them still on with no
word; ``status`` and the scheduler's start say so in one line each (:func:`config_warnings`).

The options the section has are those :mod:`~airflow_heartbeat_fix.provider_info` declares to Airflow.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable

SECTION = "heartbeat_fix"
_PREFIX = f"AIRFLOW__{SECTION.upper()}__"
#: Airflow's ``_CMD``/``_SECRET`` variants of an option's variable.
_VARIANTS = ("_CMD", "_SECRET")


def _squeezed(text: str) -> str:
    """Letters and digits only, upper case: what a near miss shares with the real name."""
    return re.sub(r"[^A-Z0-9]", "", text.upper())


def known_options() -> frozenset[str]:
    """The options of ``[heartbeat_fix]``, as the package declares them to Airflow."""
    from airflow_heartbeat_fix.provider_info import get_provider_info

    return frozenset(get_provider_info()["config"][SECTION]["options"])


def _variable_warning(name: str, known: frozenset[str]) -> str | None:
    if not _squeezed(name).startswith(_squeezed(_PREFIX)):
        return None
    if name.startswith(_PREFIX):
        option = name[len(_PREFIX) :]
        for variant in _VARIANTS:
            option = option.removesuffix(variant)
        if option.lower() in known:
            return None
        return f"{name}: [{SECTION}] has no option {option.lower()!r} ({', '.join(sorted(known))}); ignored"
    meant = _squeezed(name)[len(_squeezed(_PREFIX)) :]
    closest = next((option for option in sorted(known) if meant.startswith(_squeezed(option))), None)
    target = f"{_PREFIX}{closest.upper()}" if closest else f"{_PREFIX}<OPTION>"
    return f"{name} is not {target} (the section and the option are separated by two underscores); ignored"


def near_misses(
    variables: Iterable[str], sections: Iterable[str], options: Iterable[str], known: frozenset[str]
) -> list[str]:
    """
    One warning per name Airflow ignores: ``variables`` of the environment, ``sections`` of the
    configuration, ``options`` set in ``[heartbeat_fix]``; ``known``: the options it has.
    """
    found = [warning for name in sorted(variables) if (warning := _variable_warning(name, known))]
    found += [
        f"airflow.cfg section [{section}] is not [{SECTION}]; ignored"
        for section in sorted(sections)
        if section != SECTION and _squeezed(section) == _squeezed(SECTION)
    ]
    found += [
        f"[{SECTION}] has no option {option!r} ({', '.join(sorted(known))}); ignored"
        for option in sorted(options)
        if option not in known and not any(option.endswith(variant.lower()) for variant in _VARIANTS)
    ]
    return list(dict.fromkeys(found))


def config_warnings() -> list[str]:
    """:func:`near_misses` in this process's environment and Airflow's configuration."""
    from airflow.configuration import conf

    known = known_options()
    options = conf.getsection(SECTION) or {} if conf.has_section(SECTION) else {}
    from_variables = {name[len(_PREFIX) :].lower() for name in os.environ if name.startswith(_PREFIX)}
    # An unknown option set by a variable is named once, as that variable.
    set_in_file = [option for option in options if option not in from_variables]
    return near_misses(os.environ, conf.sections(), set_in_file, known)
