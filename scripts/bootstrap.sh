#!/usr/bin/env bash
# Creates the project's venv (.venv, Python >= 3.11) and installs postroom into it, editable,
# with the roles, test, lint and demo extras: with uv when it can be fetched, else with pip.
# Idempotent: a stamp in .venv holds the hash of pyproject.toml, so the install is skipped until
# pyproject.toml changes.
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

# uv resolves, downloads and compiles in parallel: about 20 s for what pip 23 does in about 65 s
# (58 CPU-s, a third of it compiling bytecode one file at a time). It is fetched with pip into the
# venv and told where pip installs from (scripts/uv_settings.py: pip's index, extra indexes,
# find-links, no-index and CA bundle, from every config file and PIP_* variable); when pip is set
# to anything uv would not be told, or uv fails, pip installs as before.
install_with_uv() {
    local told line
    local -a args=() env=()
    "$VENV/bin/python" -m pip install --disable-pip-version-check --no-input --quiet \
        'uv>=0.13,<0.14' || return 1
    told=$("$VENV/bin/python" "$REPO/scripts/uv_settings.py") || return 1
    while IFS= read -r line; do
        case $line in
            "") ;;
            -*) args+=("$line") ;;
            *) env+=("$line") ;; # NAME=value, for uv's environment: index URLs stay out of ps
        esac
    done <<<"$told"
    (cd "$REPO" && env "${env[@]}" "$VENV/bin/uv" pip install --python "$VENV/bin/python" \
        --compile-bytecode "${args[@]}" -e ".[$EXTRAS]")
}

install_with_pip() {
    (cd "$REPO" && "$VENV/bin/python" -m pip install --disable-pip-version-check \
        --no-input -e ".[$EXTRAS]")
}

install_project() {
    local want
    # The extras are part of the stamp: changing them must reinstall too.
    want="$(sha256sum "$REPO/pyproject.toml" | cut -d' ' -f1) $EXTRAS"
    if [[ -f $STAMP && $(cat "$STAMP") == "$want" ]]; then
        say "up to date ($VENV; pyproject.toml unchanged since the last install)"
        return
    fi
    # The installers' output goes to a log; it is shown only when the install fails.
    local log="$VENV/pip-install.log"
    say "installing postroom '.[$EXTRAS]' into $VENV with uv (log: $log)"
    if ! install_with_uv >"$log" 2>&1; then
        say "uv did not install (last line of $log: $(tail -n 1 "$log"))"
        say "pip install -e '.[$EXTRAS]' instead"
        if ! install_with_pip >>"$log" 2>&1; then
            echo "bootstrap: ERROR: pip install failed; last lines of $log:" >&2
            tail -n 40 "$log" >&2
            exit 1
        fi
    fi
    printf '%s\n' "$want" >"$STAMP"
    say "installed"
}

ensure_venv
install_project
