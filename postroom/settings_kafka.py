"""librdkafka and Schema Registry client settings as postroom reads them (``key=value`` text) and
shows them (secrets starred), and the masking of URLs' credentials beside them (every URL-shaped
setting: the database's, the registry's, OTLP endpoints, URLs inside client settings).
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
    """A copy safe to print: secret values replaced by stars, and the credentials in a URL
    (``sasl.oauthbearer.token.endpoint.url``, say) as :func:`mask_url` shows them."""
    return {k: (MASK if is_secret_key(k) else mask_urls(v) if isinstance(v, str) else v)
            for k, v in config.items()}


def mask_registry_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """A Schema Registry client config safe to print: secrets (and credentials in the url and
    any other URL) starred."""
    return mask_kafka_config(config)


# A URL's credentials: userinfo up to the last "@" of the run of non-blank text after the
# scheme (a password may hold "/", "?" or "@" unencoded, as SQLAlchemy's parser takes it; this
# hides too much rather than too little when an "@" follows the host), and query parameters
# whose name has a part naming a secret.
_URL_USERINFO = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]*://)([^\s@]*(?:@[^\s@]*)*)@")
_URL_SECRET_PARAM = re.compile(r"([?&])([^=&#\s]+)=([^&#\s]*)")
_SECRET_PARAM_WORDS = frozenset({"password", "passwd", "pwd", "sslpassword", "secret", "token",
                                 "key", "apikey", "auth", "authorization", "signature", "sig",
                                 "credential", "credentials", "jwt"})
MASK = "********"


def mask_url(url: str) -> str:
    """``url`` safe to print: ``scheme://user:secret@host/db?password=x`` ->
    ``scheme://user:********@host/db?password=********``.

    The password of the userinfo; a userinfo with no password too, unless the URL is a
    database's (a token stands in the user's place in HTTP URLs, ``https://token@collector``;
    libpq's is a role name); the value of every query parameter whose name has a part naming a
    secret (password, sslpassword, token, api_key, key, signature, ...)."""
    return mask_urls(url)


def mask_urls(text: str) -> str:
    """``text`` (a log line, an error) with every URL in it masked as :func:`mask_url` says."""
    if "://" not in text:
        return text
    if "@" in text:
        text = _URL_USERINFO.sub(_masked_userinfo, text)
    return _masked_params(text)


def _masked_userinfo(found: re.Match[str]) -> str:
    scheme, userinfo = found.group(1), found.group(2)
    user, colon, _ = userinfo.partition(":")
    if colon:
        shown = f"{user}:{MASK}"
    elif scheme.lower().startswith("postgres"):
        shown = userinfo
    else:
        shown = MASK
    return f"{scheme}{shown}@"


def _masked_params(text: str) -> str:
    def masked(found: re.Match[str]) -> str:
        words = re.split(r"[._-]", found.group(2).lower())
        if _SECRET_PARAM_WORDS.isdisjoint(words):
            return found.group(0)
        return f"{found.group(1)}{found.group(2)}={MASK}"

    return _URL_SECRET_PARAM.sub(masked, text)


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

