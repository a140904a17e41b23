"""`postroom lag`'s errors: a request no broker answered names the bootstrap servers; a refusal
(authorization) is the broker's own words. No request is made: the client is lazy."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from postroom.lag import LagReader
from postroom.settings import Settings


@pytest.mark.parametrize(("code", "text", "said"), [
    (KafkaError._TIMED_OUT, "Local: Timed out",
     "cannot describe group g on k1:9092,k2:9092 (POSTROOM_KAFKA_BOOTSTRAP_SERVERS): "
     "Local: Timed out [_TIMED_OUT]"),
    (KafkaError._TRANSPORT, "Local: Broker transport failure",
     "cannot describe group g on k1:9092,k2:9092 (POSTROOM_KAFKA_BOOTSTRAP_SERVERS): "
     "Local: Broker transport failure [_TRANSPORT]"),
    (KafkaError.GROUP_AUTHORIZATION_FAILED, "Broker: Group authorization failed",
     "cannot describe group g: Broker: Group authorization failed [GROUP_AUTHORIZATION_FAILED]"),
])
def test_a_request_without_an_answer_names_the_broker(code: int, text: str, said: str) -> None:
    reader = LagReader(Settings(kafka_bootstrap_servers="k1:9092,k2:9092"), {})
    try:
        assert str(reader._failed(KafkaException(KafkaError(code, text)),
                                  "cannot describe group g")) == said
    finally:
        reader.close()
