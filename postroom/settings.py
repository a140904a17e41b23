"""postroom's configuration: read once from ``POSTROOM_*`` environment variables and passed down.

Nothing else in postroom reads ``os.environ``. Secrets are held as :class:`Secret` and never print.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from postroom import rules
from postroom.errors import ConfigError, InvalidContentError
from postroom.logs import escape_unprintable

ENV_PREFIX = "POSTROOM_"
# How long a producer keeps trying to deliver one record (librdkafka's message.timeout.ms). A relay
# claim must outlast it, so a row is never claimed by two relays while one still waits.
PRODUCER_MESSAGE_TIMEOUT_MS = 30_000
# How long one Schema Registry request may wait for an answer (the client's ``timeout``); the
# client then retries it (``max.retries``, 3 by default) before postroom reports the registry down.
REGISTRY_TIMEOUT_S = 10
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
# The longest a bounce token may live or an address stay suppressed: far more than any policy
# needs, and far enough from the end of Python's datetime (9999) and a timedelta (999,999,999
# days) that a date computed from it stays one.
LONGEST_PERIOD_S = 36500 * 86400.0
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


class Secret:
    """A string that does not show itself in repr, str or logs."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('********')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


class TlsMode(enum.StrEnum):
    AUTO = "auto"          # STARTTLS whenever the server offers it
    STARTTLS = "starttls"  # STARTTLS required
    TLS = "tls"            # implicit TLS from the first byte
    NONE = "none"


def parse_duration_s(text: str) -> float:
    """``"5m"`` -> 300.0. Units: ms, s (default), m, h, d."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"not a duration: {_shown(text)} (examples: 500ms, 2s, 5m, 1h, 30d)")
    value = float(match.group(1)) * _UNIT_S[match.group(2) or "s"]
    if value <= 0:
        raise ValueError(f"a duration must be positive: {text!r}")
    if not math.isfinite(value):
        raise ValueError(f"not a duration: {_shown(text)} is too long")
    return value


def parse_period_s(text: str) -> float:
    """A duration of at most LONGEST_PERIOD_S (a token's life, a suppression's): dates are
    computed from it, and one past what a timestamp holds would fail where it is used."""
    value = parse_duration_s(text)
    if value > LONGEST_PERIOD_S:
        raise ValueError(f"at most 100 years (36500d), got {_shown(text.strip())}")
    return value


def parse_durations_s(text: str) -> tuple[float, ...]:
    """``"5m,10m"`` -> (300.0, 600.0); an empty string means no tiers."""
    parts = [p for p in text.split(",") if p.strip()]
    return tuple(parse_duration_s(p) for p in parts)


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


@dataclasses.dataclass(frozen=True, repr=False)
class Settings:
    """Every setting postroom reads. Build with :meth:`from_env`; each field's env var is in FIELDS."""

    database_url: str | None = None
    database_schema: str | None = None  # None: the role's default search_path
    kafka_bootstrap_servers: str | None = None
    topic_prefix: str = "postroom."
    kafka_config: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # Only for producers, or only for consumers; each wins over kafka_config for its clients.
    kafka_producer_config: Mapping[str, str] = dataclasses.field(default_factory=dict)
    kafka_consumer_config: Mapping[str, str] = dataclasses.field(default_factory=dict)
    kafka_cluster_name: str = "default"  # the cluster_name label of the lag metrics
    topic_partitions: int = 6
    topic_replication_factor: int = -1  # -1: the broker's default.replication.factor
    topic_config: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # None: schemaless Avro with a fingerprint header; set: the Confluent wire format
    schema_registry_url: str | None = None
    schema_registry_config: Mapping[str, str | float] = dataclasses.field(default_factory=dict)
    # enqueue
    mail_from: str = "postroom@localhost"
    attachment_max_bytes: int = rules.DEFAULT_ATTACHMENT_MAX_BYTES
    attachments_total_max_bytes: int = rules.DEFAULT_ATTACHMENT_MAX_BYTES
    body_max_bytes: int = rules.DEFAULT_BODY_MAX_BYTES
    event_max_bytes: int = rules.DEFAULT_EVENT_MAX_BYTES
    # relay
    relay_batch_size: int = 1000
    relay_poll_interval_s: float = 1.0
    relay_claim_ttl_s: float = 60.0
    # sender
    # "": derived from the topic prefix (<prefix>sender, <prefix>recorder), so environments that
    # share a broker under their own prefixes do not share a group.
    sender_group: str = ""
    recorder_group: str = ""
    retry_delays_s: tuple[float, ...] = (300.0, 600.0, 1200.0, 2400.0)
    smtp_host: str = "127.0.0.1"
    smtp_port: int = 25
    smtp_tls: TlsMode = TlsMode.AUTO
    smtp_username: str | None = None
    smtp_password: Secret | None = None
    # Sending the AUTH password over an unencrypted connection; named so nobody sets it by accident.
    smtp_insecure_auth_without_tls: bool = False
    smtp_pipelining: bool = True  # RFC 2920 command groups where the server offers them
    smtp_connect_timeout_s: float = 30.0
    smtp_timeout_s: float = 60.0
    smtp_concurrency: int = 20
    # per-destination throttling (sender/throttle.py)
    destination_by: str = "domain"       # "domain" or "smarthost"
    destination_concurrency: int = 20    # Postfix's default_destination_concurrency_limit
    destination_rate_per_s: float = 0.0  # 0: no rate limit (Postfix's default_destination_rate_delay)
    throttle_pause_s: float = 60.0       # first pause after a throttling reply; doubles, up to 16x
    throttle_max_wait_s: float = 600.0   # then a throttled send counts as a transient failure
    smtp_tls_ca_file: Path | None = None  # extra CA certificates to trust for the SMTP server
    attachments_root: Path | None = None
    metrics_port: int | None = None
    log_level: str = "INFO"
    event_loop: str = "auto"  # the sender's asyncio loop: "uvloop", "asyncio", or uvloop if installed
    # bounces (VERP return paths, DSN requests, the intake role) and the suppression list
    bounce_address: str | None = None  # None: envelope sender as before, no DSN requested
    bounce_secrets: tuple[bytes, ...] = ()  # the first signs tokens, all verify (rotation)
    bounce_listen: tuple[str, int] = ("127.0.0.1", 2526)
    bounce_token_max_age_s: float = 60 * 86400.0
    suppression_expiry_s: float = 30 * 86400.0
    # Emails in a row to an address that ended dead after the server's 4xx replies and suppress
    # it; 0: never (as Amazon SES, whose list takes hard bounces and complaints only).
    soft_bounce_limit: int = 0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Parse every ``POSTROOM_*`` variable; a malformed one raises ConfigError naming it."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for name, (field, parse) in FIELDS.items():
            raw = env.get(name)
            if raw is None or raw == "":
                continue
            try:
                values[field] = parse(raw)
            except (ValueError, OSError) as exc:
                # One line, whatever the value held (a path with a line break).
                raise ConfigError(name, escape_unprintable(str(exc))) from exc
        password_file = env.get(ENV_PREFIX + "SMTP_PASSWORD_FILE")
        if password_file:
            try:
                values["smtp_password"] = Secret(Path(password_file).read_text().rstrip("\r\n"))
            except (ValueError, OSError) as exc:  # ValueError: a NUL in the path, not UTF-8
                raise ConfigError(ENV_PREFIX + "SMTP_PASSWORD_FILE",
                                  escape_unprintable(str(exc))) from exc
        secret_file = env.get(ENV_PREFIX + "BOUNCE_SECRET_FILE")
        if secret_file:
            name = ENV_PREFIX + "BOUNCE_SECRET_FILE"
            if env.get(ENV_PREFIX + "BOUNCE_SECRET"):
                raise ConfigError(name, "set this or POSTROOM_BOUNCE_SECRET, not both")
            try:
                values["bounce_secrets"] = _bounce_secrets(Path(secret_file).read_text())
            except (ValueError, OSError) as exc:
                raise ConfigError(name, escape_unprintable(str(exc))) from exc
        config_file = env.get(ENV_PREFIX + "KAFKA_CONFIG_FILE")
        if config_file:
            try:
                from_file = parse_kafka_config(Path(config_file).read_text())
            except (ValueError, OSError) as exc:
                raise ConfigError(ENV_PREFIX + "KAFKA_CONFIG_FILE",
                                  escape_unprintable(str(exc))) from exc
            values["kafka_config"] = {**from_file, **values.get("kafka_config", {})}
        return cls(**values)

    def __post_init__(self) -> None:
        for field, role in (("sender_group", "sender"), ("recorder_group", "recorder")):
            if not getattr(self, field):
                object.__setattr__(self, field, default_group(self.topic_prefix, role))
        if self.relay_claim_ttl_s * 1000 <= PRODUCER_MESSAGE_TIMEOUT_MS:
            raise ConfigError(env_name("relay_claim_ttl_s"),
                              f"must be longer than the producer's message timeout "
                              f"({PRODUCER_MESSAGE_TIMEOUT_MS / 1000:g}s), got "
                              f"{self.relay_claim_ttl_s:g}s")
        if self.bounce_address is not None and not self.bounce_secrets:
            # Named by the variable that was set: it is the one that cannot work alone.
            raise ConfigError(env_name("bounce_address"),
                              "needs POSTROOM_BOUNCE_SECRET or POSTROOM_BOUNCE_SECRET_FILE "
                              "to sign the return paths")

    def __repr__(self) -> str:
        shown = []
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name in ("database_url", "schema_registry_url") and value:
                value = mask_url(value)
            elif field.name in ("kafka_config", "kafka_producer_config", "kafka_consumer_config"):
                value = mask_kafka_config(value)
            elif field.name == "schema_registry_config":
                value = mask_registry_config(value)
            elif field.name == "bounce_secrets":
                value = tuple("********" for _ in value)
            shown.append(f"{field.name}={value!r}")
        return f"Settings({', '.join(shown)})"

    __str__ = __repr__

    def require(self, field: str) -> Any:
        """The value of ``field``, or ConfigError naming its env var when it is unset."""
        value = getattr(self, field)
        if value is None:
            raise ConfigError(env_name(field), "is not set")
        return value

    def check_attachments_root(self) -> None:
        """ConfigError unless POSTROOM_ATTACHMENTS_ROOT, when set, names a directory."""
        if self.attachments_root is not None and not self.attachments_root.is_dir():
            raise ConfigError(env_name("attachments_root"),
                              f"not a directory: {self.attachments_root}")

    def size_limits(self) -> rules.SizeLimits:
        """The caps on an email's parts, as enqueue and the sender apply them."""
        return rules.SizeLimits(
            body_max_bytes=self.body_max_bytes, attachment_max_bytes=self.attachment_max_bytes,
            attachments_total_max_bytes=self.attachments_total_max_bytes,
            event_max_bytes=self.event_max_bytes)

    def kafka_client_config(self) -> dict[str, str]:
        """librdkafka settings common to every client: bootstrap servers plus the extras."""
        bootstrap = self.require("kafka_bootstrap_servers")
        return {"bootstrap.servers": bootstrap, **self.kafka_config}

    def registry_client_config(self) -> dict[str, str | float]:
        """confluent-kafka SchemaRegistryClient settings: the url plus the extras. A request
        that gets no answer gives up after REGISTRY_TIMEOUT_S unless the extras say otherwise
        (the client's own default waits for ever), and the client retries it."""
        url = self.require("schema_registry_url")
        return {"timeout": REGISTRY_TIMEOUT_S, **self.schema_registry_config, "url": url}


def default_group(prefix: str, role: str) -> str:
    """The consumer group of ``role`` ("sender", "recorder") when its setting is unset:
    ``postroom.sender`` under the default prefix, ``staging.sender`` under ``staging.``."""
    return f"{prefix}{role}"


_WHOLE_NUMBER = re.compile(r"\s*[+-]?[0-9]{1,18}\s*")


def _shown(text: str) -> str:
    """A value as an error shows it: quoted, escaped, cut short."""
    return repr(text if len(text) <= 40 else text[:40] + "...")


def _whole_number(text: str, example: str = "10") -> int:
    """An integer written in ASCII digits; a ValueError saying the expected form otherwise (int()
    alone said ``invalid literal for int() with base 10``)."""
    if not _WHOLE_NUMBER.fullmatch(text):
        raise ValueError(f"expected a whole number such as {example}, got {_shown(text)}")
    return int(text)


def _positive_int(text: str) -> int:
    value = _whole_number(text)
    if value < 1:
        raise ValueError(f"must be at least 1, got {value}")
    return value


def _replication_factor(text: str) -> int:
    value = _whole_number(text, "3, or -1 for the broker default")
    if value < 1 and value != -1:
        raise ValueError(f"must be at least 1, or -1 for the broker default, got {value}")
    return value


def _port(text: str) -> int:
    value = _whole_number(text, "25 (a TCP port, 1 to 65535)")
    if not 0 < value < 65536:
        raise ValueError(f"not a TCP port (1 to 65535): {value}")
    return value


def _http_url(text: str) -> str:
    text = text.strip().rstrip("/")
    if not re.fullmatch(r"https?://[^\s/]+(/\S*)?", text):
        raise ValueError("expected an http(s) URL such as http://registry:8081 "
                         "(Apicurio: http://host:8080/apis/ccompat/v7)")
    return text


# The registry client's settings it wants as numbers; the env gives text.
_REGISTRY_NUMBERS = ("timeout", "max.retries", "retries.wait.ms", "retries.max.wait.ms",
                     "cache.capacity", "cache.latest.ttl.sec")


def _registry_config(text: str) -> dict[str, str | float]:
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
                         f"{_shown(source)} is not supported")
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


def _database_url(text: str) -> str:
    if not text.startswith("postgresql"):
        raise ValueError("expected a SQLAlchemy URL such as postgresql+psycopg://user@host:5432/db")
    return text


def _identifier(text: str) -> str:
    if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", text):
        raise ValueError("expected a lower-case SQL identifier (letters, digits, '_')")
    return text


def _tls_mode(text: str) -> TlsMode:
    try:
        return TlsMode(text.strip().lower())
    except ValueError:
        raise ValueError(f"expected one of {', '.join(m.value for m in TlsMode)}") from None


def _prefix(text: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9._-]*", text):
        raise ValueError("a topic prefix may hold only letters, digits, '.', '_' and '-'")
    return text


def _attachments_root(text: str) -> Path:
    # Existence is checked by the component that reads it (the sender), not by every process
    # that shares the environment.
    path = Path(text).resolve()
    try:
        rules.check_root(str(path))
    except InvalidContentError as exc:
        raise ValueError(str(exc)) from None
    return path


def _mail_from(text: str) -> str:
    # Checked here: a From the sender's rules refuse would fail every email without a sender.
    try:
        return rules.check_mailbox(text.strip(), what="the From address")
    except InvalidContentError as exc:
        raise ValueError(str(exc)) from None


def _event_max_bytes(text: str) -> int:
    value = _positive_int(text)
    if value > rules.EVENT_MAX_BYTES_CEILING:
        raise ValueError(f"must stay well under Kafka's default message.max.bytes (1 MiB): at "
                         f"most {rules.EVENT_MAX_BYTES_CEILING}, got {value}")
    return value


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _bool(text: str) -> bool:
    word = text.strip().lower()
    if word not in _TRUE | _FALSE:
        raise ValueError("expected true or false")
    return word in _TRUE


def _file(text: str) -> Path:
    path = Path(text).resolve()
    if not path.is_file():
        raise ValueError(f"not a file: {path}")
    return path


def _destination_by(text: str) -> str:
    value = text.strip().lower()
    if value not in ("domain", "smarthost"):
        raise ValueError("expected domain (one destination per recipient domain) or smarthost")
    return value


def _rate(text: str) -> float:
    """Messages per second, ``0`` for no limit; ``30/m`` and ``2/s`` are read too."""
    number, _, per = text.strip().partition("/")
    seconds = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}.get(per.strip())
    if seconds is None:
        raise ValueError(f"expected a rate such as 2/s or 30/m, got {_shown(text)}")
    try:
        value = float(number) / seconds
    except ValueError:
        raise ValueError(f"expected a rate such as 2/s or 30/m, got {_shown(text)}") from None
    if not (value >= 0 and value != float("inf")):
        raise ValueError(f"expected a rate of 0 or more, e.g. 2/s or 30/m, got {_shown(text)}")
    return value


def _log_level(text: str) -> str:
    level = text.strip().upper()
    if level not in {"DEBUG", "INFO", "WARNING", "ERROR"}:
        raise ValueError("expected DEBUG, INFO, WARNING or ERROR")
    return level


def _event_loop(text: str) -> str:
    loop = text.strip().lower()
    if loop not in {"auto", "uvloop", "asyncio"}:
        raise ValueError("expected auto, uvloop or asyncio")
    return loop


# The longest token postroom.verp makes (35 characters) and "+": the bounce address's local part
# must leave room for them within RFC 5321's 64.
BOUNCE_LOCAL_MAX_CHARS = 64 - 36
BOUNCE_SECRET_MIN_BYTES = 16


def _bounce_address(text: str) -> str:
    # The envelope sender of every email: one bare ASCII address, with room for the token.
    try:
        address = rules.check_address(text, what="the bounce address")
    except InvalidContentError as exc:
        raise ValueError(str(exc)) from None
    if not address.isascii():
        raise ValueError(f"the bounce address {_shown(address)} must be ASCII (it is the "
                         "envelope sender of every email, whatever the server supports)")
    if len(address.rpartition("@")[0]) > BOUNCE_LOCAL_MAX_CHARS:
        raise ValueError(f"the bounce address's local part may be at most "
                         f"{BOUNCE_LOCAL_MAX_CHARS} characters (a token is added to it)")
    return address


def _bounce_secrets(text: str) -> tuple[bytes, ...]:
    """Secrets separated by commas (or lines, in a file): the first signs, all verify."""
    secrets = tuple(part.strip() for part in re.split(r"[,\r\n]", text) if part.strip())
    if not secrets:
        raise ValueError("no secret given")
    for number, secret in enumerate(secrets, start=1):
        # Never echo a secret, not even a short one.
        if len(secret.encode()) < BOUNCE_SECRET_MIN_BYTES:
            raise ValueError(f"secret {number} is shorter than {BOUNCE_SECRET_MIN_BYTES} bytes")
    return tuple(secret.encode() for secret in secrets)


def _listen(text: str) -> tuple[str, int]:
    """``host:port``, ``[v6]:port`` or ``:port`` (all interfaces)."""
    host, colon, port = text.strip().rpartition(":")
    if not colon:
        raise ValueError(f"expected host:port such as 127.0.0.1:2526, got {_shown(text)}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not re.fullmatch(r"[A-Za-z0-9._:-]*", host):
        raise ValueError(f"expected host:port such as 127.0.0.1:2526, got {_shown(text)}")
    return (host or "0.0.0.0", _port(port))  # noqa: S104 - ":port" asks for every interface


def _limit_or_off(text: str) -> int:
    value = _whole_number(text, "3, or 0 for off")
    if value < 0:
        raise ValueError(f"must be 0 (off) or more, got {value}")
    return value


FIELDS: dict[str, tuple[str, Any]] = {
    ENV_PREFIX + "DATABASE_URL": ("database_url", _database_url),
    ENV_PREFIX + "DATABASE_SCHEMA": ("database_schema", _identifier),
    ENV_PREFIX + "KAFKA_BOOTSTRAP_SERVERS": ("kafka_bootstrap_servers", str.strip),
    ENV_PREFIX + "TOPIC_PREFIX": ("topic_prefix", _prefix),
    ENV_PREFIX + "KAFKA_CONFIG": ("kafka_config", parse_kafka_config),
    ENV_PREFIX + "KAFKA_PRODUCER_CONFIG": ("kafka_producer_config", parse_kafka_config),
    ENV_PREFIX + "KAFKA_CONSUMER_CONFIG": ("kafka_consumer_config", parse_kafka_config),
    ENV_PREFIX + "KAFKA_CLUSTER_NAME": ("kafka_cluster_name", str.strip),
    ENV_PREFIX + "TOPIC_PARTITIONS": ("topic_partitions", _positive_int),
    ENV_PREFIX + "TOPIC_REPLICATION_FACTOR": ("topic_replication_factor", _replication_factor),
    ENV_PREFIX + "TOPIC_CONFIG": ("topic_config", parse_kafka_config),
    ENV_PREFIX + "SCHEMA_REGISTRY_URL": ("schema_registry_url", _http_url),
    ENV_PREFIX + "SCHEMA_REGISTRY_CONFIG": ("schema_registry_config", _registry_config),
    ENV_PREFIX + "MAIL_FROM": ("mail_from", _mail_from),
    ENV_PREFIX + "ATTACHMENT_MAX_BYTES": ("attachment_max_bytes", _positive_int),
    ENV_PREFIX + "ATTACHMENTS_TOTAL_MAX_BYTES": ("attachments_total_max_bytes", _positive_int),
    ENV_PREFIX + "BODY_MAX_BYTES": ("body_max_bytes", _positive_int),
    ENV_PREFIX + "EVENT_MAX_BYTES": ("event_max_bytes", _event_max_bytes),
    ENV_PREFIX + "RELAY_BATCH_SIZE": ("relay_batch_size", _positive_int),
    ENV_PREFIX + "RELAY_POLL_INTERVAL": ("relay_poll_interval_s", parse_duration_s),
    ENV_PREFIX + "RELAY_CLAIM_TTL": ("relay_claim_ttl_s", parse_duration_s),
    ENV_PREFIX + "SENDER_GROUP": ("sender_group", str.strip),
    ENV_PREFIX + "RECORDER_GROUP": ("recorder_group", str.strip),
    ENV_PREFIX + "RETRY_DELAYS": ("retry_delays_s", parse_durations_s),
    ENV_PREFIX + "SMTP_HOST": ("smtp_host", str.strip),
    ENV_PREFIX + "SMTP_PORT": ("smtp_port", _port),
    ENV_PREFIX + "SMTP_TLS": ("smtp_tls", _tls_mode),
    ENV_PREFIX + "SMTP_USERNAME": ("smtp_username", str),
    ENV_PREFIX + "SMTP_PASSWORD": ("smtp_password", Secret),
    ENV_PREFIX + "SMTP_INSECURE_AUTH_WITHOUT_TLS": ("smtp_insecure_auth_without_tls", _bool),
    ENV_PREFIX + "SMTP_PIPELINING": ("smtp_pipelining", _bool),
    ENV_PREFIX + "SMTP_CONNECT_TIMEOUT": ("smtp_connect_timeout_s", parse_duration_s),
    ENV_PREFIX + "SMTP_TIMEOUT": ("smtp_timeout_s", parse_duration_s),
    ENV_PREFIX + "SMTP_CONCURRENCY": ("smtp_concurrency", _positive_int),
    ENV_PREFIX + "DESTINATION_BY": ("destination_by", _destination_by),
    ENV_PREFIX + "DESTINATION_CONCURRENCY": ("destination_concurrency", _positive_int),
    ENV_PREFIX + "DESTINATION_RATE": ("destination_rate_per_s", _rate),
    ENV_PREFIX + "THROTTLE_PAUSE": ("throttle_pause_s", parse_duration_s),
    ENV_PREFIX + "THROTTLE_MAX_WAIT": ("throttle_max_wait_s", parse_duration_s),
    ENV_PREFIX + "SMTP_TLS_CA_FILE": ("smtp_tls_ca_file", _file),
    ENV_PREFIX + "ATTACHMENTS_ROOT": ("attachments_root", _attachments_root),
    ENV_PREFIX + "METRICS_PORT": ("metrics_port", _port),
    ENV_PREFIX + "LOG_LEVEL": ("log_level", _log_level),
    ENV_PREFIX + "EVENT_LOOP": ("event_loop", _event_loop),
    ENV_PREFIX + "BOUNCE_ADDRESS": ("bounce_address", _bounce_address),
    ENV_PREFIX + "BOUNCE_SECRET": ("bounce_secrets", _bounce_secrets),
    ENV_PREFIX + "BOUNCE_LISTEN": ("bounce_listen", _listen),
    ENV_PREFIX + "BOUNCE_TOKEN_MAX_AGE": ("bounce_token_max_age_s", parse_period_s),
    ENV_PREFIX + "SUPPRESSION_EXPIRY": ("suppression_expiry_s", parse_period_s),
    ENV_PREFIX + "SOFT_BOUNCE_LIMIT": ("soft_bounce_limit", _limit_or_off),
}


def env_name(field: str) -> str:
    """The environment variable that sets ``field``."""
    for name, (known, _) in FIELDS.items():
        if known == field:
            return name
    raise KeyError(field)
