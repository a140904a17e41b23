"""Settings as a boundary: any string either parses or is refused by ConfigError naming its
variable; secrets of every kind (JWT-bearer keys, registry credentials with ';x=' inside) never
show in the repr, the DEBUG config lines or an error; README's registry example is one that
confluent-kafka takes."""

from __future__ import annotations

import logging
import re
import ssl
from pathlib import Path

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from hypothesis import given, settings
from hypothesis import strategies as st

from postroom.errors import ConfigError, KafkaClientError
from postroom.kafka import make_producer
from postroom.settings import FIELDS, Settings, is_secret_key, mask_kafka_config
from support.fuzz import examples

P = "POSTROOM_"
README = Path(__file__).parents[3] / "README.md"
# A secret with what once split it into a bogus key.
SECRET = "s3cr3t;x=y;wildly-secret"  # noqa: S105 - a value to look for in output

JWT_BEARER = {
    "sasl.oauthbearer.assertion.private.key.passphrase": SECRET,
    "sasl.oauthbearer.assertion.private.key.pem": SECRET,
    "ssl.keystore.password": SECRET,
    "sasl.oauthbearer.client.secret": SECRET,
    "ssl.certificate.pem": SECRET,  # not secret, but key material by its name: starred too
}
NOT_SECRET = ["bootstrap.servers", "sasl.username", "security.protocol",
              "sasl.oauthbearer.assertion.private.key.file", "ssl.key.location",
              "sasl.oauthbearer.method", "basic.auth.credentials.source", "ssl.ca.location"]


@pytest.mark.parametrize("key", sorted(JWT_BEARER))
def test_a_key_whose_name_says_secret_is_secret(key: str) -> None:
    assert is_secret_key(key)


@pytest.mark.parametrize("key", NOT_SECRET)
def test_the_others_are_not(key: str) -> None:
    assert not is_secret_key(key)


@pytest.mark.parametrize("variable", ["KAFKA_CONFIG", "KAFKA_PRODUCER_CONFIG",
                                      "KAFKA_CONSUMER_CONFIG"])
def test_jwt_bearer_secrets_never_show_in_the_repr(variable: str) -> None:
    text = ";".join(f"{k}={v}" for k, v in JWT_BEARER.items())
    loaded = Settings.from_env({P + "KAFKA_BOOTSTRAP_SERVERS": "k:9092",
                                P + variable: f"security.protocol=SASL_SSL;{text}"})
    field = {"KAFKA_CONFIG": loaded.kafka_config,
             "KAFKA_PRODUCER_CONFIG": loaded.kafka_producer_config,
             "KAFKA_CONSUMER_CONFIG": loaded.kafka_consumer_config}[variable]
    # Each secret whole: its ';x=y' is no entry of its own.
    assert dict(field) == {"security.protocol": "SASL_SSL", **JWT_BEARER}
    for shown in (repr(loaded), str(loaded)):
        assert "s3cr3t" not in shown and "wildly" not in shown
        assert "'sasl.oauthbearer.assertion.private.key.passphrase': '********'" in shown


def test_jwt_bearer_secrets_never_show_in_the_debug_config_line(
        caplog: pytest.LogCaptureFixture) -> None:
    loaded = Settings.from_env({
        P + "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1",
        P + "KAFKA_CONFIG": ";".join(f"{k}={v}" for k, v in JWT_BEARER.items())})
    with caplog.at_level(logging.DEBUG, logger="postroom.kafka"):
        try:
            make_producer(loaded).flush(0)
        except KafkaClientError as exc:  # librdkafka may refuse the made-up key material
            assert "s3cr3t" not in str(exc)
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("producer config")]
    assert "s3cr3t" not in line and "wildly" not in line
    assert mask_kafka_config(JWT_BEARER) == dict.fromkeys(JWT_BEARER, "********")


def test_a_registry_password_holding_semicolon_x_is_not_split_nor_shown() -> None:
    loaded = Settings.from_env({
        P + "SCHEMA_REGISTRY_URL": "https://sr.example.com",
        P + "SCHEMA_REGISTRY_CONFIG": f"basic.auth.user.info=reports:{SECRET};timeout=5"})
    config = loaded.registry_client_config()
    assert config == {"url": "https://sr.example.com", "timeout": 5,
                      "basic.auth.user.info": f"reports:{SECRET}"}
    SchemaRegistryClient(config)  # no bogus key 'x' for the client to refuse
    for shown in (repr(loaded), str(loaded)):
        assert "s3cr3t" not in shown and "'x'" not in shown and "wildly" not in shown


def test_a_registry_config_refused_names_the_variable_and_no_secret() -> None:
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({P + "SCHEMA_REGISTRY_CONFIG": f"basic.auth.user.info=u:{SECRET};"
                                                        "timeout=soon"})
    assert caught.value.setting == P + "SCHEMA_REGISTRY_CONFIG"
    assert "s3cr3t" not in str(caught.value) and "wildly" not in str(caught.value)


@pytest.mark.parametrize("source", ["URL", "SASL_INHERIT"])
def test_a_credentials_source_confluent_kafka_lacks_is_refused_by_name(source: str) -> None:
    with pytest.raises(ConfigError, match=re.escape("confluent-kafka takes only basic.auth.user.info")):
        Settings.from_env({P + "SCHEMA_REGISTRY_CONFIG": f"basic.auth.credentials.source={source}"})


def test_the_readme_registry_example_is_taken_by_confluent_kafka() -> None:
    row = next(line for line in README.read_text().splitlines()
               if line.startswith("| `POSTROOM_SCHEMA_REGISTRY_CONFIG` |"))
    [example] = re.findall(r"\(e\.g\. `([^`]+)`", row)
    # The CA file of the example must exist for the client to load it; this machine's stands in.
    ca_file = ssl.get_default_verify_paths().cafile or ssl.get_default_verify_paths().openssl_cafile
    assert Path(ca_file).is_file()
    written = example.replace("ssl.ca.location=/ca.pem", f"ssl.ca.location={ca_file}")
    assert written != example, "README's example no longer names ssl.ca.location=/ca.pem"
    loaded = Settings.from_env({P + "SCHEMA_REGISTRY_URL": "https://sr.example.com",
                                P + "SCHEMA_REGISTRY_CONFIG": written})
    SchemaRegistryClient(loaded.registry_client_config())


# Text that settings meet: anything, plus the shapes that once escaped (non-ASCII digits, 5,000
# nines, NUL, huge exponents, ';x=' inside secrets).
SETTING_TEXT = st.one_of(
    st.text(max_size=60),
    st.text(alphabet="0123456789-+.e /smhd;=:,\u0666\u00b2\x00 ", max_size=30),
    st.integers().map(str),
    st.just("9" * 5000), st.just("9" * 400 + "d"), st.just("1e999"), st.just("nan"),
)


@settings(max_examples=examples(1500), deadline=None)
@given(st.sampled_from(sorted(FIELDS)), SETTING_TEXT)
def test_any_setting_string_gives_a_value_or_a_config_error_naming_it(name: str,
                                                                       text: str) -> None:
    try:
        Settings.from_env({name: text, P + "KAFKA_BOOTSTRAP_SERVERS": "k:9092"})
    except ConfigError as exc:
        assert exc.setting == name
        assert "\n" not in str(exc)


@settings(max_examples=examples(200), deadline=None)
@given(st.sampled_from(["SMTP_PASSWORD_FILE", "KAFKA_CONFIG_FILE"]), SETTING_TEXT)
def test_any_file_setting_gives_a_value_or_one_config_error_line(name: str, text: str) -> None:
    try:
        Settings.from_env({P + name: text})
    except ConfigError as exc:
        assert exc.setting == P + name
        assert "\n" not in str(exc)


def test_a_password_file_that_is_not_utf8_is_refused_by_name(tmp_path: Path) -> None:
    secret = tmp_path / "password"
    secret.write_bytes(b"\xffhunter2\xfe")
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({P + "SMTP_PASSWORD_FILE": str(secret)})
    assert caught.value.setting == P + "SMTP_PASSWORD_FILE"
    assert "hunter2" not in str(caught.value)
