#!/usr/bin/env bash
# Creates the project's venv (.venv, Python >= 3.11) and installs postroom into it, editable,
# with the roles, test, lint and demo extras. Idempotent: a stamp in .venv holds the hash of
# pyproject.toml, so the install is skipped until pyproject.toml changes.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV="$REPO/.venv"
STAMP="$VENV/.postroom-installed"
EXTRAS="roles,test,lint,demo"

say() { printf 'bootstrap: %s\n' "$*"; }

is_311_or_newer() {
    "$1" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null
}

find_python() {
    local candidate
    for candidate in python3.11 python3.12 python3.13 python3; do
        if command -v "$candidate" >/dev/null && is_311_or_newer "$candidate"; then
            command -v "$candidate"
            return
        fi
    done
    return 1
}

ensure_venv() {
    # A venv copied from elsewhere or built on a removed interpreter fails this check.
    if [[ -x $VENV/bin/python ]] && is_311_or_newer "$VENV/bin/python"; then
        return
    fi
    local python
    python=$(find_python) || {
        echo "bootstrap: ERROR: no python3 >= 3.11 on PATH" >&2
        exit 1
    }
    say "creating $VENV with $python ($("$python" --version 2>&1))"
    rm -rf "$VENV"
    "$python" -m venv "$VENV"
}

install_project() {
    local want
    # The extras are part of the stamp: changing them must reinstall too.
    want="$(sha256sum "$REPO/pyproject.toml" | cut -d' ' -f1) $EXTRAS"
    if [[ -f $STAMP && $(cat "$STAMP") == "$want" ]]; then
        say "up to date ($VENV; pyproject.toml unchanged since the last install)"
        return
    fi
    say "pip install -e '.[$EXTRAS]' into $VENV"
    # The build backend's warnings go to a log; it is shown only when the install fails.
    local log="$VENV/pip-install.log"
    if ! (cd "$REPO" && "$VENV/bin/python" -m pip install --disable-pip-version-check \
        --no-input -e ".[$EXTRAS]") >"$log" 2>&1; then
        echo "bootstrap: ERROR: pip install failed; last lines of $log:" >&2
        tail -n 40 "$log" >&2
        exit 1
    fi
    printf '%s\n' "$want" >"$STAMP"
    say "installed"
}

ensure_venv
install_project
