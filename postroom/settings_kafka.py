"""librdkafka and Schema Registry client settings as postroom reads them (``key=value`` text) and
shows them (secrets starred), and the libpq URL masking beside them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from postroom.settings_values import shown

# librdkafka settings that carry secrets: masked when a config is shown, and a ";" inside their
# value does not start a new entry. Beside these, any key with a part that names a secret
# (_SECRET_WORDS: sasl.oauthbearer.assertion.private.key.passphrase, ...private.key.pem).
_SECRET_KAFKA_KEYS = ("sasl.password", "ssl.key.password", "ssl.keystore.password",
                      "sasl.oauthbearer.client.secret", "sasl.oauthbearer.config", "ssl.key.pem")
_SECRET_WORDS = frozenset({"password", "passwd", "secret", "passphrase", "pem", "token", "jaas"})
# Query parameters of a libpq URL that carry secrets.
_SECRET_URL_PARAMS = ("password", "sslpassword")
# Schema Registry client settings (confluent-kafka's SchemaRegistryClient) that carry secrets.
_SECRET_REGISTRY_KEYS = ("basic.auth.user.info", "bearer.auth.token", "bearer.auth.client.secret",
                         "ssl.key.password")



def parse_kafka_config(text: str) -> dict[str, str]:
    """librdkafka settings written as ``key=value`` pairs, separated by newlines or semicolons.

    Lines starting with ``#`` are comments, as in a Java properties file. A ``;`` separates
    entries only where a key follows; inside a secret's value (sasl.password, any key naming a
    password, secret, passphrase or pem; basic.auth.user.info) only where a dotted name
    (``;security.protocol=``) or the registry's ``timeout`` follows, so a password may hold
    ``;x=y``.
    """
    config: dict[str, str] = {}
    entries: list[str] = []
    for line in text.splitlines():
        for entry in _ENTRY_SPLIT.split(line):
            key = entry.partition("=")[0].strip()
            if entries and _is_secret_continuation(entries[-1], key):
                entries[-1] += ";" + entry
            else:
                entries.append(entry)
        entries.append("")  # a secret never runs on to the next line
    for number, raw in enumerate([e for e in entries if e.strip()], start=1):
        line = raw.strip()
        if line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            # Never echo the entry: it may be part of a secret.
            raise ValueError(f"entry {number} is not of the form key=value")
        config[key.strip()] = value.strip()
    return config


_ENTRY_SPLIT = re.compile(r";(?=\s*[\w.-]+\s*=)")
# Settings without a dot that may follow a secret: the registry client's (url is refused later).
_UNDOTTED_KEYS = ("timeout", "url")
_DOTTED_KEY = re.compile(r"^[a-z][a-z0-9_-]*(\.[a-z0-9_-]+)+$")


def is_secret_key(key: str) -> bool:
    """Whether a librdkafka or Schema Registry client setting carries a secret: a known one, or
    one whose name has a part saying password, secret, passphrase, pem (key material), token."""
    key = key.strip()
    return (key in _SECRET_KAFKA_KEYS or key in _SECRET_REGISTRY_KEYS
            or not _SECRET_WORDS.isdisjoint(re.split(r"[._-]", key.lower())))


def _is_secret_continuation(previous: str, key: str) -> bool:
    """Whether the entry after ``previous`` is still part of its secret value."""
    return (is_secret_key(previous.partition("=")[0]) and not _DOTTED_KEY.match(key)
            and key not in _UNDOTTED_KEYS)


def mask_kafka_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """A copy safe to print: secret values replaced by stars."""
    return {k: ("********" if is_secret_key(k) else v) for k, v in config.items()}


def mask_registry_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """A Schema Registry client config safe to print: secrets (and credentials in the url) starred."""
    return {k: ("********" if is_secret_key(k) else mask_url(v) if k == "url" else v)
            for k, v in config.items()}


def mask_url(url: str) -> str:
    """``scheme://user:secret@host/db?password=x`` -> ``scheme://user:********@host/db?password=********``.

    The user-info password and the ``password`` and ``sslpassword`` query parameters."""
    masked = re.sub(r"^([^:/]+://[^:/@]*):[^@]*@", r"\1:********@", url)
    names = "|".join(_SECRET_URL_PARAMS)
    return re.sub(rf"([?&](?:{names})=)[^&#]*", r"\1********", masked, flags=re.IGNORECASE)



# The registry client's settings it wants as numbers; the env gives text.
_REGISTRY_NUMBERS = ("timeout", "max.retries", "retries.wait.ms", "retries.max.wait.ms",
                     "cache.capacity", "cache.latest.ttl.sec")


def registry_config(text: str) -> dict[str, str | float]:
    config: dict[str, str | float] = dict(parse_kafka_config(text))
    if "url" in config:
        raise ValueError("the url goes in POSTROOM_SCHEMA_REGISTRY_URL, not here")
    # Java clients need basic.auth.credentials.source=USER_INFO beside basic.auth.user.info;
    # confluent-kafka refuses the key (2.16: "Unrecognized properties") and reads the user info
    # alone, so USER_INFO is taken as said and dropped.
    source = str(config.pop("basic.auth.credentials.source", "USER_INFO")).strip().upper()
    if source != "USER_INFO":
        raise ValueError("basic.auth.credentials.source: confluent-kafka takes only "
                         "basic.auth.user.info=<user>:<password> (USER_INFO); "
                         f"{shown(source)} is not supported")
    for key in _REGISTRY_NUMBERS:
        if key in config:
            raw = config[key]
            try:
                number = float(raw)
            except ValueError:
                number = math.nan
            if not (math.isfinite(number) and number >= 0):
                raise ValueError(f"{key} must be a number of at least 0, got {raw!r}")
            config[key] = int(number) if number.is_integer() else number
    return config

