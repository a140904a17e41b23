"""The adapter that owns confluent-kafka: it builds the clients, translates their errors and is the
only importer of the library; roles use its wrappers and the library's names it re-exports.

config: client configs and log handling · clients: the builders · errors: translation and
judgement · fatal: librdkafka's fatal state, watched · probe: waiting for a broker · records:
consumed messages · topics, checks: the topics on the broker · acls: the broker's ACL bindings.
"""

from __future__ import annotations

# The library's names a role needs in its own signatures and calls (messages, partitions,
# error codes, offsets); imported from here so only this package imports confluent_kafka.
from confluent_kafka import (
    OFFSET_INVALID,
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import OffsetSpec  # type: ignore[attr-defined]

from postroom.kafka.acls import acl_binding, apply_acls
from postroom.kafka.checks import KafkaDegraded, check_groups, check_kafka, check_topics
from postroom.kafka.clients import (
    make_admin,
    make_consumer,
    make_producer,
    make_reader,
    watermarks,
)
from postroom.kafka.config import (
    BROKER_WAIT_S,
    CONSUMER_FETCH_WAIT_MS,
    CONSUMER_HEARTBEAT_INTERVAL_MS,
    CONSUMER_SESSION_TIMEOUT_MS,
    REMOTE_ASSIGNOR,
    ClientLog,
    RepeatedLines,
    client_config,
    consumer_config,
    producer_config,
    reader_config,
)
from postroom.kafka.errors import MOVING_CODES, explain_refusal, is_moving, is_too_large, translate
from postroom.kafka.fatal import fatal_check, is_fatal, raise_if_fatal
from postroom.kafka.probe import check_reachable, describe_attempts
from postroom.kafka.records import Headers, Record, message_headers, readable_records
from postroom.kafka.topics import (
    START_TOPIC_TRIES,
    TopicRetention,
    create_topics,
    min_insync_replicas,
    planned_replication,
    require_topics,
    topic_access,
    topic_replicas,
    topic_retention,
)
from postroom.settings import PRODUCER_MESSAGE_TIMEOUT_MS

__all__ = [
    "BROKER_WAIT_S",
    "CONSUMER_FETCH_WAIT_MS",
    "CONSUMER_HEARTBEAT_INTERVAL_MS",
    "CONSUMER_SESSION_TIMEOUT_MS",
    "MOVING_CODES",
    "OFFSET_INVALID",
    "PRODUCER_MESSAGE_TIMEOUT_MS",
    "REMOTE_ASSIGNOR",
    "START_TOPIC_TRIES",
    "ClientLog",
    "Consumer",
    "ConsumerGroupTopicPartitions",
    "Headers",
    "KafkaDegraded",
    "KafkaError",
    "KafkaException",
    "Message",
    "OffsetSpec",
    "Producer",
    "Record",
    "RepeatedLines",
    "TopicPartition",
    "TopicRetention",
    "acl_binding",
    "apply_acls",
    "check_groups",
    "check_kafka",
    "check_reachable",
    "check_topics",
    "client_config",
    "consumer_config",
    "create_topics",
    "describe_attempts",
    "explain_refusal",
    "fatal_check",
    "is_fatal",
    "is_moving",
    "is_too_large",
    "make_admin",
    "make_consumer",
    "make_producer",
    "make_reader",
    "message_headers",
    "min_insync_replicas",
    "planned_replication",
    "producer_config",
    "raise_if_fatal",
    "readable_records",
    "reader_config",
    "require_topics",
    "topic_access",
    "topic_replicas",
    "topic_retention",
    "translate",
    "watermarks",
]
