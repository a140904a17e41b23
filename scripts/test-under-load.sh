#!/usr/bin/env bash
# `make test-under-load`: the suite while another process keeps one core busy (stress-ng --cpu 1),
# LOAD_RUNS times in a row (3), stopping at the first red run. stress-ng comes from Debian's
# package of that name, installed with apt-get when missing. The hog is stopped however the runs
# end (a failure, Ctrl-C, a kill of this script).
#
# Usage: scripts/test-under-load.sh COMMAND...   (make passes `make test`)
set -euo pipefail

RUNS="${LOAD_RUNS:-3}"
say() { printf 'test-under-load: %s\n' "$*" >&2; }

if [[ $# -eq 0 ]]; then
    say "usage: $0 COMMAND... (the suite to run, e.g. make test)"
    exit 2
fi
if ! [[ $RUNS =~ ^[1-9][0-9]*$ ]]; then
    say "LOAD_RUNS must be a whole number of runs above 0, not '$RUNS'"
    exit 2
fi

if ! command -v stress-ng >/dev/null; then
    say "installing stress-ng (Debian package stress-ng) with apt-get"
    sudo=()
    [[ $(id -u) -eq 0 ]] || sudo=(sudo)
    "${sudo[@]}" apt-get install -y -q stress-ng >/dev/null || {
        "${sudo[@]}" apt-get update -q >/dev/null && "${sudo[@]}" apt-get install -y -q stress-ng >/dev/null
    }
fi

# One CPU worker, no time limit: it runs until this script stops it.
stress-ng --cpu 1 --timeout 0 --quiet &
HOG=$!
stop_hog() {
    if kill -0 "$HOG" 2>/dev/null; then
        # stress-ng's parent passes the TERM on to its worker and reaps it.
        kill -TERM "$HOG" 2>/dev/null || true
        wait "$HOG" 2>/dev/null || true
    fi
}
trap stop_hog EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
say "stress-ng --cpu 1 keeps one core busy (pid $HOG); running '$*' $RUNS time(s)"

for run in $(seq 1 "$RUNS"); do
    started=$SECONDS
    if "$@"; then
        say "run $run of $RUNS passed in $((SECONDS - started)) s"
    else
        status=$?
        say "run $run of $RUNS FAILED (exit $status) after $((SECONDS - started)) s"
        exit "$status"
    fi
done
say "all $RUNS runs passed under load"
