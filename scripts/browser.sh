#!/usr/bin/env bash
# Installs what the console's browser tests (tests/integration/web) drive: Debian's chromium and
# chromium-driver, with apt-get, when they are missing. Idempotent; needs root (or sudo).
set -euo pipefail

say() { printf 'browser: %s\n' "$*"; }

if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
    say "chromium and chromedriver present: $(chromium --version 2>/dev/null | head -1)"
    exit 0
fi
SUDO=()
if [[ $(id -u) != 0 ]]; then
    SUDO=(sudo)
fi
# The lists first (an install from stale or missing lists finds nothing); wait for another apt.
"${SUDO[@]}" apt-get -o DPkg::Lock::Timeout=600 update -q
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -q \
    --no-install-recommends chromium chromium-driver
say "installed $(chromium --version 2>/dev/null | head -1)"
