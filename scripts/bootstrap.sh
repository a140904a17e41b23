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

pip_setting() {
    "$VENV/bin/python" -m pip config get "global.$1" 2>/dev/null || true
}

# pip's settings that say where packages come from, given to uv as arguments, one a line: the
# index and extra indexes (environment, else pip.conf's [global]) and find-links directories.
uv_args() {
    local index=${PIP_INDEX_URL:-$(pip_setting index-url)}
    local extra=${PIP_EXTRA_INDEX_URL:-$(pip_setting extra-index-url)}
    [[ -n $index ]] && printf -- '--index-url\n%s\n' "$index"
    for url in $extra; do printf -- '--extra-index-url\n%s\n' "$url"; done
    for dir in ${PIP_FIND_LINKS:-}; do printf -- '--find-links\n%s\n' "$dir"; done
    return 0
}

# uv resolves, downloads and compiles in parallel: about 20 s for what pip 23 does in about 65 s
# (58 CPU-s, a third of it compiling bytecode one file at a time). It is fetched with pip into the
# venv; when that or its install fails (an index without uv, a setting it reads otherwise), pip
# installs as before. pip's CA bundle (PIP_CERT) is uv's too (uv reads SSL_CERT_FILE).
install_with_uv() {
    local -a args
    "$VENV/bin/python" -m pip install --disable-pip-version-check --no-input --quiet uv || return 1
    mapfile -t args < <(uv_args)
    if [[ -z ${SSL_CERT_FILE:-} && -n ${PIP_CERT:-} ]]; then
        export SSL_CERT_FILE=$PIP_CERT
    fi
    (cd "$REPO" && "$VENV/bin/uv" pip install --python "$VENV/bin/python" --compile-bytecode \
        "${args[@]}" -e ".[$EXTRAS]")
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
        say "uv did not install (its output is in $log); pip install -e '.[$EXTRAS]' instead"
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
