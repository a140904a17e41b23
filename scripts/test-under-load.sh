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

# One CPU worker, no time limit: it runs until this script stops it, or, should this script be
# killed outright, until the kernel tells it its parent died (setpriv --pdeathsig).
pdeathsig=()
command -v setpriv >/dev/null && pdeathsig=(setpriv --pdeathsig TERM)
"${pdeathsig[@]}" stress-ng --cpu 1 --timeout 0 --quiet &
HOG=$!
RUN=
stop() {
    # The run's whole process group (make, pytest, its workers, the roles they started), then
    # the hog, whose parent process passes the TERM on to its worker.
    if [[ -n $RUN ]]; then
        kill -TERM -- "-$RUN" 2>/dev/null || true
    fi
    kill -TERM "$HOG" 2>/dev/null || true
    wait 2>/dev/null || true
}
trap stop EXIT
# Each run goes in the background, so that a signal to this script is handled at once (bash runs
# a trap only after a foreground command ends) and stops the run with it; with job control (set
# -m) in a process group of its own, and without the SIGINT a script's background job ignores
# (the suite sends SIGINT to commands it starts).
set -m
trap 'exit 130' INT
trap 'exit 143' TERM
say "stress-ng --cpu 1 keeps one core busy (pid $HOG); running '$*' $RUNS time(s)"

for run in $(seq 1 "$RUNS"); do
    started=$SECONDS
    "$@" &
    RUN=$!
    status=0
    wait "$RUN" || status=$?
    RUN=
    if [[ $status -eq 0 ]]; then
        say "run $run of $RUNS passed in $((SECONDS - started)) s"
    else
        say "run $run of $RUNS FAILED (exit $status) after $((SECONDS - started)) s"
        exit "$status"
    fi
done
say "all $RUNS runs passed under load"
