"""What a role says when the broker refuses its credentials or TLS fails: the setting, no secret."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError

from postroom.kafka import explain_refusal

CONFIG = {"sasl.username": "postroom-relay", "sasl.mechanism": "SCRAM-SHA-512",
          "sasl.password": "hunter2-very-secret"}


@pytest.mark.parametrize(("code", "wanted"), [
    (KafkaError._AUTHENTICATION, ["sasl.username=postroom-relay", "sasl.mechanism=SCRAM-SHA-512",
                                  "check sasl.password in POSTROOM_KAFKA_CONFIG"]),
    (KafkaError._SSL, ["check ssl.ca.location", "POSTROOM_KAFKA_CONFIG_FILE"]),
])
def test_a_refusal_names_the_setting_and_never_the_secret(code: int, wanted: list[str]) -> None:
    text = explain_refusal(KafkaError(code, "librdkafka's own words"), CONFIG)
    assert text is not None
    assert all(w in text for w in wanted), text
    assert text.endswith("librdkafka's own words")
    assert "hunter2" not in text


@pytest.mark.parametrize("code", [KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN,
                                  KafkaError.TOPIC_AUTHORIZATION_FAILED])
def test_other_errors_are_no_refusal(code: int) -> None:
    assert explain_refusal(KafkaError(code, "x"), CONFIG) is None


def test_a_refusal_without_a_username_says_so() -> None:
    text = explain_refusal(KafkaError(KafkaError._AUTHENTICATION, "x"), {})
    assert text is not None and "(no sasl.username)" in text
