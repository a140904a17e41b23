"""Every setting's declaration, one dataclass per group; Settings (postroom/settings.py) inherits
them all, its fields in this module's order (services, email, relay, sender, bounces, console),
which is the order of its repr and of README's table."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

from postroom import rules
from postroom import settings_values as v
from postroom.settings_declare import SAME_ROW, FileVariant, setting
from postroom.settings_kafka import (
    mask_kafka_config,
    mask_registry_config,
    mask_url,
    parse_kafka_config,
    registry_config,
)
from postroom.settings_values import (
    BOUNCE_LOCAL_MAX_CHARS,
    BOUNCE_SECRET_MIN_BYTES,
    Secret,
    TlsMode,
    parse_duration_s,
    parse_durations_s,
    parse_period_s,
)


@dataclasses.dataclass(frozen=True, repr=False)
class ServiceSettings:
    """Where postroom's services are: the database, Kafka and its topics, the schema registry."""

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


@dataclasses.dataclass(frozen=True, repr=False)
class EmailSettings:
    """What an email may be: its sender, the caps on its parts, where its attachments are read."""

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


@dataclasses.dataclass(frozen=True, repr=False)
class RelaySettings:
    """The relay's rounds and claims."""

    relay_batch_size: int = setting("RELAY_BATCH_SIZE", v.positive_int, 1000,
                                    meaning="rows per relay round")
    relay_poll_interval_s: float = setting(
        "RELAY_POLL_INTERVAL", parse_duration_s, 1.0, shown="`1s`",
        meaning="polling fallback when no NOTIFY arrives")
    relay_claim_ttl_s: float = setting(
        "RELAY_CLAIM_TTL", parse_duration_s, 60.0, shown="`60s`",
        meaning="how long a relay's claim on rows lasts while its database session lives (must "
                "exceed 30 s, the producer timeout); a dead relay's claims are free at once")


@dataclasses.dataclass(frozen=True, repr=False)
class SenderSettings:
    """The sender: its groups, retry tiers, SMTP server and connections, throttling, and what
    a role serves and logs."""

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


@dataclasses.dataclass(frozen=True, repr=False)
class BounceSettings:
    """Bounces: VERP return paths, DSN requests, the intake role, and the suppression list."""

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


@dataclasses.dataclass(frozen=True, repr=False)
class ConsoleSettings:
    """The console, ``postroom web``."""

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
    web_session_key: Secret | None = setting(  # noqa: RUF009 - as above
        "WEB_SESSION_KEY", v.web_session_key, shown="(none: one made at each start)",
        meaning=f"the key (at least {v.WEB_SESSION_KEY_MIN_CHARS} characters) that signs the "
                "console's session cookies, or a file holding it; give every replica the same, "
                "so that each takes the others' sessions and a restart signs no one out",
        file=FileVariant("WEB_SESSION_KEY_FILE", v.web_session_key, "wins"))
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
