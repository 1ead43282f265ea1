#!/usr/bin/env bash
# Runs nox (noxfile.py) with the pinned uv and nox, installed into .venvs/_tools on first use:
#   bash scripts/nox.sh -l                  list the sessions
#   bash scripts/nox.sh -s lint             run one
# Needs only python3 (3.10+) and PyPI.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PINS="uv==0.13.9 nox==2026.10.20"
TOOLS=.venvs/_tools
if [[ "$(cat "$TOOLS/pins" 2>/dev/null)" != "$PINS" ]]; then
    mkdir -p .venvs
    (
        flock 9   # test.sh and demo.sh may bootstrap at the same time
        if [[ "$(cat "$TOOLS/pins" 2>/dev/null)" != "$PINS" ]]; then
            echo "nox.sh: installing $PINS into $TOOLS" >&2
            rm -rf "$TOOLS"
            python3 -m venv "$TOOLS"
            # (pip's "Location ... is ignored" warnings about this machine's pip.conf are noise)
            # shellcheck disable=SC2086  # PINS is a list on purpose
            "$TOOLS/bin/pip" install --quiet --disable-pip-version-check $PINS 2>&1 | { grep -v 'is ignored:' >&2 || true; }
            ((PIPESTATUS[0] == 0)) || exit 1
            echo "$PINS" >"$TOOLS/pins"
        fi
    ) 9>.venvs/.tools.lock
fi
# Never let uv fetch a managed CPython: the environments use this machine's interpreter.
export UV_PYTHON_DOWNLOADS=never
exec "$TOOLS/bin/nox" "$@"
