#!/usr/bin/env bash
# make compose-test: docker-compose.yml run for real, with podman where no Docker engine runs.
# Builds postroom:local from the Dockerfile through Docker Compose v2, stands in for the images
# that cannot be pulled (dev/compose/*, same names and conventions), starts the file as written,
# waits for every healthcheck, sends the seed's September report from the host and reads its
# rows with `postroom status`, then tears the stack down (always). docs/docker.md tells more.
#
# Environment (all optional):
#   POSTROOM_COMPOSE_DIR     caches and state (default <repo>/.dev/compose): the image store,
#                            the Go build of the compose plugin, the base image's tarball, the
#                            stand-ins' inputs
#   POSTROOM_COMPOSE_PORTS   host ports of postgres, kafka, registry and mailpit
#                            (default "26432 26092 26081 26025": below 32768, Linux's
#                            ephemeral ports, apart from the dev stack, the cluster and the
#                            compose file's own)
#   POSTROOM_COMPOSE_KEEP=1  leave the stack up at the end (`down` is printed instead)
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WORK=$(realpath -m "${POSTROOM_COMPOSE_DIR:-$REPO/.dev/compose}")
read -r PG_PORT KAFKA_PORT REGISTRY_PORT MAILPIT_PORT \
    <<<"${POSTROOM_COMPOSE_PORTS:-26432 26092 26081 26025}"
PROJECT=postroom-compose-test
COMPOSE_VERSION=v2.40.3
KAFKA_VERSION=4.1.1
REGISTRY_ARTIFACT=io.apicurio:apicurio-registry-app:3.3.3:tar.gz:all
JAVA_MIN=21
STANDINS="$REPO/dev/compose"
SOCKET="$WORK/podman.sock"
COMPOSE_BIN="$WORK/bin/docker-compose"
BASE_TAR="$WORK/bookworm-minbase.tar"
BASE_IMAGE=localhost/postroom-compose/debian:bookworm
JAVA_IMAGE=localhost/postroom-compose/java:local
HEALTHY_TIMEOUT_S=300
DELIVERY_TIMEOUT_S=120
STOP_TIMEOUT_S=30
REPORT_KEY=sales-report-2026-09
ATTACH_DIR="$REPO/attachments/compose-test"
VENV_PY="$REPO/.venv/bin/python"
T0=$SECONDS

say() { printf 'compose-test [%3ds]: %s\n' $((SECONDS - T0)) "$*"; }
# shell_words WORD...: the words as a shell line that gives them back, each quoted as it needs
# (a subject with spaces or a dash of its own), so a command said can be pasted and run.
shell_words() {
    local word out=()
    for word in "$@"; do
        if [[ $word =~ ^[A-Za-z0-9_@%+=:,./-]+$ ]]; then
            out+=("$word")
        else
            out+=("'${word//\'/\'\\\'\'}'")
        fi
    done
    printf '%s\n' "${out[*]}"
}
die() {
    printf 'compose-test: %s\n' "$1" >&2
    [[ -n ${2:-} && -f $2 ]] && tail -n 20 "$2" | sed 's/^/    /' >&2
    exit 1
}

# ---------------------------------------------------------------------------------------------
# The engine: podman with runc, its Docker-compatible API on a socket of our own

ensure_packages() {
    local missing=() tool
    for tool in podman runc debootstrap; do
        command -v "$tool" >/dev/null || missing+=("$tool")
    done
    [[ ${#missing[@]} -eq 0 ]] && return
    say "installing ${missing[*]} with apt-get (first run only)"
    apt-get update -qq >"$WORK/apt.log" 2>&1 || die "apt-get update failed" "$WORK/apt.log"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >>"$WORK/apt.log" 2>&1 \
        || die "apt-get install ${missing[*]} failed" "$WORK/apt.log"
}

# crun (Debian's default) fails here on setrlimit and on hybrid cgroups; without systemd,
# cgroupfs and a file for events. A container's limits may not exceed ours (runc refuses them).
write_containers_conf() {
    local nofile nproc
    nofile=$(ulimit -Hn) nproc=$(ulimit -Hu)
    [[ $nofile == unlimited || $nofile -gt 65536 ]] && nofile=65536
    # runc could not set nproc above 32768 here even with a higher hard limit.
    [[ $nproc == unlimited || $nproc -gt 32768 ]] && nproc=32768
    cat >"$WORK/containers.conf" <<EOF
# Written by scripts/compose-test.sh; read through CONTAINERS_CONF, /etc is left alone.
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
    export CONTAINERS_CONF="$WORK/containers.conf"
    # Images and containers of this checkout's own: a fresh clone builds every stand-in again, and
    # the machine's default store (/var/lib/containers) is left alone.
    local runroot
    runroot="/run/postroom-compose-$(printf '%s' "$WORK" | sha1sum | cut -c1-12)"
    cat >"$WORK/storage.conf" <<EOF
# Written by scripts/compose-test.sh; read through CONTAINERS_STORAGE_CONF.
[storage]
driver = "overlay"
graphroot = "$WORK/storage"
runroot = "$runroot"
EOF
    export CONTAINERS_STORAGE_CONF="$WORK/storage.conf"
}

start_podman_service() {
    rm -f "$SOCKET"
    # setsid: out of the terminal's process group, so a Ctrl-C leaves the API up for teardown's
    # compose stop and down (teardown stops it last). A background job of a script is no group
    # leader, so setsid makes the session in place and $! is podman's own pid.
    setsid podman system service --time=0 "unix://$SOCKET" >"$WORK/podman-service.log" 2>&1 &
    PODMAN_SERVICE_PID=$!
    local deadline=$((SECONDS + 30))
    until [[ -S $SOCKET ]] && curl -fsS --unix-socket "$SOCKET" http://d/_ping >/dev/null 2>&1; do
        kill -0 "$PODMAN_SERVICE_PID" 2>/dev/null || die "podman system service exited" "$WORK/podman-service.log"
        [[ $SECONDS -lt $deadline ]] || die "podman's API did not answer on $SOCKET" "$WORK/podman-service.log"
        sleep 0.5
    done
    export DOCKER_HOST="unix://$SOCKET"
}

# Docker Compose v2 from its Go module: `go install` refuses it (replace directives), so the
# module is downloaded and built in place; the module and build caches stay under $WORK/go.
ensure_compose() {
    if [[ -x $COMPOSE_BIN ]] && "$COMPOSE_BIN" version 2>/dev/null | grep -qF "$COMPOSE_VERSION"; then
        return
    fi
    command -v go >/dev/null || die "Go is needed once to build Docker Compose $COMPOSE_VERSION (put go 1.24+ on PATH)"
    say "building Docker Compose $COMPOSE_VERSION from its Go module (first run only, 7-17 min on 2 cores)"
    local log="$WORK/compose-build.log" dir
    export GOMODCACHE="$WORK/go/mod" GOCACHE="$WORK/go/cache" GOFLAGS=-buildvcs=false
    dir=$(go mod download -json "github.com/docker/compose/v2@$COMPOSE_VERSION" 2>"$log" \
        | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p') || true
    [[ -n $dir && -d $dir ]] || die "go mod download of docker/compose $COMPOSE_VERSION failed" "$log"
    mkdir -p "$WORK/bin"
    (cd "$dir" && go build -trimpath \
        -ldflags "-s -w -X github.com/docker/compose/v2/internal.Version=$COMPOSE_VERSION" \
        -o "$COMPOSE_BIN.partial" ./cmd) >>"$log" 2>&1 || die "go build of docker/compose failed" "$log"
    mv "$COMPOSE_BIN.partial" "$COMPOSE_BIN"
}

compose() {
    COMPOSE_BAKE=false DOCKER_BUILDKIT=0 \
        HOST_PORT_POSTGRES=$PG_PORT HOST_PORT_KAFKA=$KAFKA_PORT \
        HOST_PORT_REGISTRY=$REGISTRY_PORT HOST_PORT_MAILPIT=$MAILPIT_PORT \
        "$COMPOSE_BIN" --project-name "$PROJECT" --project-directory "$REPO" \
        -f "$REPO/docker-compose.yml" -f "$STANDINS/test.override.yml" "$@"
}

# ---------------------------------------------------------------------------------------------
# Images: a debootstrap base, then the stand-ins, each rebuilt only when its inputs change

ensure_base_image() {
    podman image exists "$BASE_IMAGE" && return
    if [[ ! -f $BASE_TAR ]]; then
        say "debootstrap --variant=minbase bookworm for the base image (first run only, 1-3 min)"
        local root="$WORK/rootfs"
        rm -rf "$root"
        debootstrap --variant=minbase bookworm "$root" http://deb.debian.org/debian \
            >"$WORK/debootstrap.log" 2>&1 || die "debootstrap failed" "$WORK/debootstrap.log"
        rm -f "$root"/var/cache/apt/archives/*.deb
        tar -C "$root" -cf "$BASE_TAR.partial" . && mv "$BASE_TAR.partial" "$BASE_TAR"
        rm -rf "$root"
    fi
    say "importing the base image $BASE_IMAGE"
    podman import --change 'CMD ["bash"]' "$BASE_TAR" "$BASE_IMAGE" >"$WORK/import.log" 2>&1 \
        || die "podman import failed" "$WORK/import.log"
}

# A java 21 or newer from the host, as scripts/services.sh finds the registry's.
find_java_home() {
    local candidate major
    for candidate in "$(command -v java || true)" /usr/lib/jvm/*/bin/java; do
        [[ -x $candidate ]] || continue
        major=$("$candidate" -XshowSettings:properties -version 2>&1 \
            | sed -n 's/^ *java\.specification\.version = \([0-9]*\).*/\1/p')
        if [[ ${major:-0} -ge $JAVA_MIN ]]; then
            dirname "$(dirname "$(realpath "$candidate")")"
            return
        fi
    done
    die "the Kafka and Apicurio stand-ins need a Java $JAVA_MIN+ on the host (e.g. temurin-25-jdk); none on PATH or under /usr/lib/jvm"
}

fetch_kafka_libs() {
    local libs="$WORK/kafka-libs" stamp want
    stamp="$libs/.complete"
    want=$(sha256sum "$STANDINS/kafka/pom.xml" | cut -d' ' -f1)
    [[ -f $stamp && $(cat "$stamp") == "$want" ]] && return
    say "fetching the Kafka $KAFKA_VERSION jars with Maven (first run only)"
    rm -rf "$libs.partial"
    mvn -q -B -Dstyle.color=never -f "$STANDINS/kafka/pom.xml" dependency:copy-dependencies \
        -DincludeScope=runtime -DoutputDirectory="$libs.partial" >"$WORK/maven-kafka.log" 2>&1 \
        || die "Maven could not fetch the Kafka jars" "$WORK/maven-kafka.log"
    rm -rf "$libs" && mv "$libs.partial" "$libs" && echo "$want" >"$stamp"
}

fetch_registry_app() {
    local app="$WORK/registry-app" tmp="$WORK/registry-app.partial"
    [[ -f $app/quarkus-run.jar ]] && return
    say "fetching $REGISTRY_ARTIFACT with Maven (first run only)"
    rm -rf "$tmp" && mkdir -p "$tmp/app"
    mvn -q -B -Dstyle.color=never org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy \
        -Dartifact="$REGISTRY_ARTIFACT" -DoutputDirectory="$tmp" >"$WORK/maven-registry.log" 2>&1 \
        || die "Maven could not fetch $REGISTRY_ARTIFACT" "$WORK/maven-registry.log"
    tar -xzf "$tmp"/apicurio-registry-app-*.tar.gz -C "$tmp/app"
    rm -rf "$app" && mv "$tmp/app" "$app" && rm -rf "$tmp"
}

# build_image NAME FOLDER [SOURCE TARGET]...: FOLDER's files plus each SOURCE copied in as
# TARGET make the context; rebuilt when their hash (label postroom.compose.inputs) changes.
build_image() {
    local name=$1 folder=$2 ctx="$WORK/ctx/$(basename "$2")" want have
    shift 2
    want=$( {
        (cd "$folder" && find . -type f -print0 | sort -z | xargs -0 sha256sum)
        printf '%s\n' "$@"
        podman image inspect --format '{{.Id}}' "$(sed -n 's/^FROM //p' "$folder/Containerfile")"
    } | sha256sum | cut -c1-16)
    have=$(podman image inspect --format '{{index .Labels "postroom.compose.inputs"}}' "$name" 2>/dev/null || true)
    [[ $have == "$want" ]] && return
    say "building the stand-in $name (dev/compose/$(basename "$folder"))"
    rm -rf "$ctx" && mkdir -p "$ctx" && cp -a "$folder/." "$ctx/"
    while [[ $# -gt 0 ]]; do
        cp -a "$1" "$ctx/$2"
        shift 2
    done
    local log="$WORK/build-$(basename "$folder").log"
    podman build --network host --label "postroom.compose.inputs=$want" -t "$name" \
        -f "$ctx/Containerfile" "$ctx" >"$log" 2>&1 || die "podman build of $name failed" "$log"
    rm -rf "$ctx"
}

ensure_standins() {
    ensure_base_image
    build_image docker.io/library/python:3.11-slim "$STANDINS/python" \
        "$(realpath /etc/ssl/certs/ca-certificates.crt)" host-ca.crt
    build_image docker.io/axllent/mailpit:v1.31.3 "$STANDINS/mailpit"
    build_image docker.io/library/postgres:17 "$STANDINS/postgres"
    local java_home
    java_home=$(find_java_home)
    build_image "$JAVA_IMAGE" "$STANDINS/java" "$java_home" jdk
    fetch_kafka_libs
    build_image docker.io/apache/kafka:4.1.1 "$STANDINS/kafka" "$WORK/kafka-libs" libs
    fetch_registry_app
    build_image docker.io/apicurio/apicurio-registry:3.3.3 "$STANDINS/registry" "$WORK/registry-app" app
}

# ---------------------------------------------------------------------------------------------
# Health: podman 4.3 runs healthchecks only from systemd timers, so this loop runs them

containers() { podman ps -a --filter "label=com.docker.compose.project=$PROJECT" --format '{{.Names}}'; }

health_of() { podman inspect --format '{{if .State.Healthcheck}}{{.State.Healthcheck.Status}}{{end}}' "$1" 2>/dev/null || true; }

run_healthchecks() {
    while true; do
        local name
        for name in $(containers); do
            case $(health_of "$name") in
                starting | unhealthy) podman healthcheck run "$name" >/dev/null 2>&1 || true ;;
            esac
        done
        sleep 2
    done
}

wait_healthy() {
    local deadline=$((SECONDS + HEALTHY_TIMEOUT_S)) name status pending
    while true; do
        pending=()
        for name in $(containers); do
            status=$(health_of "$name")
            [[ -z $status || $status == healthy ]] || pending+=("$name:$status")
        done
        [[ ${#pending[@]} -eq 0 ]] && return
        [[ $SECONDS -lt $deadline ]] || die "not healthy after ${HEALTHY_TIMEOUT_S}s: ${pending[*]}"
        sleep 2
    done
}

# ---------------------------------------------------------------------------------------------
# The seed's report, from the host

host_postroom() {
    local unset=() name
    for name in $(compgen -e | grep '^POSTROOM_' || true); do unset+=(-u "$name"); done
    env "${unset[@]}" \
        POSTROOM_DATABASE_URL="postgresql+psycopg://postroom:postroom@127.0.0.1:$PG_PORT/postroom" \
        POSTROOM_KAFKA_BOOTSTRAP_SERVERS="localhost:$KAFKA_PORT" \
        "$REPO/.venv/bin/postroom" "$@"
}

send_report() {
    mkdir -p "$ATTACH_DIR"
    "$VENV_PY" - "$ATTACH_DIR" <<'EOF'
import sys
from pathlib import Path
from postroom.devkit.story import make_html_summary, make_workbook
make_workbook(Path(sys.argv[1])).chmod(0o644)
make_html_summary(Path(sys.argv[1])).chmod(0o644)
EOF
    chmod 755 "$ATTACH_DIR" "$(dirname "$ATTACH_DIR")"
    local args=() story
    story=$("$VENV_PY" -c 'from postroom.devkit.story import SEPTEMBER as s, WORKBOOK_NAME as w, SUMMARY_NAME as h; print(s.subject); print(s.body); print(w); print(h); print("\n".join(s.recipients))')
    mapfile -t story <<<"$story"
    local recipient
    for recipient in "${story[@]:4}"; do args+=(--to "$recipient"); done
    # Through the stack's cli service, as docs/docker.md says: an attachment is stored as a path,
    # which must exist where enqueue runs and where the sender reads it (/attachments in both).
    local enqueue=(enqueue --key "$REPORT_KEY" --subject "${story[0]}" --body "${story[1]}"
        --attach "/attachments/compose-test/${story[2]}"
        --html-file "/attachments/compose-test/${story[3]}" "${args[@]}")
    say "enqueueing $REPORT_KEY (workbook attached, HTML summary): $(shell_words docker compose run --rm cli "${enqueue[@]}")"
    compose run --rm -T cli "${enqueue[@]}" \
        2>"$WORK/compose-run.log" || die "docker compose run cli enqueue failed" "$WORK/compose-run.log"
}

# Mailpit accepts everything, so the stack's stand-in refuses old.manager@ (test.override.yml):
# three rows sent at attempt 1, one failed with the 550. ops@'s deferrals need postroom devsmtp.
check_report() {
    local deadline=$((SECONDS + DELIVERY_TIMEOUT_S)) rows=""
    say "waiting for every row of $REPORT_KEY to be final (the host's postroom status --json, port $PG_PORT)"
    while true; do
        rows=$(host_postroom status --key "$REPORT_KEY" --json 2>/dev/null || true)
        if "$VENV_PY" - "$rows" <<'EOF'
import json, sys
rows = [json.loads(line) for line in sys.argv[1].splitlines() if line.strip()]
final = {"sent", "failed", "dead"}
sys.exit(0 if len(rows) == 4 and all(row["status"] in final for row in rows) else 1)
EOF
        then break; fi
        [[ $SECONDS -lt $deadline ]] || { host_postroom status --key "$REPORT_KEY" || true;
            die "the report's rows were not all final after ${DELIVERY_TIMEOUT_S}s"; }
        sleep 2
    done
    host_postroom status --key "$REPORT_KEY"
    # Kafka from the host: the EXTERNAL listener advertises the published port.
    say "postroom lag from the host (Kafka on localhost:$KAFKA_PORT)"
    host_postroom lag >"$WORK/lag.out" 2>&1 || die "postroom lag from the host failed" "$WORK/lag.out"
    grep -vE '^[[:space:]]+[^[:space:]]+\[[0-9]+\] ' "$WORK/lag.out" | sed 's/^/    /' || true
    "$VENV_PY" - "$rows" "http://127.0.0.1:$MAILPIT_PORT/api/v1/messages" <<'EOF' || die "the report did not end as expected"
import json, sys, urllib.request
rows = {row["recipient"]: row for row in map(json.loads, sys.argv[1].splitlines()) if row}
expected = {"finance@example.com": "sent", "ops@example.com": "sent",
            "ceo@example.com": "sent", "old.manager@example.com": "failed"}
got = {recipient: row["status"] for recipient, row in rows.items()}
wrong = [f"{r}: {got.get(r)} (expected {s})" for r, s in expected.items() if got.get(r) != s]
wrong += [f"{r}: {row['attempts']} attempts" for r, row in rows.items() if row["attempts"] != 1]
if "550" not in str(rows["old.manager@example.com"].get("last_error")):
    wrong.append(f"old.manager@example.com: last error {rows['old.manager@example.com'].get('last_error')!r}")
with urllib.request.urlopen(sys.argv[2], timeout=5) as reply:
    messages = json.load(reply)["messages"]
delivered = sorted(to["Address"] for m in messages for to in m["To"])
if delivered != sorted(r for r, s in expected.items() if s == "sent"):
    wrong.append(f"Mailpit holds messages to {delivered}")
if any(m["AttachmentNames"] != ["sales_2026-09.xlsx"] for m in messages):
    wrong.append(f"attachments in Mailpit: {[m['AttachmentNames'] for m in messages]}")
for line in wrong:
    print("compose-test: " + line, file=sys.stderr)
print(f"compose-test: Mailpit holds {len(messages)} messages, each with the workbook attached")
sys.exit(1 if wrong else 0)
EOF
}

# ---------------------------------------------------------------------------------------------

check_ports() {
    local port
    for port in "$PG_PORT" "$KAFKA_PORT" "$REGISTRY_PORT" "$MAILPIT_PORT"; do
        [[ $port =~ ^[0-9]+$ ]] || die "POSTROOM_COMPOSE_PORTS: not a port: $port"
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            die "port $port is taken (set POSTROOM_COMPOSE_PORTS to four free ones)"
        fi
    done
}

teardown() {
    local rc=$?
    trap - EXIT INT TERM
    # Gone already after a Ctrl-C: under set -e a failed kill would end the trap here.
    if [[ -n ${HEALTH_PID:-} ]]; then kill "$HEALTH_PID" 2>/dev/null || true; fi
    if [[ -n ${STACK_UP:-} ]]; then
        if [[ ${POSTROOM_COMPOSE_KEEP:-} == 1 ]]; then
            say "left running (POSTROOM_COMPOSE_KEEP=1); the podman API stays on $SOCKET"
            return
        fi
        say "docker compose stop (SIGTERM, up to ${STOP_TIMEOUT_S}s each before SIGKILL)"
        compose stop --timeout "$STOP_TIMEOUT_S" >"$WORK/down.log" 2>&1 || true
        # 137: the container ignored SIGTERM until it was killed; a postroom role must not.
        local killed
        killed=$(podman ps -a --filter "label=com.docker.compose.project=$PROJECT" \
            --format '{{.Names}} {{.Status}}' | grep -F 'Exited (137)' || true)
        if [[ -n $killed ]]; then
            printf 'compose-test: killed after %ss instead of stopping on SIGTERM: %s\n' \
                "$STOP_TIMEOUT_S" "$killed" >&2
            [[ $rc -ne 0 ]] || rc=1
        fi
        compose logs --no-color >"$WORK/stack.log" 2>&1 || true
        say "docker compose down --volumes (the stack's logs: ${WORK#"$REPO"/}/stack.log)"
        compose down --volumes --remove-orphans --timeout "$STOP_TIMEOUT_S" >>"$WORK/down.log" 2>&1 \
            || printf 'compose-test: compose down failed (see %s)\n' "$WORK/down.log" >&2
    fi
    rm -rf "$ATTACH_DIR"
    rmdir "$REPO/attachments" 2>/dev/null || true
    if [[ -n ${PODMAN_SERVICE_PID:-} ]]; then kill "$PODMAN_SERVICE_PID" 2>/dev/null || true; fi
    if [[ $rc -eq 0 ]]; then say "passed in $((SECONDS - T0)) s"; else say "FAILED (exit $rc)"; fi
    exit "$rc"
}

main() {
    mkdir -p "$WORK"
    [[ -x $VENV_PY ]] || die "no $VENV_PY: run make venv first"
    # Rootful podman: its network (netavark), runroot under /run and apt-get need root.
    [[ $(id -u) -eq 0 ]] || die "run as root: the stack runs on rootful podman (sudo make compose-test)"
    check_ports
    ensure_packages
    write_containers_conf
    trap teardown EXIT INT TERM
    ensure_compose
    say "starting podman's Docker-compatible API on ${SOCKET#"$REPO"/}"
    start_podman_service
    ensure_standins
    say "building postroom:local from the Dockerfile (docker compose build)"
    compose build >"$WORK/compose-build-image.log" 2>&1 \
        || die "docker compose build failed" "$WORK/compose-build-image.log"
    compose down --volumes --remove-orphans >/dev/null 2>&1 || true
    run_healthchecks &
    HEALTH_PID=$!
    STACK_UP=1
    say "docker compose up -d (init waits for postgres, kafka and registry to be healthy)"
    compose up -d >"$WORK/compose-up.log" 2>&1 || die "docker compose up failed" "$WORK/compose-up.log"
    say "waiting for every healthcheck"
    wait_healthy
    podman ps -a --filter "label=com.docker.compose.project=$PROJECT" --format '    {{.Names}}  {{.Status}}'
    send_report
    check_report
}

# Sourced (bash -c ". scripts/compose-test.sh; ensure_standins"), it only defines its functions.
if [[ ${BASH_SOURCE[0]} == "$0" ]]; then main "$@"; fi
