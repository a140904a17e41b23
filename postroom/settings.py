"""postroom's configuration: read once from ``POSTROOM_*`` environment variables and passed down.

Each setting is declared once, as a field of :class:`Settings` made by ``setting()``; parsing, the
repr's masking and README's table (``python -m postroom.settings --markdown``) follow from it.
Nothing else reads ``os.environ``. A table of our own, not pydantic-settings: a model of this size
imports in ~0.35 s against ~0.13 s here (every CLI call pays it), pydantic_core is a 5 MB compiled
dependency, and a frozen pydantic model does not take ``dataclasses.replace``.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from postroom import rules
from postroom import settings_values as v
from postroom.errors import ConfigError
from postroom.settings_declare import (
    ENV_PREFIX,
    SAME_ROW,
    FileVariant,
    declarations,
    from_file,
    parsed,
    setting,
)
from postroom.settings_declare import markdown_table as settings_table
from postroom.settings_kafka import (
    is_secret_key,
    mask_kafka_config,
    mask_registry_config,
    mask_url,
    mask_urls,
    parse_kafka_config,
    registry_config,
)
from postroom.settings_values import (
    BOUNCE_LOCAL_MAX_CHARS,
    BOUNCE_SECRET_MIN_BYTES,
    LONGEST_PERIOD_S,
    Secret,
    TlsMode,
    parse_duration_s,
    parse_durations_s,
    parse_period_s,
)

__all__ = ["BOUNCE_LOCAL_MAX_CHARS", "BOUNCE_SECRET_MIN_BYTES", "ENV_PREFIX", "FIELDS",
           "LONGEST_PERIOD_S", "PRODUCER_MESSAGE_TIMEOUT_MS", "REGISTRY_TIMEOUT_S", "Secret",
           "Settings", "TlsMode", "default_group", "env_name", "env_size_limits", "is_secret_key",
           "markdown_table",
           "mask_kafka_config", "mask_registry_config", "mask_url", "mask_urls", "parse_duration_s",
           "parse_durations_s", "parse_kafka_config", "parse_period_s"]

# How long a producer keeps trying to deliver one record (librdkafka's message.timeout.ms). A relay
# claim must outlast it, so a live relay's claim never runs out while its records still wait. (A
# claim whose relay's session ended is free at once: after a failed round the relay waits for its
# records before it closes that session, but a session cut under it, or ended by the server's
# keepalive, may free rows whose records are still on their way; the ledger sends a row
# published twice once.)
PRODUCER_MESSAGE_TIMEOUT_MS = 30_000
# How long one Schema Registry request may wait for an answer (the client's ``timeout``); the
# client then retries it (``max.retries``, 3 by default) before postroom reports the registry down.
REGISTRY_TIMEOUT_S = 10

@dataclasses.dataclass(frozen=True, repr=False)
class Settings:
    """Every setting postroom reads, each declared once. Build with :meth:`from_env`."""

    database_url: str | None = setting(
        "DATABASE_URL", v.database_url, shown="(required)", mask=mask_url,
        meaning="SQLAlchemy URL, psycopg driver: `postgresql+psycopg://user:pw@host:5432/db` "
                "(PostgreSQL 14 or newer)")
    database_schema: str | None = setting(  # None: the role's default search_path
        "DATABASE_SCHEMA", v.identifier, shown="role's search_path",
        meaning="PostgreSQL schema of the outbox tables (created by `db upgrade`)")
    kafka_bootstrap_servers: str | None = setting(
        "KAFKA_BOOTSTRAP_SERVERS", str.strip, shown="(required)",
        meaning="`host:port[,host:port]`; a command or role whose broker does not answer within "
                "10 s stops with one line naming this setting and what each address answered")
    kafka_config: Mapping[str, str] = setting(
        "KAFKA_CONFIG", parse_kafka_config, factory=dict, shown="", mask=mask_kafka_config,
        meaning="further librdkafka settings, `key=value` separated by newlines or `;` (e.g. "
                "`security.protocol=SASL_SSL;sasl.mechanism=SCRAM-SHA-512;sasl.username=u`)",
        file=FileVariant("KAFKA_CONFIG_FILE", parse_kafka_config, "under",
                         "the same from a properties file (for secrets such as `sasl.password`); "
                         "`POSTROOM_KAFKA_CONFIG` wins on conflicts"))
    # Only for producers, or only for consumers; each wins over kafka_config for its clients.
    kafka_producer_config: Mapping[str, str] = setting(
        "KAFKA_PRODUCER_CONFIG", parse_kafka_config, factory=dict, shown="",
        mask=mask_kafka_config,
        meaning="librdkafka settings for producers only (`linger.ms`, `batch.size`, "
                "`compression.type`, ...); win over `POSTROOM_KAFKA_CONFIG`; idempotence, "
                "`acks=all` and the message timeout stay as postroom needs them")
    kafka_consumer_config: Mapping[str, str] = setting(
        "KAFKA_CONSUMER_CONFIG", parse_kafka_config, factory=dict, shown="",
        mask=mask_kafka_config,
        meaning="librdkafka settings for consumers only (`session.timeout.ms`, "
                "`auto.commit.interval.ms`, fetch sizes, ...); win over `POSTROOM_KAFKA_CONFIG`; "
                "the group id and how offsets are stored stay postroom's")
    kafka_cluster_name: str = setting(
        "KAFKA_CLUSTER_NAME", str.strip, "default",
        meaning="the `cluster_name` label of the lag metrics (as kafka-lag-exporter sets it)")
    topic_prefix: str = setting("TOPIC_PREFIX", v.prefix, "postroom.",
                                meaning="prefix of every topic name")
    topic_partitions: int = setting("TOPIC_PARTITIONS", v.positive_int, 6,
                                    meaning="partitions of each topic `topics create` makes")
    topic_replication_factor: int = setting(
        "TOPIC_REPLICATION_FACTOR", v.replication_factor, -1, shown="`-1` (broker default)",
        meaning="replication factor of those topics")
    topic_config: Mapping[str, str] = setting(
        "TOPIC_CONFIG", parse_kafka_config, factory=dict, shown="",
        meaning="topic configs, `key=value;...` (e.g. `retention.ms=604800000`)")
    # None: schemaless Avro with a fingerprint header; set: the Confluent wire format
    schema_registry_url: str | None = setting(
        "SCHEMA_REGISTRY_URL", v.http_url, shown="(none: schemaless Avro)", mask=mask_url,
        meaning="a Confluent-compatible Schema Registry (Apicurio: "
                "`http://host:8080/apis/ccompat/v7`); set, every record is written in the "
                "Confluent wire format, subjects by topic name; readers take both formats "
                "([docs/architecture.md](docs/architecture.md#the-contract))")
    schema_registry_config: Mapping[str, str | float] = setting(
        "SCHEMA_REGISTRY_CONFIG", registry_config, factory=dict, shown="",
        mask=mask_registry_config,
        meaning="further settings of confluent-kafka's registry client, `key=value;...` (e.g. "
                "`basic.auth.credentials.source=USER_INFO;basic.auth.user.info=u:p;"
                "ssl.ca.location=/ca.pem`; secrets never printed, and a `;` inside a password "
                "stays in it unless a dotted key or `timeout` follows). "
                "`basic.auth.credentials.source` is read as Java clients write it and only "
                "`USER_INFO` is taken: confluent-kafka has no such key and reads "
                "`basic.auth.user.info` alone. A request waits `timeout=10` seconds for an answer "
                "and is retried `max.retries=3` times, unless set here")
    # enqueue
    mail_from: str = setting("MAIL_FROM", v.mail_from, "postroom@localhost",
                             meaning="From address when a row names none")
    attachment_max_bytes: int = setting(
        "ATTACHMENT_MAX_BYTES", v.positive_int, rules.DEFAULT_ATTACHMENT_MAX_BYTES,
        meaning="largest attachment, checked by `enqueue` and again by the sender when it reads "
                "the file")
    attachments_total_max_bytes: int = setting(
        "ATTACHMENTS_TOTAL_MAX_BYTES", v.positive_int, rules.DEFAULT_ATTACHMENT_MAX_BYTES,
        meaning="largest sum of one email's attachments and inline images (both sides; the "
                "sender refuses a file that would pass it by its size, before reading it)")
    body_max_bytes: int = setting("BODY_MAX_BYTES", v.positive_int, rules.DEFAULT_BODY_MAX_BYTES,
                                  meaning="largest body (UTF-8 bytes), both sides")
    event_max_bytes: int = setting(
        "EVENT_MAX_BYTES", v.event_max_bytes, rules.DEFAULT_EVENT_MAX_BYTES,
        meaning=f"largest encoded event; at most {rules.EVENT_MAX_BYTES_CEILING}, under Kafka's "
                "1 MB message size with room for retry headers. `enqueue` refuses a larger email, "
                "the relay fails such a row, the sender dead-letters such a record")
    attachments_root: Path | None = setting(  # noqa: RUF009 - a declaration, not a call per instance
        "ATTACHMENTS_ROOT", v.attachments_root, shown="(none: attachments off)",
        meaning="the sender reads attachments only below this directory, following no symbolic "
                "link below it; unset, emails with attachments or inline images wait as a "
                "configuration fault: on their retry tier, not counted as attempts and never "
                "dead, logged once at ERROR, counted in `postroom_attachments_waiting_total` and "
                "warned by `postroom check`; they go out once it is set and the sender restarted. "
                "`/` and `/proc`, `/sys`, `/dev`, `/run` are refused")
    # relay
    relay_batch_size: int = setting("RELAY_BATCH_SIZE", v.positive_int, 1000,
                                    meaning="rows per relay round")
    relay_poll_interval_s: float = setting(
        "RELAY_POLL_INTERVAL", parse_duration_s, 1.0, shown="`1s`",
        meaning="polling fallback when no NOTIFY arrives")
    relay_claim_ttl_s: float = setting(
        "RELAY_CLAIM_TTL", parse_duration_s, 60.0, shown="`60s`",
        meaning="how long a relay's claim on rows lasts while its database session lives (must "
                "exceed 30 s, the producer timeout); a dead relay's claims are free at once")
    # sender
    # "": derived from the topic prefix (<prefix>sender, <prefix>recorder), so environments that
    # share a broker under their own prefixes do not share a group.
    sender_group: str = setting(
        "SENDER_GROUP", str.strip, "", shown="`<prefix>sender` (`postroom.sender`)",
        meaning="consumer group of the senders, derived from `POSTROOM_TOPIC_PREFIX` so "
                "environments sharing a broker share no group. Earlier versions used "
                "`postroom-sender` whatever the prefix: an upgrade sets "
                "`POSTROOM_SENDER_GROUP=postroom-sender` to keep its committed offsets "
                "([operations](docs/operations.md#consumer-group-names))")
    recorder_group: str = setting(
        "RECORDER_GROUP", str.strip, "", shown="`<prefix>recorder` (`postroom.recorder`)",
        meaning="consumer group of the recorder, derived from the prefix likewise; was "
                "`postroom-recorder` (set it so to keep its offsets)")
    retry_delays_s: tuple[float, ...] = setting(
        "RETRY_DELAYS", parse_durations_s, (300.0, 600.0, 1200.0, 2400.0),
        shown="`5m,10m,20m,40m`",
        meaning="one delay per retry tier; attempts in all = tiers + 1")
    smtp_host: str = setting("SMTP_HOST", str.strip, "127.0.0.1", meaning="the mail server")
    smtp_port: int = setting("SMTP_PORT", v.tcp_port, 25, meaning=SAME_ROW)
    smtp_tls: TlsMode = setting(  # noqa: RUF009 - as above
        "SMTP_TLS", v.tls_mode, TlsMode.AUTO,
        meaning="`auto` (STARTTLS when offered; required when a username is set), `starttls` "
                "(required), `tls` (implicit), `none`; certificates are always verified")
    # extra CA certificates to trust for the SMTP server
    smtp_tls_ca_file: Path | None = setting(  # noqa: RUF009 - as above
        "SMTP_TLS_CA_FILE", v.existing_file, shown="",
        meaning="extra CA certificates to trust")
    smtp_username: str | None = setting("SMTP_USERNAME", str, shown="",
                                        meaning="AUTH user; AUTH only when set")
    # a Secret: starred wherever it is shown
    smtp_password: Secret | None = setting(  # noqa: RUF009 - as above
        "SMTP_PASSWORD", Secret, shown="",
        meaning="AUTH password, or a file holding it (never logged)",
        file=FileVariant("SMTP_PASSWORD_FILE", v.password_file, "wins"))
    # Sending the AUTH password over an unencrypted connection; named so nobody sets it by accident.
    smtp_insecure_auth_without_tls: bool = setting(
        "SMTP_INSECURE_AUTH_WITHOUT_TLS", v.boolean, False,
        meaning="`true` lets AUTH send the password over a connection without TLS (`none`, or "
                "`auto` with no STARTTLS offered); `postroom check` warns when it does")
    smtp_pipelining: bool = setting(
        "SMTP_PIPELINING", v.boolean, True,
        meaning="send MAIL, RCPT and DATA as one group (RFC 2920) when the server offers "
                "PIPELINING; `false` waits for each reply")
    smtp_connect_timeout_s: float = setting("SMTP_CONNECT_TIMEOUT", parse_duration_s, 30.0,
                                            shown="`30s`", meaning="connect and reply timeouts")
    smtp_timeout_s: float = setting("SMTP_TIMEOUT", parse_duration_s, 60.0, shown="`60s`",
                                    meaning=SAME_ROW)
    smtp_concurrency: int = setting(
        "SMTP_CONCURRENCY", v.positive_int, 20,
        meaning="SMTP connections (and parallel sends) per sender")
    # per-destination throttling (sender/throttle.py)
    destination_by: str = setting(
        "DESTINATION_BY", v.destination_by, "domain",
        meaning="what a throttling limit applies to: each recipient `domain`, or the `smarthost` "
                "(`POSTROOM_SMTP_HOST:PORT`) as one destination")
    destination_concurrency: int = setting(
        "DESTINATION_CONCURRENCY", v.positive_int, 20,
        meaning="sends at once per destination (Postfix's `default_destination_concurrency_limit`)")
    destination_rate_per_s: float = setting(
        "DESTINATION_RATE", v.rate, 0.0, shown="`0` (off)",
        meaning="sends started per destination, e.g. `2/s` or `30/m`")
    throttle_pause_s: float = setting(
        "THROTTLE_PAUSE", parse_duration_s, 60.0, shown="`60s`",
        meaning="pause of a destination after a burst of throttling replies (once, however many "
                "sends were in flight); doubles when sends after a pause are throttled again, up "
                "to 16 times")
    throttle_max_wait_s: float = setting(
        "THROTTLE_MAX_WAIT", parse_duration_s, 600.0, shown="`10m`",
        meaning="how long a throttled email is deferred without counting an attempt; after that "
                "the reply counts as a transient failure (retry tiers)")
    metrics_port: int | None = setting(
        "METRICS_PORT", v.listen_port, shown="(off)",
        meaning="serve Prometheus metrics on `127.0.0.1:PORT/metrics`, and `/healthz` and "
                "`/readyz` (`/metrics` never waits on the readiness checks; `/readyz` says `FAIL` "
                "for a check with no answer after 0.8 s); one port per process on a host (a "
                "port taken stops the role in one line), or `0` for any free one, logged at start")
    log_level: str = setting(
        "LOG_LEVEL", v.log_level, "INFO",
        meaning="`DEBUG`, `INFO`, `WARNING`, `ERROR`: what the roles (relay, sender, recorder) "
                "log; a command a person runs prints its result and, at `INFO`, only warnings "
                "beside it. librdkafka's lines go through it (its informational ones at `DEBUG`), "
                "a repeated one said once and then counted each minute")
    event_loop: str = setting(
        "EVENT_LOOP", v.event_loop, "auto",
        meaning="the sender's event loop: `uvloop` (a dependency where it builds; about a fifth "
                "less CPU per email, [docs/benchmarks.md](docs/benchmarks.md)), `asyncio`, or "
                "`auto`: uvloop when it is installed")
    # bounces (VERP return paths, DSN requests, the intake role) and the suppression list
    bounce_address: str | None = setting(  # None: envelope sender as before, no DSN requested
        "BOUNCE_ADDRESS", v.bounce_address, shown="(none: off)",
        meaning=f"a bare ASCII address (local part at most {BOUNCE_LOCAL_MAX_CHARS} characters) "
                "such as `bounces@bounce.example.com`: each email's envelope sender becomes "
                "`bounces+<token>@bounce.example.com`, the token naming its row, signed; a server "
                "that offers DSN is asked for failure and delay notices (RFC 3461). Unset, the "
                "envelope sender is the From address and nothing is asked. Needs a secret")
    bounce_secrets: tuple[bytes, ...] = setting(  # the first signs tokens, all verify (rotation)
        "BOUNCE_SECRET", v.bounce_secrets, (), shown="", mask=v.stars_each,
        meaning=f"secrets of at least {BOUNCE_SECRET_MIN_BYTES} bytes that sign the tokens, "
                "comma-separated (one a line in the file) for rotation: the first signs, every "
                "one verifies; never printed",
        file=FileVariant("BOUNCE_SECRET_FILE", v.bounce_secrets, "alone"))
    bounce_listen: tuple[str, int] = setting(
        "BOUNCE_LISTEN", v.listen, ("127.0.0.1", 2526), shown="`127.0.0.1:2526`",
        meaning="where `postroom bounces` listens for the bounce domain's mail (`host:port`, "
                "`[v6]:port`, `:port` for every interface)")
    bounce_token_max_age_s: float = setting(
        "BOUNCE_TOKEN_MAX_AGE", parse_period_s, 60 * 86400.0, shown="`60d`",
        meaning="a bounce whose token is older is ignored and counted (at most `36500d`)")
    bounce_max_sessions: int = setting(
        "BOUNCE_MAX_SESSIONS", v.positive_int, 100,
        meaning="SMTP sessions `postroom bounces` serves at once; one more is answered `421` and "
                "closed (Postfix's `default_process_limit`)")
    bounce_max_sessions_per_client: int = setting(
        "BOUNCE_MAX_SESSIONS_PER_CLIENT", v.positive_int, 50,
        meaning="of those, sessions from one client address (Postfix's "
                "`smtpd_client_connection_count_limit`); above the 20 a relay opens to one "
                "destination")
    suppression_expiry_s: float = setting(
        "SUPPRESSION_EXPIRY", parse_period_s, 30 * 86400.0, shown="`30d`",
        meaning="how long a bounce, a complaint or soft bounces keep an address suppressed "
                "(`suppression add --expires` sets its own); at most `36500d`, as `--expires`")
    # 0: never (as Amazon SES, whose list takes hard bounces and complaints only).
    soft_bounce_limit: int = setting(
        "SOFT_BOUNCE_LIMIT", v.limit_or_off, 0, shown="`0` (off)",
        meaning="emails in a row to an address that ended dead on the server's 4xx replies "
                "(every retry tier spent; not when the server was unreachable, nor on 421) and "
                "then suppress it, e.g. `3`; `0`: never, as Amazon SES")
    # postroom web, the console (postroom/web): it starts only with a way to sign in.
    web_listen: tuple[str, int] = setting(
        "WEB_LISTEN", v.listen, ("127.0.0.1", 8480), shown="`127.0.0.1:8480`",
        meaning="where `postroom web` serves the console (`host:port`); loopback unless a proxy "
                "in front needs more ([operations](docs/operations.md#the-console-postroom-web))")
    web_operator_token: Secret | None = setting(  # noqa: RUF009 - a declaration, not a call
        "WEB_OPERATOR_TOKEN", v.web_token, shown="",
        meaning=f"a token (at least {v.WEB_TOKEN_MIN_CHARS} characters) that signs in with the "
                "operator role (actions: suppress, replay, requeue), or a file holding it; "
                "`postroom web` refuses to start without a token or `POSTROOM_WEB_TRUSTED_PROXIES`",
        file=FileVariant("WEB_OPERATOR_TOKEN_FILE", v.web_token, "wins"))
    web_reader_token: Secret | None = setting(  # noqa: RUF009 - as above
        "WEB_READER_TOKEN", v.web_token, shown="",
        meaning="a token that signs in read-only (search, timelines, reports, lists), or a file "
                "holding it",
        file=FileVariant("WEB_READER_TOKEN_FILE", v.web_token, "wins"))
    web_trusted_proxies: tuple[str, ...] = setting(
        "WEB_TRUSTED_PROXIES", v.proxy_networks, (), shown="(none)",
        meaning="addresses or networks (`10.0.0.5,10.1.0.0/16`) of single-sign-on proxies "
                "(oauth2-proxy) whose `X-Forwarded-Email` header signs a request in; the header "
                "from any other address is ignored")
    web_hosts: tuple[str, ...] = setting(
        "WEB_HOSTS", v.host_names, (), shown="(none: any)",
        meaning="the host names (`Host` header, no port) the console answers to, e.g. the "
                "proxy's public name; any other is refused (400), so a name an attacker points "
                "at the console (DNS rebinding) reaches nothing; needed when "
                "`POSTROOM_WEB_TRUSTED_PROXIES` holds a loopback address")
    web_operators: frozenset[str] = setting(
        "WEB_OPERATORS", v.address_list, frozenset(), shown="(none)",
        meaning="addresses that a trusted proxy's `X-Forwarded-Email` gives the operator role; "
                "every other address it names reads only")
    web_trace_url: str | None = setting(
        "WEB_TRACE_URL", v.trace_url, shown="(none: trace ids unlinked)",
        meaning="the link of an email's trace id, `{trace_id}` replaced "
                "(`https://tempo.example.com/trace/{trace_id}`)")
    web_secure_cookie: bool = setting(
        "WEB_SECURE_COOKIE", v.boolean, False,
        meaning="`true` marks the console's session cookie Secure (sent over HTTPS only): set it "
                "behind a TLS proxy")

    # The consumer groups derived from the prefix, as (field, value): not a setting. Kept so that
    # dataclasses.replace(settings, topic_prefix=...) derives them again for the new prefix, while
    # a group given explicitly stays; the names themselves stay plain str (librdkafka's admin
    # calls fail on a str subclass).
    derived_groups: frozenset[tuple[str, str]] = dataclasses.field(default=frozenset(),
                                                                   compare=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Parse every ``POSTROOM_*`` variable; a malformed one raises ConfigError naming it."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for field, declared in declarations(Settings):
            raw = env.get(declared.env)
            if raw:
                values[field] = parsed(declared.env, declared.parse, raw)
            path = env.get(declared.file.env) if declared.file else None
            if declared.file is not None and path:
                values[field] = from_file(declared, path, values.get(field))
        return cls(**values)

    def __post_init__(self) -> None:
        derived = set()
        for field, role in (("sender_group", "sender"), ("recorder_group", "recorder")):
            group = getattr(self, field)
            # A derived group is derived again: dataclasses.replace(settings, topic_prefix=...)
            # hands the old prefix's group back, and it must follow the new prefix.
            if not group or (field, group) in self.derived_groups:
                group = default_group(self.topic_prefix, role)
                object.__setattr__(self, field, group)
                derived.add((field, group))
        object.__setattr__(self, "derived_groups", frozenset(derived))
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
        for field, declared in declarations(Settings):
            value = getattr(self, field)
            if declared.mask is not None and value:
                value = declared.mask(value)
            shown.append(f"{field}={value!r}")
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


def markdown_table() -> str:
    """README's settings table, generated from the declarations (``--markdown`` prints it)."""
    return settings_table(Settings)


def default_group(prefix: str, role: str) -> str:
    """The consumer group of ``role`` ("sender", "recorder") when its setting is unset:
    ``postroom.sender`` under the default prefix, ``staging.sender`` under ``staging.``."""
    return f"{prefix}{role}"


# Every variable (beside the *_FILE ones) -> (field, parser), derived from the declarations.
FIELDS: dict[str, tuple[str, Callable[[str], Any]]] = {
    declared.env: (field, declared.parse) for field, declared in declarations(Settings)}


def env_name(field: str) -> str:
    """The environment variable that sets ``field``."""
    for name, (known, _) in FIELDS.items():
        if known == field:
            return name
    raise KeyError(field)


# The variables of the caps enqueue applies in a job's process (SizeLimits' fields).
SIZE_LIMIT_VARIABLES = tuple(env_name(f.name) for f in dataclasses.fields(rules.SizeLimits))


def env_size_limits(env: Mapping[str, str] | None = None) -> rules.SizeLimits:
    """The caps on an email's parts from the environment's POSTROOM_*_MAX_BYTES alone, as
    Settings.size_limits() gives them: what enqueue applies when its caller passes no limits, so
    a job given the roles' caps refuses what the sender would. The job needs none of the other
    settings. A malformed one raises ConfigError naming it. Read at each call (four lookups);
    parsed once per set of values."""
    env = os.environ if env is None else env
    return _size_limits(tuple(env.get(name) or None for name in SIZE_LIMIT_VARIABLES))


@functools.lru_cache(maxsize=16)
def _size_limits(raw: tuple[str | None, ...]) -> rules.SizeLimits:
    given = {name: value for name, value in zip(SIZE_LIMIT_VARIABLES, raw, strict=True) if value}
    return Settings.from_env(given).size_limits()


if __name__ == "__main__":
    if sys.argv[1:] != ["--markdown"]:
        sys.exit("usage: python -m postroom.settings --markdown")
    sys.stdout.write(markdown_table())
