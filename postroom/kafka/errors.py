"""librdkafka's errors as ours: translated with their code, judged (too large, a broker loss's
passing error) and explained (refused credentials, failed TLS)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from postroom.errors import ConfigError, KafkaClientError, PostroomError
from postroom.settings import Settings, is_secret_key


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
# Where a client's own settings come from, beside _CONFIG_VARS, by the kind of client.
_OWN_CONFIG = {"producer": ("POSTROOM_KAFKA_PRODUCER_CONFIG", "kafka_producer_config"),
               "consumer": ("POSTROOM_KAFKA_CONSUMER_CONFIG", "kafka_consumer_config")}
# librdkafka's refusals of a config at a client's creation, each naming its key.
_NO_SUCH_KEY = re.compile(r'No such configuration property: "(?P<key>[^"]+)"')
_KEY_FAILED = re.compile(r'(?P<key>[a-z][a-z0-9_.-]*) failed: ')
_BAD_VALUE = re.compile(r'for configuration property "(?P<key>[^"]+)"')


def creation_error(exc: KafkaException, settings: Settings, kind: str,
                   message: str) -> PostroomError:
    """Our error for a client librdkafka would not create: a ConfigError naming the variable
    that holds the key it refused (a typo'd key, a CA file that is not there), in one line;
    else (a key of postroom's own) :func:`translate`'s. ``kind``: producer, consumer or admin
    (whose own settings variable may hold the key)."""
    err = exc.args[0] if exc.args else None
    if not isinstance(err, KafkaError) or err.code() != KafkaError._INVALID_ARG:
        return translate(exc, message)
    text = err.str()
    found = _NO_SUCH_KEY.search(text) or _BAD_VALUE.search(text) or _KEY_FAILED.search(text)
    own = _OWN_CONFIG.get(kind)
    if own is not None and found is not None and found["key"] in getattr(settings, own[1]):
        variable = own[0]
    elif found is not None and found["key"] in settings.kafka_config:
        variable = _CONFIG_VARS
    else:  # a key of postroom's own, not the settings': ours to fix, with its code
        return translate(exc, message)
    key = found["key"]
    value = {**settings.kafka_config, **(getattr(settings, own[1]) if own else {})}.get(key)
    shown = "" if value is None or is_secret_key(key) else f"={value}"
    if found.re is _NO_SUCH_KEY:
        return ConfigError(variable, f"{key}: librdkafka has no such setting (a typo?)")
    if found.re is _KEY_FAILED and key.endswith(".location") and value is not None \
            and not os.path.exists(value):
        return ConfigError(variable, f"{key}{shown}: no such file or directory")
    return ConfigError(variable, f"{key}{shown}: {text}")


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
