"""librdkafka's errors as ours: translated with their code, judged (too large, a broker loss's
passing error) and explained (refused credentials, failed TLS)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from postroom.errors import KafkaClientError


def is_too_large(err: object) -> bool:
    """Whether ``err`` (a KafkaError, or a KafkaException carrying one) says a record is too large
    for the producer or the broker ever to take: retrying it cannot help."""
    if isinstance(err, KafkaException) and err.args:
        err = err.args[0]
    return isinstance(err, KafkaError) and err.code() in (
        KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE)


def translate(exc: KafkaException | KafkaError, message: str) -> KafkaClientError:
    """Our error for a librdkafka one, keeping its code."""
    err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else exc
    if isinstance(err, KafkaError):
        return KafkaClientError(f"{message}: {err.str()}", code=err.name(),
                                retriable=err.retriable())
    return KafkaClientError(f"{message}: {exc}")


_CONFIG_VARS = "POSTROOM_KAFKA_CONFIG / POSTROOM_KAFKA_CONFIG_FILE"


def explain_refusal(err: KafkaError, config: Mapping[str, Any]) -> str | None:
    """What to fix when the broker refused our credentials or TLS failed; None for other errors.

    Names the setting, never its value (the librdkafka text holds no secret either).
    """
    if err.code() == KafkaError._AUTHENTICATION:
        user = config.get("sasl.username", "(no sasl.username)")
        return (f"the broker refused the credentials of sasl.username={user} "
                f"(sasl.mechanism={config.get('sasl.mechanism', '?')}): check sasl.password in "
                f"{_CONFIG_VARS}. {err.str()}")
    if err.code() == KafkaError._SSL:
        return (f"TLS with the broker failed: check ssl.ca.location (the CA that signed the "
                f"broker's certificate) in {_CONFIG_VARS}. {err.str()}")
    return None


# Errors a broker loss brings while leaderships, coordinators and the metadata's controller
# move: a request made again a moment later is answered. Others (a refusal) are final.
MOVING_CODES = frozenset({"_TIMED_OUT", "_TRANSPORT", "_ALL_BROKERS_DOWN", "_WAIT_COORD",
                          "COORDINATOR_NOT_AVAILABLE", "NOT_COORDINATOR",
                          "COORDINATOR_LOAD_IN_PROGRESS", "LEADER_NOT_AVAILABLE",
                          "NOT_LEADER_FOR_PARTITION", "REQUEST_TIMED_OUT"})


def is_moving(exc: KafkaClientError) -> bool:
    """Whether ``exc`` is a broker loss's passing error, not a refusal."""
    return exc.retriable or exc.code in MOVING_CODES
