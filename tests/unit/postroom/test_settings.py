"""Tables for settings: every POSTROOM_* variable parsed, malformed ones named, secrets kept quiet."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest

from postroom.errors import ConfigError
from postroom.settings import (
    FIELDS,
    REGISTRY_TIMEOUT_S,
    Secret,
    Settings,
    TlsMode,
    env_name,
    mask_kafka_config,
    parse_duration_s,
    parse_durations_s,
    parse_kafka_config,
)

P = "POSTROOM_"

# env var, raw value -> field, parsed value (every entry of FIELDS but ATTACHMENTS_ROOT, which
# needs a real directory and has its own test)
ROUND_TRIPS = [
    ("DATABASE_URL", "postgresql+psycopg://app@db:5432/mail", "database_url",
     "postgresql+psycopg://app@db:5432/mail"),
    ("DATABASE_SCHEMA", "mail_v1", "database_schema", "mail_v1"),
    ("KAFKA_BOOTSTRAP_SERVERS", " k1:9092,k2:9092 ", "kafka_bootstrap_servers", "k1:9092,k2:9092"),
    ("TOPIC_PREFIX", "staging-eu_1.", "topic_prefix", "staging-eu_1."),
    ("KAFKA_CONFIG", "security.protocol=SASL_SSL;sasl.mechanism=PLAIN", "kafka_config",
     {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN"}),
    ("TOPIC_PARTITIONS", "12", "topic_partitions", 12),
    ("TOPIC_REPLICATION_FACTOR", "3", "topic_replication_factor", 3),
    ("TOPIC_REPLICATION_FACTOR", "-1", "topic_replication_factor", -1),
    ("TOPIC_CONFIG", "retention.ms=604800000", "topic_config", {"retention.ms": "604800000"}),
    ("MAIL_FROM", " reports@example.com ", "mail_from", "reports@example.com"),
    ("MAIL_FROM", "Reports <reports@example.com>", "mail_from", "Reports <reports@example.com>"),
    ("ATTACHMENT_MAX_BYTES", "1048576", "attachment_max_bytes", 1048576),
    ("RELAY_BATCH_SIZE", "500", "relay_batch_size", 500),
    ("RELAY_POLL_INTERVAL", "250ms", "relay_poll_interval_s", 0.25),
    ("RELAY_CLAIM_TTL", "2m", "relay_claim_ttl_s", 120.0),
    ("SENDER_GROUP", "senders", "sender_group", "senders"),
    ("RECORDER_GROUP", "recorders", "recorder_group", "recorders"),
    ("RETRY_DELAYS", "5m,10m,20m,40m", "retry_delays_s", (300.0, 600.0, 1200.0, 2400.0)),
    ("RETRY_DELAYS", "1s, 2s", "retry_delays_s", (1.0, 2.0)),
    ("SMTP_HOST", " mail.example.com ", "smtp_host", "mail.example.com"),
    ("SMTP_PORT", "587", "smtp_port", 587),
    ("SMTP_TLS", "STARTTLS", "smtp_tls", TlsMode.STARTTLS),
    ("SMTP_TLS", "none", "smtp_tls", TlsMode.NONE),
    ("SMTP_USERNAME", "reports", "smtp_username", "reports"),
    ("SMTP_PASSWORD", "hunter2", "smtp_password", Secret("hunter2")),
    ("SMTP_CONNECT_TIMEOUT", "10", "smtp_connect_timeout_s", 10.0),
    ("SMTP_TIMEOUT", "1.5m", "smtp_timeout_s", 90.0),
    ("SMTP_CONCURRENCY", "4", "smtp_concurrency", 4),
    ("METRICS_PORT", "9108", "metrics_port", 9108),
    ("METRICS_PORT", "0", "metrics_port", 0),  # any free port, logged
    ("LOG_LEVEL", "debug", "log_level", "DEBUG"),
    ("EVENT_LOOP", " UVloop", "event_loop", "uvloop"),
    ("EVENT_LOOP", "asyncio", "event_loop", "asyncio"),
    ("BODY_MAX_BYTES", "1000", "body_max_bytes", 1000),
    ("ATTACHMENTS_TOTAL_MAX_BYTES", "2000", "attachments_total_max_bytes", 2000),
    ("EVENT_MAX_BYTES", "900000", "event_max_bytes", 900000),
    ("SMTP_INSECURE_AUTH_WITHOUT_TLS", "true", "smtp_insecure_auth_without_tls", True),
    ("SMTP_INSECURE_AUTH_WITHOUT_TLS", "No", "smtp_insecure_auth_without_tls", False),
    ("SCHEMA_REGISTRY_URL", " http://registry:8081/ ", "schema_registry_url",
     "http://registry:8081"),
    ("SCHEMA_REGISTRY_URL", "https://sr.example.com/apis/ccompat/v7", "schema_registry_url",
     "https://sr.example.com/apis/ccompat/v7"),
    ("SCHEMA_REGISTRY_CONFIG", "basic.auth.user.info=u:p;ssl.ca.location=/ca.pem",
     "schema_registry_config", {"basic.auth.user.info": "u:p", "ssl.ca.location": "/ca.pem"}),
]


@pytest.mark.parametrize(("name", "raw", "field", "expected"), ROUND_TRIPS)
def test_from_env_parses(name: str, raw: str, field: str, expected: Any) -> None:
    settings = Settings.from_env({P + name: raw})
    assert getattr(settings, field) == expected
    assert settings == Settings(**{field: expected})  # built anew: what derives from it, too


@pytest.mark.parametrize("name", sorted(FIELDS))
@pytest.mark.parametrize("raw", ["x\x00?", "-1"])
def test_any_value_sets_only_its_field_or_is_refused_by_name(name: str, raw: str) -> None:
    """Holds for settings added later too, whether or not they have a ROUND_TRIPS row."""
    try:
        settings = Settings.from_env({name: raw})
    except ConfigError as exc:
        assert exc.setting == name
        return
    field = FIELDS[name][0]
    changed = {f.name for f in dataclasses.fields(Settings) if "setting" in f.metadata
               and getattr(settings, f.name) != getattr(Settings(), f.name)}
    derived = {"sender_group", "recorder_group"} if field == "topic_prefix" else set()
    assert changed <= {field} | derived


def test_attachments_root_is_resolved(tmp_path: Path) -> None:
    (tmp_path / "reports").mkdir()
    settings = Settings.from_env({P + "ATTACHMENTS_ROOT": str(tmp_path / "x" / ".." / "reports")})
    assert settings.attachments_root == (tmp_path / "reports").resolve()


def test_a_missing_attachments_root_is_refused_by_the_sender_check_only(tmp_path: Path) -> None:
    settings = Settings.from_env({P + "ATTACHMENTS_ROOT": str(tmp_path / "missing")})
    with pytest.raises(ConfigError, match="not a directory") as caught:
        settings.check_attachments_root()
    assert caught.value.setting == P + "ATTACHMENTS_ROOT"
    Settings.from_env({P + "ATTACHMENTS_ROOT": str(tmp_path)}).check_attachments_root()


def test_empty_environment_gives_defaults() -> None:
    assert Settings.from_env({}) == Settings()


def test_empty_values_are_ignored() -> None:
    assert Settings.from_env({name: "" for name in FIELDS}) == Settings()


def test_unrelated_variables_are_ignored() -> None:
    assert Settings.from_env({"SMTP_PORT": "x", "POSTROOM": "y", "PATH": "/bin"}) == Settings()


@pytest.mark.parametrize(("name", "raw", "problem"), [
    ("DATABASE_URL", "mysql://app@db/mail", "postgresql"),
    ("DATABASE_SCHEMA", "Mail", "identifier"),
    ("DATABASE_SCHEMA", "1mail", "identifier"),
    ("DATABASE_SCHEMA", "mail;drop", "identifier"),
    ("TOPIC_PREFIX", "bad prefix/", "topic prefix"),
    ("KAFKA_CONFIG", "security.protocol", "key=value"),
    ("KAFKA_CONFIG", "=SASL_SSL", "key=value"),
    ("TOPIC_PARTITIONS", "0", "at least 1"),
    ("TOPIC_PARTITIONS", "six", "expected a whole number such as 10, got 'six'"),
    ("TOPIC_PARTITIONS", "6.0", "expected a whole number such as 10, got '6.0'"),
    ("TOPIC_PARTITIONS", "\u0666", "expected a whole number"),  # int() takes Arabic-Indic digits
    ("TOPIC_PARTITIONS", "9" * 5000, "expected a whole number such as 10, got '99999"),
    ("TOPIC_REPLICATION_FACTOR", "0", "-1 for the broker default"),
    ("TOPIC_REPLICATION_FACTOR", "-2", "-1 for the broker default"),
    ("TOPIC_CONFIG", "retention.ms", "key=value"),
    ("ATTACHMENT_MAX_BYTES", "-5", "at least 1"),
    ("RELAY_POLL_INTERVAL", "0", "positive"),
    ("RELAY_POLL_INTERVAL", "soon", "not a duration"),
    ("RELAY_CLAIM_TTL", "-1s", "not a duration"),
    ("RELAY_CLAIM_TTL", "20s", r"longer than the producer's message timeout \(30s\), got 20s"),
    ("RELAY_CLAIM_TTL", "30s", "longer than the producer's message timeout"),
    ("RETRY_DELAYS", "5m,later", "not a duration"),
    ("RETRY_DELAYS", "5m,0s", "positive"),
    ("SMTP_PORT", "0", "not a TCP port"),
    ("SMTP_PORT", "65536", "not a TCP port"),
    ("SMTP_PORT", "smtp", r"expected a whole number such as 25 \(a TCP port, 1 to 65535\), got 'smtp'"),
    ("SMTP_PORT", "abc", r"expected a whole number such as 25 \(a TCP port, 1 to 65535\), got 'abc'"),
    ("METRICS_PORT", "9464.0", "expected a whole number such as 9108"),
    ("TOPIC_REPLICATION_FACTOR", "three", "expected a whole number such as 3, or -1"),
    ("RELAY_BATCH_SIZE", "1k", "expected a whole number"),
    ("DESTINATION_RATE", "fast/s", "expected a rate such as 2/s or 30/m, got 'fast/s'"),
    ("SMTP_TIMEOUT", "9" * 400 + "d", "is too long"),
    ("SMTP_TLS", "ssl", "auto, starttls, tls, none"),
    ("SMTP_CONNECT_TIMEOUT", "5min", "not a duration"),
    ("SMTP_TIMEOUT", "1e3", "not a duration"),
    ("SMTP_CONCURRENCY", "0", "at least 1"),
    ("ATTACHMENTS_ROOT", "/no/such\0dir", "null"),
    ("METRICS_PORT", "99999", "not a TCP port"),
    ("LOG_LEVEL", "TRACE", "DEBUG, INFO, WARNING or ERROR"),
    ("EVENT_LOOP", "trio", "auto, uvloop or asyncio"),
    ("EVENT_MAX_BYTES", "1048576", "well under Kafka's default message.max.bytes"),
    ("MAIL_FROM", "Smith, John <j@example.com>", "not one address"),
    ("MAIL_FROM", "a@example.com, eve@evil.example", "invalid local part"),
    ("SMTP_INSECURE_AUTH_WITHOUT_TLS", "maybe", "true or false"),
    ("ATTACHMENTS_ROOT", "/", "cannot be the attachments root"),
    ("ATTACHMENTS_ROOT", "/proc/self", "pseudo"),
    ("ATTACHMENTS_ROOT", "/dev", "pseudo"),
])
def test_malformed_value_raises_config_error_naming_the_variable(
        name: str, raw: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem) as caught:
        Settings.from_env({P + name: raw, P + "SMTP_HOST": "fine.example.com"})
    assert caught.value.setting == P + name
    assert str(caught.value).startswith(f"{P}{name}: ")


def test_password_file_is_read_without_its_line_break(tmp_path: Path) -> None:
    secret_file = tmp_path / "smtp-password"
    secret_file.write_text("s3cret pass\r\n")
    settings = Settings.from_env({P + "SMTP_PASSWORD_FILE": str(secret_file)})
    assert settings.smtp_password == Secret("s3cret pass")


def test_missing_password_file_names_its_variable(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({P + "SMTP_PASSWORD_FILE": str(tmp_path / "absent")})
    assert caught.value.setting == P + "SMTP_PASSWORD_FILE"


def test_kafka_config_file_is_merged_under_the_env_value(tmp_path: Path) -> None:
    config_file = tmp_path / "client.properties"
    config_file.write_text("# shared\nsecurity.protocol=SSL\nclient.id=from-file\n")
    settings = Settings.from_env({P + "KAFKA_CONFIG_FILE": str(config_file),
                                  P + "KAFKA_CONFIG": "client.id=from-env"})
    assert settings.kafka_config == {"security.protocol": "SSL", "client.id": "from-env"}


@pytest.mark.parametrize("content", [None, "not a pair\n"])
def test_bad_kafka_config_file_names_its_variable(tmp_path: Path, content: str | None) -> None:
    config_file = tmp_path / "client.properties"
    if content is not None:
        config_file.write_text(content)
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({P + "KAFKA_CONFIG_FILE": str(config_file)})
    assert caught.value.setting == P + "KAFKA_CONFIG_FILE"


PASSWORD = "correct-horse-battery-staple"  # noqa: S105 - a value to look for in output


@pytest.mark.parametrize("render", [repr, str, lambda s: f"{s}", lambda s: f"{s!r}"])
def test_smtp_password_never_shows(render: Any) -> None:
    settings = Settings.from_env({P + "SMTP_PASSWORD": PASSWORD, P + "SMTP_USERNAME": "reports"})
    shown = render(settings)
    assert PASSWORD not in shown
    assert "smtp_password=Secret('********')" in shown
    assert "smtp_username='reports'" in shown  # the render did include the fields


def test_secret() -> None:
    secret = Secret(PASSWORD)
    assert secret.reveal() == PASSWORD
    assert PASSWORD not in repr(secret) + str(secret) + f"{secret}" + repr([secret])
    assert secret == Secret(PASSWORD)
    assert secret != Secret("other")
    assert secret != PASSWORD
    assert hash(secret) == hash(Secret(PASSWORD))


def test_kafka_password_never_shows() -> None:
    settings = Settings.from_env({P + "KAFKA_CONFIG": f"sasl.password={PASSWORD}"})
    assert PASSWORD not in repr(settings)


def test_database_password_never_shows() -> None:
    settings = Settings.from_env({P + "DATABASE_URL": f"postgresql://app:{PASSWORD}@db/mail"})
    assert PASSWORD not in repr(settings)


def test_kafka_password_with_a_semicolon_is_neither_split_nor_echoed() -> None:
    try:
        settings = Settings.from_env({P + "KAFKA_CONFIG": "sasl.password=abc;horse-staple"})
    except ConfigError as exc:
        assert "horse-staple" not in str(exc)
    else:
        assert settings.kafka_config == {"sasl.password": "abc;horse-staple"}


@pytest.mark.parametrize(("name", "value"), [
    ("DATABASE_URL", f"postgresql+psycopg://app@db/mail?password={PASSWORD}"),
    ("DATABASE_URL", f"postgresql+psycopg://app@db/mail?sslmode=require&sslpassword={PASSWORD}&x=1"),
    ("DATABASE_URL", f"postgresql+psycopg://app:{PASSWORD}@db/mail?PassWord={PASSWORD}"),
    ("KAFKA_CONFIG", f"sasl.oauthbearer.config=principal=me scope=x secret={PASSWORD}"),
    ("KAFKA_CONFIG", f"sasl.password=abc;{PASSWORD}=x"),
    ("KAFKA_CONFIG", f"security.protocol=SASL_SSL;sasl.password=abc;{PASSWORD}=x;sasl.mechanism=PLAIN"),
])
def test_secrets_in_the_url_query_and_kafka_config_never_show(name: str, value: str) -> None:
    shown = repr(Settings.from_env({P + name: value}))
    assert PASSWORD not in shown
    assert "********" in shown


def test_a_semicolon_inside_a_password_stays_in_the_password() -> None:
    assert parse_kafka_config("sasl.password=abc;def=ghi;sasl.mechanism=PLAIN") == {
        "sasl.password": "abc;def=ghi", "sasl.mechanism": "PLAIN"}


@pytest.mark.parametrize(("field", "name"), [
    ("database_url", "POSTROOM_DATABASE_URL"),
    ("retry_delays_s", "POSTROOM_RETRY_DELAYS"),
    ("smtp_password", "POSTROOM_SMTP_PASSWORD"),
    ("relay_poll_interval_s", "POSTROOM_RELAY_POLL_INTERVAL"),
])
def test_env_name(field: str, name: str) -> None:
    assert env_name(field) == name


def test_env_name_of_every_field() -> None:
    for name, (field, _) in FIELDS.items():
        assert env_name(field) == name
    with pytest.raises(KeyError):
        env_name("no_such_field")


def test_every_env_var_sets_a_real_field() -> None:
    fields = {f.name for f in dataclasses.fields(Settings)}
    assert {field for field, _ in FIELDS.values()} <= fields


def test_require() -> None:
    assert Settings(database_url="postgresql://db/mail").require("database_url") == (
        "postgresql://db/mail")
    with pytest.raises(ConfigError, match=r"^POSTROOM_KAFKA_BOOTSTRAP_SERVERS: is not set$"):
        Settings().require("kafka_bootstrap_servers")


def test_kafka_client_config() -> None:
    settings = Settings(kafka_bootstrap_servers="k:9092", kafka_config={"client.id": "me"})
    assert settings.kafka_client_config() == {"bootstrap.servers": "k:9092", "client.id": "me"}
    with pytest.raises(ConfigError, match="POSTROOM_KAFKA_BOOTSTRAP_SERVERS"):
        Settings().kafka_client_config()


@pytest.mark.parametrize(("text", "expected"), [
    ("", {}),
    ("a=1", {"a": "1"}),
    ("a=1;b=2", {"a": "1", "b": "2"}),
    ("a=1\nb=2\n", {"a": "1", "b": "2"}),
    ("a=1\r\nb=2", {"a": "1", "b": "2"}),
    ("  a  =  1  ", {"a": "1"}),
    ("# comment\na=1\n   # indented comment\n\n", {"a": "1"}),
    ("a=", {"a": ""}),
    ("a=x=y", {"a": "x=y"}),
    ("a=1;a=2", {"a": "2"}),
    # ';' separates entries only where a key follows, so secrets may hold ';'.
    ("sasl.mechanism=SCRAM-SHA-512;;", {"sasl.mechanism": "SCRAM-SHA-512;;"}),
    ("a=1;b", {"a": "1;b"}),
    ("sasl.password=x;y;security.protocol=SSL", {"sasl.password": "x;y", "security.protocol": "SSL"}),
])
def test_parse_kafka_config(text: str, expected: dict[str, str]) -> None:
    assert parse_kafka_config(text) == expected


@pytest.mark.parametrize("text", ["a", "=1", " = 1", "a=1\nnot a pair"])
def test_parse_kafka_config_rejects(text: str) -> None:
    with pytest.raises(ValueError, match=r"entry \d+ is not of the form key=value"):
        parse_kafka_config(text)


@pytest.mark.parametrize(("config", "expected"), [
    ({}, {}),
    ({"client.id": "me"}, {"client.id": "me"}),
    ({"sasl.password": "x", "sasl.username": "u"}, {"sasl.password": "********",
                                                    "sasl.username": "u"}),
    ({"ssl.key.password": "x", "ssl.keystore.password": "y", "ssl.key.pem": "z",
      "sasl.oauthbearer.client.secret": "w"},
     {"ssl.key.password": "********", "ssl.keystore.password": "********",
      "ssl.key.pem": "********", "sasl.oauthbearer.client.secret": "********"}),
])
def test_mask_kafka_config(config: dict[str, str], expected: dict[str, str]) -> None:
    original = dict(config)
    assert mask_kafka_config(config) == expected
    assert config == original  # a copy, the input untouched


@pytest.mark.parametrize(("text", "expected"), [
    ("5m", 300.0),
    ("300", 300.0),
    ("300s", 300.0),
    ("500ms", 0.5),
    ("1.5h", 5400.0),
    ("2.5", 2.5),
    (" 2 s ", 2.0),
    ("1h", 3600.0),
    ("0.001s", 0.001),
])
def test_parse_duration_s(text: str, expected: float) -> None:
    assert parse_duration_s(text) == pytest.approx(expected)


@pytest.mark.parametrize(("text", "problem"), [
    ("", "not a duration"),
    ("0", "positive"),
    ("0ms", "positive"),
    ("-5m", "not a duration"),
    ("5 min", "not a duration"),
    ("5M", "not a duration"),
    ("1e3", "not a duration"),
    (".5s", "not a duration"),
    ("5m10s", "not a duration"),
    ("nan", "not a duration"),
])
def test_parse_duration_s_rejects(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        parse_duration_s(text)


@pytest.mark.parametrize(("text", "expected"), [
    ("", ()),
    ("5m", (300.0,)),
    ("5m,10m,20m,40m", (300.0, 600.0, 1200.0, 2400.0)),
    (" 1s , 2s ", (1.0, 2.0)),
    ("5m,,10m,", (300.0, 600.0)),
])
def test_parse_durations_s(text: str, expected: tuple[float, ...]) -> None:
    assert parse_durations_s(text) == expected


@pytest.mark.parametrize("text", ["5m,x", "5m;10m", "0,5m"])
def test_parse_durations_s_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_durations_s(text)


@pytest.mark.parametrize(("name", "raw", "problem"), [
    ("SCHEMA_REGISTRY_URL", "registry:8081", "expected an http(s) URL"),
    ("SCHEMA_REGISTRY_URL", "ftp://registry", "expected an http(s) URL"),
    ("SCHEMA_REGISTRY_CONFIG", "url=http://x", "goes in POSTROOM_SCHEMA_REGISTRY_URL"),
    ("SCHEMA_REGISTRY_CONFIG", "no pair", "not of the form key=value"),
    ("SCHEMA_REGISTRY_CONFIG", "timeout=soon", "timeout must be a number of at least 0, got 'soon'"),
    ("SCHEMA_REGISTRY_CONFIG", "max.retries=-1", "max.retries must be a number of at least 0"),
    ("SCHEMA_REGISTRY_CONFIG", "timeout=inf", "timeout must be a number of at least 0"),
])
def test_registry_settings_refuse(name: str, raw: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(problem)) as caught:
        Settings.from_env({P + name: raw})
    assert caught.value.setting == P + name


@pytest.mark.parametrize("render", [repr, str])
def test_registry_secrets_never_show(render: Any) -> None:
    settings = Settings.from_env({
        P + "SCHEMA_REGISTRY_URL": f"https://reports:{PASSWORD}@sr.example.com",
        P + "SCHEMA_REGISTRY_CONFIG": f"basic.auth.user.info=reports:{PASSWORD};"
                                      "basic.auth.credentials.source=USER_INFO"})
    shown = render(settings)
    assert PASSWORD not in shown
    assert "https://reports:********@sr.example.com" in shown
    assert "'basic.auth.user.info': '********'" in shown
    # the client gets the real values; confluent-kafka refuses basic.auth.credentials.source
    # (USER_INFO is what it does anyway)
    assert settings.registry_client_config() == {
        "url": f"https://reports:{PASSWORD}@sr.example.com", "timeout": REGISTRY_TIMEOUT_S,
        "basic.auth.user.info": f"reports:{PASSWORD}"}


def test_registry_numbers_reach_the_client_as_numbers() -> None:
    """The registry client refuses '5' where it wants 5; a request waits REGISTRY_TIMEOUT_S
    unless told otherwise."""
    url = {P + "SCHEMA_REGISTRY_URL": "http://sr:8081"}
    assert Settings.from_env(url).registry_client_config()["timeout"] == REGISTRY_TIMEOUT_S
    settings = Settings.from_env({**url, P + "SCHEMA_REGISTRY_CONFIG":
                                  "timeout=2.5;max.retries=1;retries.wait.ms=50"})
    assert settings.registry_client_config() == {
        "url": "http://sr:8081", "timeout": 2.5, "max.retries": 1, "retries.wait.ms": 50}


def test_registry_client_config_needs_the_url() -> None:
    with pytest.raises(ConfigError, match="POSTROOM_SCHEMA_REGISTRY_URL: is not set"):
        Settings().registry_client_config()


@pytest.mark.parametrize(("env", "sender", "recorder"), [
    ({}, "postroom.sender", "postroom.recorder"),
    ({"TOPIC_PREFIX": "staging."}, "staging.sender", "staging.recorder"),
    # An upgrade keeps its committed offsets by naming the groups it used before.
    ({"TOPIC_PREFIX": "staging.", "SENDER_GROUP": "postroom-sender",
      "RECORDER_GROUP": "postroom-recorder"}, "postroom-sender", "postroom-recorder"),
    ({"TOPIC_PREFIX": "staging.", "SENDER_GROUP": " "}, "staging.sender", "staging.recorder"),
])
def test_the_consumer_groups_follow_the_topic_prefix_unless_set(
        env: dict[str, str], sender: str, recorder: str) -> None:
    settings = Settings.from_env({P + name: value for name, value in env.items()})
    assert (settings.sender_group, settings.recorder_group) == (sender, recorder)


def test_two_environments_on_one_broker_share_no_group() -> None:
    prod, staging = (Settings.from_env({P + "TOPIC_PREFIX": p}) for p in ("prod.", "staging."))
    assert {prod.sender_group, prod.recorder_group}.isdisjoint(
        {staging.sender_group, staging.recorder_group})
