#!/usr/bin/env bash
# The local stack postroom's tests, demo and benchmarks run against: a single-node Kafka
# (KRaft, broker+controller in one JVM; POSTROOM_DEV_BROKERS=3 for a cluster of three brokers
# and three controllers, each a JVM of its own), a throwaway PostgreSQL cluster and an Apicurio
# Schema Registry (in-memory storage), all on 127.0.0.1.
#
#   scripts/services.sh up       start all three (idempotent), write $POSTROOM_DEV_DIR/env
#   scripts/services.sh down     stop them; Kafka and PostgreSQL data is kept
#   scripts/services.sh status   what runs; exit 0 when all run, 3 otherwise
#   scripts/services.sh env      print the env file (source it: . .dev/env)
#   scripts/services.sh clean    down, then delete all data
#   scripts/services.sh kill-kafka        SIGKILL this stack's Kafka JVMs (fault injection; `up` restarts them)
#   scripts/services.sh restart-postgres  fast shutdown and restart of this stack's PostgreSQL
# On a cluster (POSTROOM_DEV_BROKERS above 1), for the failover suite:
#   scripts/services.sh kill-broker N     SIGKILL broker N (1..POSTROOM_DEV_BROKERS)
#   scripts/services.sh stop-broker N     SIGTERM broker N and wait until it has stopped (a clean
#                                         shutdown: its leaderships move first)
#   scripts/services.sh start-broker N    start broker N and wait until it answers
#   scripts/services.sh kill-controller N / stop-controller N / start-controller N   the same for
#                                         controller N (node id 100+N)
#   scripts/services.sh controller        print N of the active KRaft controller
#   scripts/services.sh leader TOPIC [P]  print the broker leading partition P (default 0)
#
# Environment (all optional):
#   POSTROOM_DEV_DIR                    state dir (default: <repo>/.dev)
#   POSTROOM_DEV_BROKERS                Kafka brokers: 1 (default: one JVM, broker and controller)
#                                       or more (that many brokers and as many controllers, each
#                                       in a JVM of its own); kept in the state dir by `up`, so
#                                       later commands need it not. Broker N's ports and
#                                       controller N's are node 1's + 10*(N-1): with the default
#                                       ports 19092/19093/19094, then 19102/19103/19104, ...
#   POSTROOM_DEV_KAFKA_PORT             Kafka PLAINTEXT listener (default 19092)
#   POSTROOM_DEV_KAFKA_CONTROLLER_PORT  KRaft controller listener (default 19093)
#   POSTROOM_DEV_KAFKA_SECURE_PORT      Kafka SASL_SSL (SCRAM-SHA-512) listener (default: the
#                                       PLAINTEXT port + 2, 19094)
#   POSTROOM_DEV_PG_PORT                PostgreSQL (default 15432)
#   POSTROOM_DEV_PG_BIN                 folder holding pg_ctl/initdb (default: found)
#   POSTROOM_DEV_REGISTRY_PORT          Schema Registry HTTP (default 18081)
#   POSTROOM_DEV_REGISTRY_JAVA          a java 21+ for the registry (default: found)
#   POSTROOM_DEV_KAFKA_JIT              the Kafka JVMs' compilers: quick (C1 only, the registry's
#                                       choice too) or full (C1 then C2, as in production; make
#                                       bench and the cluster targets ask for it); kept in the
#                                       state dir while the stack runs (default: the running
#                                       stack's, else quick). C2 spent about 30 of a fresh
#                                       broker's 83 CPU-s over 390 of the tests.
# `up` keeps the ports in $POSTROOM_DEV_DIR/ports: later commands on that state dir (status, down,
# ...) use them where the variables are not set, so a new shell finds the stack it started.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEV_DIR=$(realpath -m "${POSTROOM_DEV_DIR:-$REPO/.dev}")
# The ports the last `up` in this state dir started the stack with: a later command from a new
# shell (status, down, ...) finds the same stack without the POSTROOM_DEV_*_PORT variables. A
# variable that is set wins.
PORTS_FILE="$DEV_DIR/ports"
remembered_port() {
    [[ -f $PORTS_FILE ]] || return 0
    sed -n "s/^$1=\([0-9]*\)\$/\1/p" "$PORTS_FILE" | tail -n 1
}
KAFKA_PORT=${POSTROOM_DEV_KAFKA_PORT:-$(remembered_port POSTROOM_DEV_KAFKA_PORT)}
KAFKA_PORT=${KAFKA_PORT:-19092}
CONTROLLER_PORT=${POSTROOM_DEV_KAFKA_CONTROLLER_PORT:-$(remembered_port POSTROOM_DEV_KAFKA_CONTROLLER_PORT)}
CONTROLLER_PORT=${CONTROLLER_PORT:-19093}
# Beside the PLAINTEXT port by default, so stacks started with distinct ports stay distinct.
SECURE_PORT=${POSTROOM_DEV_KAFKA_SECURE_PORT:-$(remembered_port POSTROOM_DEV_KAFKA_SECURE_PORT)}
if [[ -z $SECURE_PORT && $KAFKA_PORT =~ ^[0-9]+$ ]]; then
    SECURE_PORT=$((10#$KAFKA_PORT + 2))
elif [[ -z $SECURE_PORT ]]; then
    SECURE_PORT=$KAFKA_PORT # refused by check_port in main, naming POSTROOM_DEV_KAFKA_PORT
fi
PG_PORT=${POSTROOM_DEV_PG_PORT:-$(remembered_port POSTROOM_DEV_PG_PORT)}
PG_PORT=${PG_PORT:-15432}
REGISTRY_PORT=${POSTROOM_DEV_REGISTRY_PORT:-$(remembered_port POSTROOM_DEV_REGISTRY_PORT)}
REGISTRY_PORT=${REGISTRY_PORT:-18081}
HOST=127.0.0.1
# The compilers the running stack's Kafka JVMs started with (a node restarted by a fault test
# keeps its stack's; `down` forgets them), else quick; the variable wins. A damaged file reads
# as quick: it must never keep `down` from stopping the stack.
JIT_FILE="$DEV_DIR/kafka-jit"
remembered_jit() {
    local jit=
    { read -r jit _ <"$JIT_FILE"; } 2>/dev/null || true
    [[ ${jit%$'\r'} == full ]] && echo full || echo quick
}
KAFKA_JIT=${POSTROOM_DEV_KAFKA_JIT:-$(remembered_jit)}

KAFKA_POM="$REPO/dev/kafka/pom.xml"
# The pom is the one place the Kafka version is pinned.
KAFKA_VERSION=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$KAFKA_POM")
KAFKA_CACHE="$REPO/.cache/kafka-$KAFKA_VERSION"
KAFKA_LIBS="$KAFKA_CACHE/libs"
# How many Kafka nodes: the variable, else what the last `up` in this state dir started, else 1.
BROKERS_FILE="$DEV_DIR/kafka-brokers"
BROKERS=${POSTROOM_DEV_BROKERS:-$(cat "$BROKERS_FILE" 2>/dev/null || echo 1)}
NODE_PORT_STRIDE=10
# The cluster's id, shared by every node's storage (the single node makes its own at format).
CLUSTER_ID_FILE="$DEV_DIR/kafka-cluster-id"
# NODE_*, KAFKA_DIR, KAFKA_DATA, KAFKA_PIDFILE, KAFKA_LOG, KAFKA_OUT: set by select_node.
KAFKA_START_TIMEOUT_S=60
KAFKA_STOP_TIMEOUT_S=30

# PostgreSQL refuses to run as root, so as root the cluster runs as the `postgres` user. That
# user may not be able to traverse the repo's parents (/root, a CI clone...), so the cluster
# lives under /tmp, one per state dir; $DEV_DIR/pg is a symlink to it for people to find.
PG_ROOT="/tmp/postroom-pg-$(printf '%s' "$DEV_DIR" | sha1sum | cut -c1-12)"
PG_DATA="$PG_ROOT/data"
PG_SOCKETS="$PG_ROOT/run"
PG_LOG="$PG_ROOT/postgres.log"
PG_START_TIMEOUT_S=60

# Apicurio Registry: a Quarkus application from Maven Central, unpacked once per version.
REGISTRY_VERSION=3.3.3
REGISTRY_ARTIFACT="io.apicurio:apicurio-registry-app:$REGISTRY_VERSION:tar.gz:all"
REGISTRY_CACHE="$REPO/.cache/apicurio-registry-$REGISTRY_VERSION"
REGISTRY_APP="$REGISTRY_CACHE/app"
REGISTRY_DIR="$DEV_DIR/registry"
REGISTRY_PIDFILE="$REGISTRY_DIR/registry.pid"
REGISTRY_OUT="$REGISTRY_DIR/registry.out"
REGISTRY_START_TIMEOUT_S=120
REGISTRY_JAVA_MIN=21

VENV_PY="$REPO/.venv/bin/python"
ENV_FILE="$DEV_DIR/env"
APT_UPDATED=0

say() { printf 'services: %s\n' "$*"; }
warn() { printf 'services: %s\n' "$*" >&2; }

# die MESSAGE [LOGFILE...]: explain, show the end of each log that may say why, exit 1.
die() {
    local message=$1
    shift
    warn "ERROR: $message"
    local log
    for log in "$@"; do
        if [[ -s $log ]]; then
            warn "---- last lines of $log ----"
            tail -n 40 "$log" >&2 || true
            warn "---- end of $log ----"
        fi
    done
    exit 1
}

check_port() {
    if ! [[ $2 =~ ^[0-9]+$ ]] || ((10#$2 < 1 || 10#$2 > 65535)); then
        die "$1=$2 is not a TCP port"
    fi
}

port_answers() { (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null; }

# A zombie (state Z) has exited and only waits for its new parent, init, to reap it.
pid_alive() {
    [[ -n ${1:-} ]] && kill -0 "$1" 2>/dev/null || return 1
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    stat=${stat##*) }
    [[ ${stat%% *} != Z ]]
}

# ---------------------------------------------------------------------------------------------
# System packages

as_root() {
    if [[ $EUID -eq 0 ]]; then
        "$@"
    elif command -v sudo >/dev/null; then
        sudo -n "$@"
    else
        return 1
    fi
}

# apt_install PACKAGE...: install without prompts and without starting any daemon the package
# ships (policy-rc.d answering 101 tells invoke-rc.d "not now"): we want binaries, not services.
apt_install() {
    command -v apt-get >/dev/null || die "apt-get not found; install $* by hand"
    local policy=/usr/sbin/policy-rc.d placed=0 rc=0
    if [[ $APT_UPDATED -eq 0 ]]; then
        say "apt-get update (to install $*)"
        as_root env DEBIAN_FRONTEND=noninteractive apt-get -qq -o DPkg::Lock::Timeout=300 update \
            || die "apt-get update failed (root needed: run as root or with passwordless sudo)"
        APT_UPDATED=1
    fi
    if ! as_root test -e "$policy"; then
        as_root sh -c "printf '#!/bin/sh\nexit 101\n' > $policy && chmod 755 $policy" && placed=1
    fi
    say "apt-get install $*"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get -qq -y -o DPkg::Lock::Timeout=300 \
        -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
        install --no-install-recommends "$@" >/dev/null || rc=$?
    if [[ $placed -eq 1 ]]; then as_root rm -f "$policy"; fi
    [[ $rc -eq 0 ]] || die "apt-get install $* failed (exit $rc)"
}

# smtp-sink (from postfix) is what the benchmarks deliver to; the postfix MTA must not run.
ensure_smtp_sink() {
    if command -v smtp-sink >/dev/null || [[ -x /usr/sbin/smtp-sink ]]; then
        return
    fi
    say "smtp-sink missing: installing postfix for its tools (the mail server stays off)"
    as_root sh -c 'echo "postfix postfix/main_mailer_type select No configuration" \
        | debconf-set-selections' || die "could not preseed debconf for postfix"
    apt_install postfix
    if as_root postfix status >/dev/null 2>&1; then
        say "stopping the postfix daemon the package started"
        as_root postfix stop >/dev/null 2>&1 || true
    fi
    [[ -x /usr/sbin/smtp-sink ]] || command -v smtp-sink >/dev/null \
        || die "postfix installed but smtp-sink is still missing"
}

ensure_java_and_maven() {
    local missing=()
    command -v java >/dev/null || missing+=(default-jre-headless)
    command -v mvn >/dev/null || missing+=(maven)
    if [[ ${#missing[@]} -gt 0 ]]; then apt_install "${missing[@]}"; fi
    local major
    major=$(java -XshowSettings:properties -version 2>&1 \
        | sed -n 's/^ *java\.specification\.version = \([0-9]*\).*/\1/p')
    [[ ${major:-0} -ge 17 ]] || die "Kafka $KAFKA_VERSION needs Java 17 or newer, found ${major:-?}"
}

# Sets PG_BIN to the folder holding initdb and pg_ctl, installing PostgreSQL when absent.
# Debian keeps them off PATH, under /usr/lib/postgresql/<major>/bin.
find_pg_bin() {
    if [[ -n ${POSTROOM_DEV_PG_BIN:-} ]]; then
        PG_BIN=$POSTROOM_DEV_PG_BIN
    elif command -v pg_ctl >/dev/null && command -v initdb >/dev/null; then
        PG_BIN=$(dirname "$(realpath "$(command -v pg_ctl)")")
    else
        PG_BIN=$(find /usr/lib/postgresql -mindepth 3 -maxdepth 3 -path '*/bin/pg_ctl' \
            2>/dev/null | sort -V | tail -n 1 | xargs -r dirname)
    fi
    [[ -n ${PG_BIN:-} && -x $PG_BIN/pg_ctl && -x $PG_BIN/initdb ]]
}

ensure_postgres_installed() {
    if ! find_pg_bin; then
        say "PostgreSQL server not found: installing it"
        apt_install postgresql
        find_pg_bin || die "postgresql installed but pg_ctl/initdb are still missing"
    fi
    if [[ $EUID -eq 0 ]] && ! id postgres >/dev/null 2>&1; then
        local why="as root the cluster runs as 'postgres' (PostgreSQL refuses root)"
        die "the 'postgres' user is missing; $why. apt-get install postgresql creates it"
    fi
}

# The project's venv: its confluent_kafka tells when the broker answers.
ensure_venv() {
    if ! "$VENV_PY" -c 'import confluent_kafka' 2>/dev/null; then
        "$REPO/scripts/bootstrap.sh"
    fi
}

# ---------------------------------------------------------------------------------------------
# Kafka

# Fetch the broker's jars once per version and pom; the stamp holds the pom's hash so an edit
# to the pom refetches, and a fetch cut short is never taken for a complete one.
fetch_kafka() {
    local stamp="$KAFKA_CACHE/.complete" want
    want=$(sha256sum "$KAFKA_POM" | cut -d' ' -f1)
    if [[ -d $KAFKA_LIBS && -f $stamp && $(cat "$stamp") == "$want" ]]; then
        return
    fi
    say "fetching Kafka $KAFKA_VERSION jars with Maven into ${KAFKA_LIBS#"$REPO"/} (first run only)"
    mkdir -p "$KAFKA_CACHE"
    local tmp="$KAFKA_CACHE/libs.partial" mvn_log="$KAFKA_CACHE/maven.log"
    rm -rf "$tmp"
    if ! mvn -q -B -Dstyle.color=never -f "$KAFKA_POM" dependency:copy-dependencies \
        -DincludeScope=runtime -DoutputDirectory="$tmp" >"$mvn_log" 2>&1; then
        die "Maven could not fetch Kafka $KAFKA_VERSION (is Maven Central reachable?)" "$mvn_log"
    fi
    rm -rf "$KAFKA_LIBS"
    mv "$tmp" "$KAFKA_LIBS"
    printf '%s\n' "$want" >"$stamp"
}

# select_node N: point the per-node globals at node N. The single node keeps the layout of a
# stack from before clusters ($DEV_DIR/kafka), so a running one is found again.
#
# A cluster runs its controllers apart from its brokers, as a platform does (Kafka advises
# against combined nodes beyond development): two brokers down leave a controller majority that
# shrinks the in-sync replicas and refuses writes with NOT_ENOUGH_REPLICAS, and a controller
# failover moves no partition leader. Controller N is node id CONTROLLER_ID_BASE+N.
CONTROLLER_ID_BASE=100

# select_node N [broker|controller]
select_node() {
    NODE_N=$1
    NODE_ROLE=${2:-broker}
    local offset=$(((NODE_N - 1) * NODE_PORT_STRIDE))
    NODE_PORT=$((10#$KAFKA_PORT + offset))
    NODE_CONTROLLER_PORT=$((10#$CONTROLLER_PORT + offset))
    NODE_SECURE_PORT=$((10#$SECURE_PORT + offset))
    if [[ $BROKERS -eq 1 ]]; then
        NODE_ID=1
        KAFKA_DIR="$DEV_DIR/kafka"
    elif [[ $NODE_ROLE == controller ]]; then
        NODE_ID=$((CONTROLLER_ID_BASE + NODE_N))
        KAFKA_DIR="$DEV_DIR/controller-$NODE_N"
    else
        NODE_ID=$NODE_N
        KAFKA_DIR="$DEV_DIR/broker-$NODE_N"
    fi
    KAFKA_DATA="$KAFKA_DIR/data"
    KAFKA_PIDFILE="$KAFKA_DIR/kafka.pid"
    KAFKA_LOG="$KAFKA_DIR/broker.log"
    KAFKA_OUT="$KAFKA_DIR/kafka.out"
}

# node_list TEMPLATE: TEMPLATE for each node, {id}, {plain}, {controller} and {secure} replaced
# by its id and ports, joined by commas.
node_list() {
    local n offset item out=()
    for ((n = 1; n <= BROKERS; n++)); do
        offset=$(((n - 1) * NODE_PORT_STRIDE))
        item=${1//\{id\}/$n}
        item=${item//\{plain\}/$((10#$KAFKA_PORT + offset))}
        item=${item//\{controller\}/$((10#$CONTROLLER_PORT + offset))}
        item=${item//\{secure\}/$((10#$SECURE_PORT + offset))}
        out+=("$item")
    done
    local IFS=,
    echo "${out[*]}"
}

plain_bootstrap() { node_list "$HOST:{plain}"; }
secure_bootstrap_servers() { node_list "$HOST:{secure}"; }

# The voters: every controller of a cluster, the one node of a single broker.
quorum_voters() {
    if [[ $BROKERS -eq 1 ]]; then
        echo "1@$HOST:$CONTROLLER_PORT"
    else
        local n out=()
        for ((n = 1; n <= BROKERS; n++)); do
            out+=("$((CONTROLLER_ID_BASE + n))@$HOST:$((10#$CONTROLLER_PORT + (n - 1) * NODE_PORT_STRIDE))")
        done
        local IFS=,
        echo "${out[*]}"
    fi
}

# A node argument of the per-node commands: 1..BROKERS, on a cluster.
check_node() {
    [[ $BROKERS -gt 1 ]] || die "$2 works on a cluster only (POSTROOM_DEV_BROKERS=3 scripts/services.sh up)"
    [[ ${1:-} =~ ^[0-9]+$ ]] && ((10#$1 >= 1 && 10#$1 <= BROKERS)) \
        || die "node '${1:-}' is not one of 1..$BROKERS (POSTROOM_DEV_BROKERS=$BROKERS)"
}

kafka_pid() {
    local pid
    pid=$(cat "$KAFKA_PIDFILE" 2>/dev/null) || return 1
    # A recycled pid would belong to some other program: check it is our broker.
    pid_alive "$pid" && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null \
        | grep -qF "kafka.Kafka $KAFKA_DIR/server.properties" && echo "$pid"
}

write_kafka_config() {
    local roles listeners
    if [[ $BROKERS -eq 1 ]]; then
        roles=broker,controller
        listeners="listeners=PLAINTEXT://$HOST:$NODE_PORT,CONTROLLER://$HOST:$NODE_CONTROLLER_PORT,SASL_SSL://$HOST:$NODE_SECURE_PORT
advertised.listeners=PLAINTEXT://$HOST:$NODE_PORT,SASL_SSL://$HOST:$NODE_SECURE_PORT"
    elif [[ $NODE_ROLE == controller ]]; then
        roles=controller
        listeners="listeners=CONTROLLER://$HOST:$NODE_CONTROLLER_PORT"
    else
        roles=broker
        listeners="listeners=PLAINTEXT://$HOST:$NODE_PORT,SASL_SSL://$HOST:$NODE_SECURE_PORT
advertised.listeners=PLAINTEXT://$HOST:$NODE_PORT,SASL_SSL://$HOST:$NODE_SECURE_PORT"
    fi
    local inter_broker="inter.broker.listener.name=PLAINTEXT"
    [[ $roles != controller ]] || inter_broker="# a controller: no inter-broker listener"
    # Written at every start so a port change takes effect; formatting happens only once.
    cat >"$KAFKA_DIR/server.properties" <<EOF
# Generated by scripts/services.sh at each start; edit that script, not this file.
process.roles=$roles
node.id=$NODE_ID
controller.quorum.voters=$(quorum_voters)
$listeners
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_SSL:SASL_SSL
$inter_broker
controller.listener.names=CONTROLLER
log.dirs=$KAFKA_DATA
# postroom creates every topic it uses; a typo must fail, not create a topic.
auto.create.topics.enable=false
num.partitions=1
default.replication.factor=$REPLICATION
min.insync.replicas=$MIN_ISR
offsets.topic.replication.factor=$REPLICATION
# fewer internal partitions: the first consumer group of a test run is ready sooner
offsets.topic.num.partitions=10
transaction.state.log.replication.factor=$REPLICATION
transaction.state.log.min.isr=$MIN_ISR
transaction.state.log.num.partitions=10
share.coordinator.state.topic.replication.factor=$REPLICATION
share.coordinator.state.topic.min.isr=$MIN_ISR
group.initial.rebalance.delay.ms=0
# group.coordinator.rebalance.protocols is left at 4.1's default, classic,consumer,streams:
# clients may use either group.protocol=classic or KIP-848's group.protocol=consumer.
# KIP-848 groups may set their own session timeout down to 6 s, as classic groups may
# (group.min.session.timeout.ms); Kafka's floor for them is 45 s, and its heartbeat floor 5 s.
# Their default stays Kafka's 45 s, so a group joins with KIP-848 only once its own
# consumer.session.timeout.ms is set (postroom.kafka.group_protocol).
group.consumer.min.session.timeout.ms=6000
group.consumer.min.heartbeat.interval.ms=1000
EOF
    cat >"$KAFKA_DIR/log4j2.properties" <<EOF
# Generated by scripts/services.sh. WARN and up, plus the lines that say the broker started
# and stopped; rolled at 10 MB so long test runs stay small.
status = warn
appender.file.type = RollingFile
appender.file.name = file
appender.file.fileName = $KAFKA_LOG
appender.file.filePattern = $KAFKA_LOG.%i
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
appender.file.policies.type = Policies
appender.file.policies.size.type = SizeBasedTriggeringPolicy
appender.file.policies.size.size = 10MB
appender.file.strategy.type = DefaultRolloverStrategy
appender.file.strategy.max = 2
rootLogger.level = warn
rootLogger.appenderRef.file.ref = file
logger.raftserver.name = kafka.server.KafkaRaftServer
logger.raftserver.level = info
logger.broker.name = kafka.server.BrokerServer
logger.broker.level = info
logger.controller.name = kafka.server.ControllerServer
logger.controller.level = info
EOF
}

format_kafka_storage() {
    [[ -f $KAFKA_DATA/meta.properties ]] && return
    say "formatting Kafka storage in ${KAFKA_DATA} (once)"
    local cluster_id out="$KAFKA_DIR/format.out"
    if [[ $BROKERS -gt 1 && -s $CLUSTER_ID_FILE ]]; then
        cluster_id=$(cat "$CLUSTER_ID_FILE")
    else
        cluster_id=$(java -cp "$KAFKA_LIBS/*" kafka.tools.StorageTool random-uuid 2>"$out") \
            || die "kafka StorageTool random-uuid failed" "$out"
        if [[ $BROKERS -gt 1 ]]; then printf '%s\n' "$cluster_id" >"$CLUSTER_ID_FILE"; fi
    fi
    java -cp "$KAFKA_LIBS/*" -Dlog4j2.configurationFile="$KAFKA_DIR/log4j2.properties" \
        kafka.tools.StorageTool format --cluster-id "$cluster_id" \
        --config "$KAFKA_DIR/server.properties" >"$out" 2>&1 \
        || die "formatting Kafka storage failed" "$out"
}

# Waits until the broker answers a metadata request, or gives up when it died or took too long.
wait_for_kafka() {
    local pid=$1
    "$VENV_PY" - "$HOST:$NODE_PORT" "$pid" "$KAFKA_START_TIMEOUT_S" "$NODE_ID" <<'EOF'
import os, sys, time
from confluent_kafka.admin import AdminClient

bootstrap, pid, timeout_s, node = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
deadline = time.monotonic() + timeout_s
while time.monotonic() < deadline:
    try:
        os.kill(pid, 0)
    except OSError:
        sys.exit(2)
    try:
        # This node itself is in the metadata once it has registered with the quorum.
        if node in admin.list_topics(timeout=2).brokers:
            sys.exit(0)
    except Exception:  # not up yet: ask again
        time.sleep(0.5)
sys.exit(1)
EOF
}

# node_start: start the selected node unless it runs (no waiting); its pid in NODE_PID.
node_start() {
    mkdir -p "$KAFKA_DATA"
    secure_restart_if_missing
    local pid
    if pid=$(kafka_pid); then
        if port_answers "$(node_port)"; then
            say "$(node_name): already running (pid $pid, $HOST:$(node_port))"
            jit_check "$pid"
        else
            say "$(node_name): pid $pid runs but $HOST:$(node_port) does not answer yet; waiting"
        fi
        NODE_PID=$pid
        return
    fi
    local port
    for port in $(node_ports); do
        if port_answers "$port"; then
            local hint="set POSTROOM_DEV_KAFKA_PORT / _CONTROLLER_PORT / _SECURE_PORT"
            die "port $port is taken by another program ($hint to free ones)"
        fi
    done
    ensure_java_and_maven
    fetch_kafka
    secure_make_certs
    write_kafka_config
    write_secure_kafka_config
    format_kafka_storage
    say "$(node_name): starting Kafka $KAFKA_VERSION on $HOST:$(node_port), $KAFKA_JIT JIT (log: $KAFKA_LOG)"
    # A pid file left by a broker that died with the machine would be read below before
    # the new broker writes its own, and the new broker taken for dead.
    rm -f "$KAFKA_PIDFILE"
    printf '%s\n' "$KAFKA_JIT" >"$JIT_FILE.new" && mv -f "$JIT_FILE.new" "$JIT_FILE"
    # Three JVMs share the machine with everything else: smaller heaps than the single node's.
    local heap=(-Xms256m -Xmx512m)
    if [[ $BROKERS -gt 1 && $NODE_ROLE == controller ]]; then
        heap=(-Xms64m -Xmx192m)
    elif [[ $BROKERS -gt 1 ]]; then
        heap=(-Xms128m -Xmx384m)
    fi
    # setsid: the broker outlives this script and a Ctrl-C in the shell that ran it.
    # The inner shell writes its own pid, then becomes java with exec.
    # shellcheck disable=SC2016 # $$ and $1 belong to the inner shell
    setsid bash -c 'echo $$ >"$1"; shift; exec "$@"' _ "$KAFKA_PIDFILE" \
        java "${heap[@]}" $(jit_options) -XX:+UseG1GC -Djava.awt.headless=true \
        -Dlog4j2.configurationFile="$KAFKA_DIR/log4j2.properties" \
        -cp "$KAFKA_LIBS/*" kafka.Kafka "$KAFKA_DIR/server.properties" \
        </dev/null >"$KAFKA_OUT" 2>&1 9>&- &
    NODE_PID=$(pid_from_file "$(node_name)" "$KAFKA_PIDFILE" "$KAFKA_OUT")
}

# The Kafka JVMs' compiler options for POSTROOM_DEV_KAFKA_JIT.
jit_options() {
    [[ $KAFKA_JIT == quick ]] && echo "-XX:TieredStopAtLevel=1"
    return 0
}

# jit_check PID: a running node's compilers are those it started with; say so when they are not
# the ones asked for (a restart of the stack changes them).
jit_check() {
    local running=full cmdline
    cmdline=$({ tr '\0' '\n' <"/proc/$1/cmdline"; } 2>/dev/null) || return 0
    [[ -n $cmdline ]] || return 0 # it has exited (or is a zombie): nothing to compare
    grep -qx -- "-XX:TieredStopAtLevel=1" <<<"$cmdline" && running=quick
    if [[ $running != "$KAFKA_JIT" ]]; then
        warn "$(node_name): runs with the $running JIT, not the $KAFKA_JIT one asked for" \
            "(POSTROOM_DEV_KAFKA_JIT): stop the stack (make services-down) and start it again to change it"
    fi
}

# node_wait PID: until the selected node answers, or die saying why not.
node_wait() {
    local pid=$1 started=$SECONDS rc=0
    if [[ $NODE_ROLE == controller && $BROKERS -gt 1 ]]; then
        wait_for_controller "$pid" || rc=$?
    else
        wait_for_kafka "$pid" || rc=$?
    fi
    case $rc in
        0) say "$(node_name): ready in $((SECONDS - started)) s (pid $pid)" ;;
        2) die "$(node_name): the broker exited during startup" "$KAFKA_OUT" "$KAFKA_LOG" ;;
        *)
            stop_pid "$pid" "$(node_name)"
            die "$(node_name): no answer on $HOST:$(node_port) within $KAFKA_START_TIMEOUT_S s; stopped it" \
                "$KAFKA_OUT" "$KAFKA_LOG"
            ;;
    esac
}

# A controller serves no client request: it is up once its listener accepts connections.
wait_for_controller() {
    local pid=$1 deadline=$((SECONDS + KAFKA_START_TIMEOUT_S))
    until port_answers "$NODE_CONTROLLER_PORT"; do
        pid_alive "$pid" || return 2
        [[ $SECONDS -lt $deadline ]] || return 1
        sleep 0.5
    done
}

node_name() {
    if [[ $BROKERS -eq 1 ]]; then echo kafka; else echo "kafka $NODE_ROLE $NODE_N"; fi
}

# The port the selected node is known by, and every port it listens on.
node_port() {
    if [[ $BROKERS -gt 1 && $NODE_ROLE == controller ]]; then
        echo "$NODE_CONTROLLER_PORT"
    else
        echo "$NODE_PORT"
    fi
}

node_ports() {
    if [[ $BROKERS -eq 1 ]]; then
        echo "$NODE_PORT $NODE_CONTROLLER_PORT $NODE_SECURE_PORT"
    elif [[ $NODE_ROLE == controller ]]; then
        echo "$NODE_CONTROLLER_PORT"
    else
        echo "$NODE_PORT $NODE_SECURE_PORT"
    fi
}

# Every node of the stack as "N role", controllers first (the order to start them in).
all_nodes() {
    local n
    if [[ $BROKERS -eq 1 ]]; then
        echo "1 broker"
        return
    fi
    for ((n = 1; n <= BROKERS; n++)); do echo "$n controller"; done
    for ((n = 1; n <= BROKERS; n++)); do echo "$n broker"; done
}

# Every node started first, then waited for: a broker of a cluster answers only once a majority
# of the controllers has elected a leader. The node count is written before any starts: an `up`
# that dies part-way leaves JVMs that a later `down` (without POSTROOM_DEV_BROKERS) must find.
kafka_up() {
    local node pids=() i=0
    printf '%s\n' "$BROKERS" >"$BROKERS_FILE"
    while read -r node; do
        # shellcheck disable=SC2086 # "N role" splits in two on purpose
        select_node $node
        node_start
        pids[i++]=$NODE_PID
    done < <(all_nodes)
    i=0
    while read -r node; do
        # shellcheck disable=SC2086
        select_node $node
        node_wait "${pids[i++]}"
    done < <(all_nodes)
    select_node 1
}

# stop_pid PID NAME: SIGTERM (a clean shutdown), then SIGKILL when it takes too long.
stop_pid() {
    local pid=$1 name=$2 waited=0
    kill -TERM "$pid" 2>/dev/null || return 0
    while pid_alive "$pid"; do
        sleep 0.2
        waited=$((waited + 1))
        if [[ $waited -ge $((KAFKA_STOP_TIMEOUT_S * 5)) ]]; then
            warn "$name: pid $pid still runs after $KAFKA_STOP_TIMEOUT_S s; sending SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
            sleep 0.5
            break
        fi
    done
}

# pid_from_file NAME PIDFILE LOG: the pid a JVM just started writes to PIDFILE, within 10 s.
pid_from_file() {
    local name=$1 pidfile=$2 log=$3 waited=0
    until [[ -s $pidfile ]]; do
        sleep 0.1
        waited=$((waited + 1))
        [[ $waited -lt 100 ]] || die "$name: no pid file after 10 s" "$log"
    done
    cat "$pidfile"
}

# stop_service NAME PID PIDFILE LOG: stop a JVM of the stack (PID empty: it is not running).
stop_service() {
    local name=$1 pid=$2 pidfile=$3 log=$4
    if [[ -n $pid ]]; then
        say "$name: stopping pid $pid"
        stop_pid "$pid" "$name"
        pid_alive "$pid" && die "$name: pid $pid survived SIGKILL" "$log"
        say "$name: stopped"
    else
        say "$name: not running"
    fi
    rm -f "$pidfile"
}

# Brokers before controllers: a broker's clean shutdown asks the controller to move its leaders.
kafka_down() {
    local node
    while read -r node; do
        # shellcheck disable=SC2086
        select_node $node
        stop_service "$(node_name)" "$(kafka_pid || true)" "$KAFKA_PIDFILE" "$KAFKA_LOG"
    done < <(all_nodes | tac)
    select_node 1
}

# service_status NAME PID_FUNCTION PORT DETAIL: says whether NAME runs and answers on PORT;
# fails unless it does.
service_status() {
    local name=$1 pid_of=$2 port=$3 detail=$4 pid
    if pid=$("$pid_of") && port_answers "$port"; then
        say "$name: running (pid $pid, $detail)"
    elif [[ -n ${pid:-} ]]; then
        say "$name: pid $pid runs but $HOST:$port does not answer"
        return 1
    else
        say "$name: stopped"
        return 1
    fi
}

kafka_status() {
    local node rc=0
    while read -r node; do
        # shellcheck disable=SC2086
        select_node $node
        if ! service_status "$(node_name)" kafka_pid "$(node_port)" "$HOST:$(node_port), data $KAFKA_DATA"; then
            rc=1
            continue
        fi
        [[ $BROKERS -eq 1 || $NODE_ROLE == broker ]] || continue
        if port_answers "$NODE_SECURE_PORT"; then
            say "$(node_name): SASL_SSL on $HOST:$NODE_SECURE_PORT"
        else
            say "$(node_name): SASL_SSL on $HOST:$NODE_SECURE_PORT does not answer"
        fi
    done < <(all_nodes)
    select_node 1
    return $rc
}

# ---------------------------------------------------------------------------------------------
# Kafka's secured listener: SASL_SSL with SCRAM-SHA-512, a throwaway CA, ACLs per role
#
# Everything here is made once: the CA and the broker's certificate once per $SECURE_DIR, the
# SCRAM users and the admin's rights once per Kafka data dir (a stamp in the data dir says so).
# The PLAINTEXT and CONTROLLER listeners authenticate nobody: their principal is User:ANONYMOUS,
# which is a super user because the broker's own controller and inter-broker traffic uses it.
# That also keeps everything allowed on the PLAINTEXT listener for the rest of the suite; the
# listener binds 127.0.0.1 only. On SASL_SSL, only what the ACLs grant is allowed.

SECURE_DIR="$DEV_DIR/secure"
SECURE_ROLES=(relay sender recorder bounces admin)
SECURE_CERT_DAYS=825
SCRAM_ITERATIONS=8192

# secure_make_certs: a CA, and a broker certificate for 127.0.0.1/localhost signed by it, in a
# PKCS12 keystore whose password lives in a file beside it.
secure_make_certs() {
    mkdir -p "$SECURE_DIR"
    chmod 700 "$SECURE_DIR"
    [[ -s $SECURE_DIR/broker.p12 && -s $SECURE_DIR/ca.crt ]] && return
    command -v openssl >/dev/null || apt_install openssl
    say "kafka: making a throwaway CA and broker certificate in $SECURE_DIR (once)"
    local out="$SECURE_DIR/openssl.out"
    (
        set -e
        cd "$SECURE_DIR"
        umask 077
        openssl rand -hex 24 >broker.p12.password
        openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt \
            -days "$SECURE_CERT_DAYS" -subj "/CN=postroom dev CA" \
            -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign
        openssl req -newkey rsa:2048 -nodes -keyout broker.key -out broker.csr \
            -subj "/CN=localhost"
        printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' >broker.ext
        openssl x509 -req -in broker.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
            -out broker.crt -days "$SECURE_CERT_DAYS" -extfile broker.ext
        openssl pkcs12 -export -in broker.crt -inkey broker.key -certfile ca.crt \
            -name broker -out broker.p12.partial -passout file:broker.p12.password
        mv broker.p12.partial broker.p12
        rm -f broker.csr broker.ext
        chmod 644 ca.crt
    ) >"$out" 2>&1 || die "kafka: making the dev certificates failed" "$out"
}

# The broker settings of the SASL_SSL listener, appended to server.properties at each start.
write_secure_kafka_config() {
    if [[ $BROKERS -gt 1 && $NODE_ROLE == controller ]]; then
        # A controller serves no client, but authorizes what the brokers forward to it.
        cat >>"$KAFKA_DIR/server.properties" <<EOF
# ---- the ACLs of the SASL_SSL listener (scripts/services.sh: secure_* functions) ----
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=false
super.users=User:ANONYMOUS
EOF
        chmod 600 "$KAFKA_DIR/server.properties"
        return
    fi
    cat >>"$KAFKA_DIR/server.properties" <<EOF
# ---- the SASL_SSL listener (scripts/services.sh: secure_* functions) ----
listener.name.sasl_ssl.sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.ssl.keystore.type=PKCS12
listener.name.sasl_ssl.ssl.keystore.location=$SECURE_DIR/broker.p12
listener.name.sasl_ssl.ssl.keystore.password=$(cat "$SECURE_DIR/broker.p12.password")
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=false
# ANONYMOUS is the principal of the PLAINTEXT and CONTROLLER listeners (see services.sh).
super.users=User:ANONYMOUS
EOF
    chmod 600 "$KAFKA_DIR/server.properties"
}

# A broker started by a services.sh from before the SASL_SSL listener: restart it with one.
secure_restart_if_missing() {
    local pid
    [[ $BROKERS -eq 1 || $NODE_ROLE == broker ]] || return 0
    if pid=$(kafka_pid) && port_answers "$NODE_PORT" && ! port_answers "$NODE_SECURE_PORT"; then
        say "$(node_name): pid $pid has no SASL_SSL listener on $HOST:$NODE_SECURE_PORT yet; restarting it"
        stop_service "$(node_name)" "$pid" "$KAFKA_PIDFILE" "$KAFKA_LOG"
    fi
}

# One password per role, each in the properties file that role's POSTROOM_KAFKA_CONFIG_FILE names.
secure_make_passwords() {
    local role file
    for role in "${SECURE_ROLES[@]}"; do
        file="$SECURE_DIR/$role.properties"
        [[ -s $file ]] && continue
        (umask 077 && printf '# postroom-%s on the dev broker (scripts/services.sh)\nsasl.password=%s\n' \
            "$role" "$(openssl rand -hex 24)" >"$file")
    done
}

write_secure_env_files() {
    local role
    for role in "${SECURE_ROLES[@]}"; do
        cat >"$SECURE_DIR/$role.env" <<EOF
# Written by scripts/services.sh up: postroom-$role on the SASL_SSL listener.
# Source it after the stack's env: . $ENV_FILE && . $SECURE_DIR/$role.env
export POSTROOM_KAFKA_BOOTSTRAP_SERVERS=$(secure_bootstrap_servers)
export POSTROOM_KAFKA_CONFIG='security.protocol=SASL_SSL;sasl.mechanism=SCRAM-SHA-512;sasl.username=postroom-$role;ssl.ca.location=$SECURE_DIR/ca.crt'
export POSTROOM_KAFKA_CONFIG_FILE=$SECURE_DIR/$role.properties
EOF
    done
}

# secure_bootstrap: the SCRAM users (upserted with the passwords from the files, so a new
# password file takes effect) and the admin's right to manage ACLs, over the PLAINTEXT
# listener; then the roles' ACLs for the default topic prefix, applied as the admin over
# SASL_SSL. The users and the admin's rights are set at every start: a broker restarted on its
# data dir came back without the users (Kafka 4.1.1, KRaft, one node) while its ACLs stayed. The
# roles' ACLs are skipped when the data dir's stamp matches the password files.
secure_bootstrap() {
    local stamp="$KAFKA_DATA/.postroom-secure" want out="$SECURE_DIR/bootstrap.out" missing
    want=$(cat "$SECURE_DIR"/*.properties | sha256sum | cut -d' ' -f1)
    missing=$("$VENV_PY" - "$(plain_bootstrap)" "$SECURE_DIR" "$SCRAM_ITERATIONS" \
        "${SECURE_ROLES[@]}" 2>"$out" <<'EOF'
import sys
from pathlib import Path
from confluent_kafka.admin import (AclBinding, AclOperation, AclPermissionType, AdminClient,
    ResourcePatternType, ResourceType, ScramCredentialInfo, ScramMechanism,
    UserScramCredentialUpsertion)

bootstrap, secure_dir, iterations, roles = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
present = set(admin.describe_user_scram_credentials().result(timeout=30))
info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, iterations)
upserts = []
for role in roles:
    lines = (secure_dir / f"{role}.properties").read_text().splitlines()
    password = next(l.partition("=")[2] for l in lines if l.startswith("sasl.password="))
    upserts.append(UserScramCredentialUpsertion(f"postroom-{role}", info, password.encode()))
for user, future in admin.alter_user_scram_credentials(upserts).items():
    future.result()
# Only the admin manages ACLs (postroom acls apply); what it may do with topics is in its ACLs.
# Creating an ACL that exists changes nothing.
bindings = [AclBinding(ResourceType.BROKER, "kafka-cluster", ResourcePatternType.LITERAL,
                       "User:postroom-admin", "*", op, AclPermissionType.ALLOW)
            for op in (AclOperation.ALTER, AclOperation.DESCRIBE)]
for binding, future in admin.create_acls(bindings).items():
    future.result()
print(" ".join(sorted({u.user for u in upserts} - present)))
EOF
    ) || die "kafka: setting the SCRAM users failed" "$out"
    if [[ -f $stamp && $(cat "$stamp") == "$want" ]]; then
        [[ -z $missing ]] || say "kafka: the broker had lost the SCRAM users $missing; set them again"
        return
    fi
    say "kafka: the ACLs of postroom-{relay,sender,recorder,bounces,admin} (once)"
    # The roles' ACLs for the default prefix, so `. .dev/env && . .dev/secure/relay.env` works.
    # The admin's new rights reach the broker's authorizer a moment after the controller took
    # them: a refusal is asked again a few times.
    local attempt
    for attempt in 1 2 3 4 5; do
        if (
            # shellcheck disable=SC1091 # written above
            . "$ENV_FILE" && . "$SECURE_DIR/admin.env" && "$VENV_PY" -m postroom.cli acls apply
        ) >>"$out" 2>&1; then
            break
        fi
        [[ $attempt -lt 5 ]] || die "kafka: postroom acls apply as postroom-admin failed" "$out"
        sleep 1
    done
    printf '%s\n' "$want" >"$stamp"
}

secure_up() {
    # The broker read its keystore at start; a CA removed since cannot be made again under it.
    [[ -s $SECURE_DIR/ca.crt ]] || die "kafka: $SECURE_DIR/ca.crt is gone while the broker \
runs; restart the stack (scripts/services.sh down, then up) to make new certificates"
    secure_make_passwords
    write_secure_env_files
    secure_bootstrap
    say "kafka: SASL_SSL on $(secure_bootstrap_servers); role env files in $SECURE_DIR/{relay,sender,recorder,bounces,admin}.env"
}

# ---------------------------------------------------------------------------------------------
# PostgreSQL

# as_pg CMD...: run a server tool as the user that owns the cluster, from a folder it can read
# (initdb and pg_ctl fail when they cannot read their working directory), without the lock's
# fd, which the server would otherwise inherit and hold for as long as it runs.
as_pg() {
    if [[ $EUID -eq 0 ]]; then
        (cd "$PG_ROOT" && runuser -u postgres -- "$@") 9>&-
    else
        (cd "$PG_ROOT" && "$@") 9>&-
    fi
}

pg_pid() {
    local pid
    pid=$(head -n 1 "$PG_DATA/postmaster.pid" 2>/dev/null) || return 1
    pid_alive "$pid" && echo "$pid"
}

# As postgres: pg_isready as root would log "role root does not exist" at each check.
pg_answers() {
    "$PG_BIN/pg_isready" -q -h "$HOST" -p "$PG_PORT" -U postgres -d postgres
}

psql_admin() {
    "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$HOST" -p "$PG_PORT" -U postgres -d postgres "$@"
}

prepare_pg_root() {
    if [[ -e $PG_ROOT && ! -O $PG_ROOT && $EUID -ne 0 ]]; then
        die "$PG_ROOT belongs to another user"
    fi
    if [[ -e $PG_ROOT && $EUID -eq 0 && $(stat -c %U "$PG_ROOT") != postgres ]]; then
        die "$PG_ROOT exists but is not owned by postgres; remove it (scripts/services.sh clean)"
    fi
    mkdir -p "$PG_ROOT" "$PG_SOCKETS"
    chmod 700 "$PG_ROOT"
    if [[ $EUID -eq 0 ]]; then chown postgres: "$PG_ROOT" "$PG_SOCKETS"; fi
    mkdir -p "$DEV_DIR"
    ln -sfn "$PG_ROOT" "$DEV_DIR/pg"
}

init_pg_cluster() {
    [[ -f $PG_DATA/PG_VERSION ]] && return
    say "postgres: creating a throwaway cluster in $PG_DATA (once)"
    local out="$PG_ROOT/initdb.out"
    as_pg "$PG_BIN/initdb" -D "$PG_DATA" -U postgres --auth=trust --encoding=UTF8 --no-locale \
        --no-sync >"$out" 2>&1 || die "postgres: initdb failed" "$out"
    # Loopback only, trust auth: a throwaway cluster that trades durability for speed.
    cat >>"$PG_DATA/postgresql.conf" <<EOF

# ---- scripts/services.sh ----
listen_addresses = '$HOST'
unix_socket_directories = '$PG_SOCKETS'
max_connections = 200
fsync = off
synchronous_commit = off
full_page_writes = off
shared_buffers = 128MB
log_min_messages = warning
log_line_prefix = '%m [%p] %q%u@%d '
EOF
}

pg_up() {
    ensure_postgres_installed
    prepare_pg_root
    local pid
    if pid=$(pg_pid); then
        if pg_answers; then
            say "postgres: already running (pid $pid, $HOST:$PG_PORT)"
            ensure_pg_database
            return
        fi
        say "postgres: pid $pid runs but $HOST:$PG_PORT does not answer yet; waiting"
    else
        if port_answers "$PG_PORT"; then
            die "port $PG_PORT is taken by another program (set POSTROOM_DEV_PG_PORT to a free one)"
        fi
        init_pg_cluster
        say "postgres: starting on $HOST:$PG_PORT (log: $PG_LOG)"
        as_pg "$PG_BIN/pg_ctl" start -D "$PG_DATA" -l "$PG_LOG" -s -w -t "$PG_START_TIMEOUT_S" \
            -o "-p $PG_PORT" || die "postgres: pg_ctl start failed" "$PG_LOG"
    fi
    local deadline=$((SECONDS + PG_START_TIMEOUT_S))
    until pg_answers; do
        [[ $SECONDS -lt $deadline ]] \
            || die "postgres: no answer on $HOST:$PG_PORT within $PG_START_TIMEOUT_S s" "$PG_LOG"
        sleep 0.5
    done
    ensure_pg_database
    say "postgres: ready (pid $(pg_pid), $HOST:$PG_PORT)"
}

# The postroom role is a superuser so tests can create schemas and template databases.
ensure_pg_database() {
    local out="$PG_ROOT/setup.out"
    {
        psql_admin -tAc "SELECT 1 FROM pg_roles WHERE rolname = 'postroom'" | grep -q 1 \
            || psql_admin -c "CREATE ROLE postroom LOGIN SUPERUSER"
        psql_admin -tAc "SELECT 1 FROM pg_database WHERE datname = 'postroom'" | grep -q 1 \
            || psql_admin -c "CREATE DATABASE postroom OWNER postroom"
    } >"$out" 2>&1 || die "postgres: could not create role/database postroom" "$out" "$PG_LOG"
}

pg_down() {
    if pg_pid >/dev/null; then
        find_pg_bin || die "pg_ctl not found; cannot stop the cluster in $PG_DATA"
        say "postgres: stopping"
        as_pg "$PG_BIN/pg_ctl" stop -D "$PG_DATA" -m fast -s -w -t 60 \
            || die "postgres: pg_ctl stop failed" "$PG_LOG"
        say "postgres: stopped"
    else
        say "postgres: not running"
    fi
}

pg_status() {
    service_status postgres pg_pid "$PG_PORT" "$HOST:$PG_PORT, data $PG_DATA"
}

# ---------------------------------------------------------------------------------------------
# Schema Registry (Apicurio, Confluent-compatible API at /apis/ccompat/v7)

java_major() {
    "$1" -XshowSettings:properties -version 2>&1 \
        | sed -n 's/^ *java\.specification\.version = \([0-9]*\).*/\1/p'
}

# Sets REGISTRY_JAVA to a java of version 21 or newer: POSTROOM_DEV_REGISTRY_JAVA, the one on
# PATH, or the newest under /usr/lib/jvm (Kafka keeps running on the default Java 17).
find_registry_java() {
    local candidate major
    if [[ -n ${POSTROOM_DEV_REGISTRY_JAVA:-} ]]; then
        major=$(java_major "$POSTROOM_DEV_REGISTRY_JAVA")
        [[ ${major:-0} -ge $REGISTRY_JAVA_MIN ]] || die "POSTROOM_DEV_REGISTRY_JAVA=$POSTROOM_DEV_REGISTRY_JAVA is Java ${major:-?}; Apicurio Registry needs $REGISTRY_JAVA_MIN or newer"
        REGISTRY_JAVA=$POSTROOM_DEV_REGISTRY_JAVA
        return
    fi
    local candidates=()
    if command -v java >/dev/null; then candidates+=("$(command -v java)"); fi
    # newest first
    mapfile -t -O "${#candidates[@]}" candidates < <(ls -d /usr/lib/jvm/*/bin/java 2>/dev/null | sort -rV)
    for candidate in "${candidates[@]}"; do
        [[ -x $candidate ]] || continue
        major=$(java_major "$candidate")
        if [[ ${major:-0} -ge $REGISTRY_JAVA_MIN ]]; then
            REGISTRY_JAVA=$candidate
            return
        fi
    done
    die "Apicurio Registry $REGISTRY_VERSION needs Java $REGISTRY_JAVA_MIN or newer; none on PATH or under /usr/lib/jvm (install one, e.g. temurin-25-jdk, or set POSTROOM_DEV_REGISTRY_JAVA to its bin/java)"
}

# Fetch the registry once per version: downloaded and unpacked aside, made complete by a rename,
# so a fetch cut short is never taken for a complete one.
fetch_registry() {
    [[ -f $REGISTRY_APP/quarkus-run.jar ]] && return
    say "fetching Apicurio Registry $REGISTRY_VERSION with Maven into ${REGISTRY_CACHE#"$REPO"/} (first run only)"
    mkdir -p "$REGISTRY_CACHE"
    local tmp="$REGISTRY_CACHE/download.partial" mvn_log="$REGISTRY_CACHE/maven.log"
    rm -rf "$tmp"
    if ! mvn -q -B -Dstyle.color=never \
        org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy \
        -Dartifact="$REGISTRY_ARTIFACT" -DoutputDirectory="$tmp" >"$mvn_log" 2>&1; then
        die "Maven could not fetch $REGISTRY_ARTIFACT (is Maven Central reachable?)" "$mvn_log"
    fi
    mkdir -p "$tmp/app"
    tar -xzf "$tmp"/apicurio-registry-app-*.tar.gz -C "$tmp/app" \
        || die "could not unpack the Apicurio Registry archive in $tmp"
    [[ -f $tmp/app/quarkus-run.jar ]] || die "the Apicurio Registry archive holds no quarkus-run.jar"
    rm -rf "$REGISTRY_APP"
    mv "$tmp/app" "$REGISTRY_APP"
    rm -rf "$tmp"
}

registry_pid() {
    local pid
    pid=$(cat "$REGISTRY_PIDFILE" 2>/dev/null) || return 1
    # A recycled pid would belong to some other program: check it is our registry, by the jar
    # it runs and the folder it runs in, whatever its port (a shell that does not know the port
    # must still find it, or `down` would leave the JVM running with no pid file).
    pid_alive "$pid" && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF "quarkus-run.jar" \
        && [[ $(realpath "/proc/$pid/cwd" 2>/dev/null) == "$(realpath -m "$REGISTRY_DIR")" ]] \
        && echo "$pid"
}

registry_url() { echo "http://$HOST:$REGISTRY_PORT/apis/ccompat/v7"; }

# Waits until the Confluent-compatible API lists subjects, or gives up when it died or took too long.
wait_for_registry() {
    "$VENV_PY" - "$(registry_url)/subjects" "$1" "$REGISTRY_START_TIMEOUT_S" <<'EOF'
import os, sys, time, urllib.request

url, pid, timeout_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
deadline = time.monotonic() + timeout_s
while time.monotonic() < deadline:
    try:
        os.kill(pid, 0)
    except OSError:
        sys.exit(2)
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            if reply.status == 200:
                sys.exit(0)
    except OSError:  # not up yet: ask again
        time.sleep(0.5)
sys.exit(1)
EOF
}

registry_up() {
    mkdir -p "$REGISTRY_DIR"
    local pid
    if pid=$(registry_pid); then
        say "registry: already running (pid $pid, $(registry_url))"
        return
    fi
    if port_answers "$REGISTRY_PORT"; then
        die "port $REGISTRY_PORT is taken by another program (set POSTROOM_DEV_REGISTRY_PORT to a free one)"
    fi
    find_registry_java
    fetch_registry
    say "registry: starting Apicurio Registry $REGISTRY_VERSION on $(registry_url) (log: $REGISTRY_OUT)"
    rm -f "$REGISTRY_PIDFILE"
    # Both HTTP servers on loopback only: the API on its port, Quarkus's management interface
    # (0.0.0.0:9000 by default) on a free port. Storage is in memory: a restart forgets every
    # schema, as a throwaway stack should. Quick start over peak speed: serial GC, C1 only.
    # shellcheck disable=SC2016 # $$, $1 and $2 belong to the inner shell
    setsid bash -c 'echo $$ >"$1"; cd "$2"; shift 2; exec "$@"' _ "$REGISTRY_PIDFILE" "$REGISTRY_DIR" \
        "$REGISTRY_JAVA" -Xms64m -Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
        -Djava.awt.headless=true -Dquarkus.http.host="$HOST" -Dquarkus.http.port="$REGISTRY_PORT" \
        -Dquarkus.management.host="$HOST" -Dquarkus.management.port=0 \
        -jar "$REGISTRY_APP/quarkus-run.jar" </dev/null >"$REGISTRY_OUT" 2>&1 9>&- &
    pid=$(pid_from_file registry "$REGISTRY_PIDFILE" "$REGISTRY_OUT")
    local started=$SECONDS rc=0
    wait_for_registry "$pid" || rc=$?
    case $rc in
        0) say "registry: ready in $((SECONDS - started)) s (pid $pid)" ;;
        2) die "registry: Apicurio Registry exited during startup" "$REGISTRY_OUT" ;;
        *)
            stop_pid "$pid" registry
            die "registry: no answer on $(registry_url) within $REGISTRY_START_TIMEOUT_S s; stopped it" \
                "$REGISTRY_OUT"
            ;;
    esac
}

registry_down() {
    stop_service registry "$(registry_pid || true)" "$REGISTRY_PIDFILE" "$REGISTRY_OUT"
}

registry_status() {
    service_status registry registry_pid "$REGISTRY_PORT" "$(registry_url), in-memory storage"
}

# ---------------------------------------------------------------------------------------------

write_env_file() {
    cat >"$ENV_FILE" <<EOF
# Written by scripts/services.sh up; source it: . ${ENV_FILE}
export POSTROOM_DATABASE_URL=postgresql+psycopg://postroom@$HOST:$PG_PORT/postroom
export POSTROOM_KAFKA_BOOTSTRAP_SERVERS=$(plain_bootstrap)
export POSTROOM_TOPIC_REPLICATION_FACTOR=$REPLICATION
export POSTROOM_TOPIC_PARTITIONS=3
# The local Schema Registry. postroom uses a registry only when POSTROOM_SCHEMA_REGISTRY_URL
# is set (to this, say); otherwise it writes schemaless Avro.
export POSTROOM_DEV_REGISTRY_URL=$(registry_url)
# The project's venv first on the path: postroom as README's steps call it.
case ":\$PATH:" in *":$REPO/.venv/bin:"*) ;; *) export PATH="$REPO/.venv/bin:\$PATH" ;; esac
EOF
    # A cluster is never the default stack: its env names its own state dir and ports, so that
    # what sources it (the failover suite's faults: scripts/services.sh kill-broker ...) acts on
    # it and not on the default stack.
    if [[ $BROKERS -gt 1 ]]; then
        cat >>"$ENV_FILE" <<EOF
# A $BROKERS-node cluster: the commands of scripts/services.sh act on it with these.
export POSTROOM_DEV_DIR=$DEV_DIR
export POSTROOM_DEV_BROKERS=$BROKERS
export POSTROOM_DEV_KAFKA_PORT=$KAFKA_PORT
export POSTROOM_DEV_KAFKA_CONTROLLER_PORT=$CONTROLLER_PORT
export POSTROOM_DEV_KAFKA_SECURE_PORT=$SECURE_PORT
export POSTROOM_DEV_PG_PORT=$PG_PORT
export POSTROOM_DEV_REGISTRY_PORT=$REGISTRY_PORT
EOF
    fi
}

# One command at a time per state dir: two concurrent `up`s would start two brokers.
# Servers started below must not inherit fd 9 (see 9>&-), or they would hold the lock.
take_lock() {
    mkdir -p "$DEV_DIR"
    exec 9>"$DEV_DIR/services.lock"
    flock -w 300 9 || die "another scripts/services.sh holds $DEV_DIR/services.lock"
}

# The ports this stack is started with, for the commands of later shells (PORTS_FILE).
write_ports_file() {
    mkdir -p "$DEV_DIR"
    cat >"$PORTS_FILE" <<EOF
# Written by scripts/services.sh up: the ports of the stack in this state dir, read by its
# later commands when the POSTROOM_DEV_*_PORT variables are not set.
POSTROOM_DEV_KAFKA_PORT=$KAFKA_PORT
POSTROOM_DEV_KAFKA_CONTROLLER_PORT=$CONTROLLER_PORT
POSTROOM_DEV_KAFKA_SECURE_PORT=$SECURE_PORT
POSTROOM_DEV_PG_PORT=$PG_PORT
POSTROOM_DEV_REGISTRY_PORT=$REGISTRY_PORT
EOF
}

cmd_up() {
    take_lock
    write_ports_file
    ensure_venv
    ensure_smtp_sink
    pg_up
    kafka_up
    registry_up
    write_env_file
    secure_up
    say "up: env in $ENV_FILE (. $ENV_FILE)"
}

cmd_down() {
    take_lock
    registry_down
    kafka_down
    pg_down
    rm -f "$JIT_FILE"
}

cmd_status() {
    local rc=0
    kafka_status || rc=3
    pg_status || rc=3
    registry_status || rc=3
    return $rc
}

cmd_env() {
    [[ -f $ENV_FILE ]] || die "$ENV_FILE does not exist yet: run scripts/services.sh up"
    cat "$ENV_FILE"
}

# Fault injection for tests/chaos: only ever this state dir's own servers.
cmd_kill_kafka() {
    take_lock
    local node killed=0
    while read -r node; do
        # shellcheck disable=SC2086
        select_node $node
        if kill_node; then killed=$((killed + 1)); fi
    done < <(all_nodes)
    [[ $killed -gt 0 ]] || die "kafka: not running"
}

# kill_node: SIGKILL the selected node and wait until it is gone; fails when it did not run.
kill_node() {
    local pid
    pid=$(kafka_pid) || return 1
    kill -KILL "$pid"
    while pid_alive "$pid"; do sleep 0.1; done
    rm -f "$KAFKA_PIDFILE"
    say "$(node_name): killed pid $pid"
}

# cmd_kill_node ROLE N, cmd_stop_node ROLE N, cmd_start_node ROLE N
cmd_kill_node() {
    check_node "${2:-}" "kill-$1"
    take_lock
    select_node "$2" "$1"
    kill_node || die "$(node_name): not running"
}

cmd_stop_node() {
    check_node "${2:-}" "stop-$1"
    take_lock
    select_node "$2" "$1"
    local pid
    pid=$(kafka_pid) || die "$(node_name): not running"
    stop_service "$(node_name)" "$pid" "$KAFKA_PIDFILE" "$KAFKA_LOG"
}

cmd_start_node() {
    check_node "${2:-}" "start-$1"
    take_lock
    select_node "$2" "$1"
    node_start
    node_wait "$NODE_PID"
}

# The active controller: the leader of the highest epoch any running node has written to its
# quorum-state file (each voter writes it at every election it sees). Exit 3 when that leader
# does not run: the quorum is electing, or has no majority.
cmd_controller() {
    check_node 1 controller
    local n best_epoch=-1 leader="" state epoch
    for ((n = 1; n <= BROKERS; n++)); do
        select_node "$n" controller
        kafka_pid >/dev/null || continue
        state=$(cat "$KAFKA_DATA/__cluster_metadata-0/quorum-state" 2>/dev/null) || continue
        epoch=$(sed -n 's/.*"leaderEpoch":\([0-9-]*\).*/\1/p' <<<"$state")
        if [[ -n $epoch ]] && ((epoch > best_epoch)); then
            best_epoch=$epoch
            leader=$(sed -n 's/.*"leaderId":\([0-9-]*\).*/\1/p' <<<"$state")
        fi
    done
    [[ -n $leader && $leader -gt $CONTROLLER_ID_BASE ]] \
        || { warn "no running controller names a leader (an election may be under way)"; exit 3; }
    select_node "$((leader - CONTROLLER_ID_BASE))" controller
    kafka_pid >/dev/null || { warn "controller $NODE_N led epoch $best_epoch but does not run"; exit 3; }
    echo "$NODE_N"
}

# The node leading a partition, from the metadata of any running node; exit 3 when it has none.
cmd_leader() {
    local topic=${1:-} partition=${2:-0}
    [[ -n $topic ]] || die "usage: scripts/services.sh leader TOPIC [PARTITION]"
    "$VENV_PY" - "$(plain_bootstrap)" "$topic" "$partition" <<'EOF'
import sys
from confluent_kafka.admin import AdminClient

bootstrap, topic, partition = sys.argv[1], sys.argv[2], int(sys.argv[3])
admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
found = admin.list_topics(topic, timeout=10).topics.get(topic)
if found is None or found.error is not None or partition not in found.partitions:
    sys.exit(f"services: no partition {topic}/{partition}")
leader = found.partitions[partition].leader
if leader < 0:
    print(f"services: {topic}/{partition} has no leader", file=sys.stderr)
    sys.exit(3)
print(leader)
EOF
}

cmd_restart_postgres() {
    take_lock
    pg_pid >/dev/null || die "postgres: not running"
    find_pg_bin || die "pg_ctl not found; cannot restart the cluster in $PG_DATA"
    as_pg "$PG_BIN/pg_ctl" restart -D "$PG_DATA" -l "$PG_LOG" -m fast -s -w \
        -t "$PG_START_TIMEOUT_S" -o "-p $PG_PORT" || die "postgres: pg_ctl restart failed" "$PG_LOG"
    say "postgres: restarted (pid $(pg_pid))"
}

cmd_clean() {
    cmd_down
    local node kafka_dirs=()
    while read -r node; do
        # shellcheck disable=SC2086
        select_node $node
        kafka_dirs+=("$KAFKA_DIR")
    done < <(all_nodes)
    say "clean: removing ${kafka_dirs[*]}, $REGISTRY_DIR, $PG_ROOT and $ENV_FILE"
    # Only what this script made: POSTROOM_DEV_DIR may point at a folder that holds more.
    rm -rf "$PG_ROOT" "${kafka_dirs[@]}" "$SECURE_DIR" "$REGISTRY_DIR"
    rm -f "$ENV_FILE" "$DEV_DIR/pg" "$DEV_DIR/services.lock" "$BROKERS_FILE" "$CLUSTER_ID_FILE" \
        "$PORTS_FILE" "$JIT_FILE"
    rmdir "$DEV_DIR" 2>/dev/null || true
}

main() {
    check_port POSTROOM_DEV_KAFKA_PORT "$KAFKA_PORT"
    check_port POSTROOM_DEV_KAFKA_CONTROLLER_PORT "$CONTROLLER_PORT"
    check_port POSTROOM_DEV_KAFKA_SECURE_PORT "$SECURE_PORT"
    check_port POSTROOM_DEV_PG_PORT "$PG_PORT"
    check_port POSTROOM_DEV_REGISTRY_PORT "$REGISTRY_PORT"
    if ! [[ $BROKERS =~ ^[0-9]+$ ]] || ((10#$BROKERS < 1 || 10#$BROKERS > 9)); then
        die "POSTROOM_DEV_BROKERS=$BROKERS is not a node count from 1 to 9"
    fi
    BROKERS=$((10#$BROKERS))
    if [[ $KAFKA_JIT != quick && $KAFKA_JIT != full ]]; then
        die "POSTROOM_DEV_KAFKA_JIT=$(printf %q "$KAFKA_JIT") is not quick (C1 only, the default) or full (C1 and C2)"
    fi
    local last=$(((BROKERS - 1) * NODE_PORT_STRIDE)) port
    for port in "$KAFKA_PORT" "$CONTROLLER_PORT" "$SECURE_PORT"; do
        check_port "node $BROKERS's port (a POSTROOM_DEV_KAFKA_*_PORT + $last)" "$((10#$port + last))"
    done
    # A platform's shape from three nodes on: every write in two replicas before it is acknowledged.
    REPLICATION=$((BROKERS < 3 ? BROKERS : 3))
    MIN_ISR=$((BROKERS < 3 ? 1 : 2))
    select_node 1
    case ${1:-} in
        up) cmd_up ;;
        down) cmd_down ;;
        status) cmd_status ;;
        env) cmd_env ;;
        clean) cmd_clean ;;
        kill-kafka) cmd_kill_kafka ;;
        restart-postgres) cmd_restart_postgres ;;
        kill-broker | kill-controller) cmd_kill_node "${1#kill-}" "${2:-}" ;;
        stop-broker | stop-controller) cmd_stop_node "${1#stop-}" "${2:-}" ;;
        start-broker | start-controller) cmd_start_node "${1#start-}" "${2:-}" ;;
        controller) cmd_controller ;;
        leader) cmd_leader "${2:-}" "${3:-}" ;;
        *)
            sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2
            exit 2
            ;;
    esac
}

main "$@"
