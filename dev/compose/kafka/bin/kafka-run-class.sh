#!/bin/bash
# Runs one class of the Kafka jars, reading the JVM variables the distribution's script reads.
base=$(cd "$(dirname "$0")/.." && pwd)
: "${KAFKA_HEAP_OPTS:=-Xmx256M}"
: "${KAFKA_JVM_PERFORMANCE_OPTS:=-server -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35 -XX:+ExplicitGCInvokesConcurrent -Djava.awt.headless=true}"
: "${KAFKA_LOG4J_OPTS:=-Dlog4j2.configurationFile=$base/config/tools-log4j2.properties}"
# shellcheck disable=SC2086 # the variables hold several JVM options each, as upstream
exec java $KAFKA_HEAP_OPTS $KAFKA_JVM_PERFORMANCE_OPTS $KAFKA_LOG4J_OPTS ${KAFKA_OPTS:-} \
    -cp "$base/libs/*" "$@"
