#!/usr/bin/env bash
# `make check-alerts`: promtool from Debian's prometheus package (extracted, not installed, into
# $POSTROOM_DEV_DIR/promtool), then `promtool check rules` and `promtool test rules` on
# deploy/prometheus. The package is fetched once with apt-get download.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
DEV_DIR="${POSTROOM_DEV_DIR:-$REPO/.dev}"
TOOL_DIR="$DEV_DIR/promtool"
PROMTOOL="$(command -v promtool || true)"
if [[ -z "$PROMTOOL" ]]; then
    PROMTOOL="$TOOL_DIR/usr/bin/promtool"
    if [[ ! -x "$PROMTOOL" ]]; then
        echo "check-alerts: fetching promtool (Debian package prometheus) into $TOOL_DIR" >&2
        mkdir -p "$TOOL_DIR"
        (cd "$TOOL_DIR" && apt-get download prometheus >/dev/null)
        dpkg-deb -x "$TOOL_DIR"/prometheus_*.deb "$TOOL_DIR"
        rm -f "$TOOL_DIR"/prometheus_*.deb
    fi
fi
"$PROMTOOL" check rules "$REPO/deploy/prometheus/alerts.yml"
(cd "$REPO/deploy/prometheus" && "$PROMTOOL" test rules alerts.test.yml)
