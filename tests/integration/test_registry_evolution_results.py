"""The results contract's second version (bounced, delayed, complained) through a real Schema
Registry: it registers as a BACKWARD-compatible version over version 1, today's recorder reads
version 1 results by their id, and a version 1 reader reads version 2's old statuses."""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

import support.registry
from postroom.schemas.codec import DeliveryStatus, EmailResult, encode, load_schema
from postroom.schemas.decoding import decode, earlier_versions
from postroom.schemas.framing import confluent_prefix
from postroom.schemas.registry import Registry, framing_for, register_contract
from postroom.settings import Settings
from postroom.topics import results_topic, value_subject

pytestmark = pytest.mark.integration

NOW = dt.datetime(2026, 10, 2, 7, 0, tzinfo=dt.UTC)
V1 = earlier_versions("email_result")[0]
RESULT = EmailResult(idempotency_key="sales-2026-09|old.manager@example.com", outbox_id=7,
                     recipient="old.manager@example.com", status=DeliveryStatus.SENT, attempt=1,
                     occurred_at=NOW)


@pytest.fixture
def settings_v1(tmp_path: Path, stack_settings: Settings) -> Iterator[tuple[Settings, Path]]:
    """A prefix of this test's own whose subjects hold results version 1, as before the upgrade."""
    url = support.registry.registry_url()
    settings = dataclasses.replace(stack_settings, schema_registry_url=url,
                                   topic_prefix=f"evr{os.urandom(5).hex()}.")
    (tmp_path / "email_requested.avsc").write_text(load_schema("email_requested").text)
    (tmp_path / "email_result.avsc").write_text(V1.text)
    yield settings, tmp_path
    support.registry.delete_subjects(url, settings)


def test_results_version_2_registers_over_version_1_and_both_readers_read_it(
        settings_v1: tuple[Settings, Path]) -> None:
    settings, v1_dir = settings_v1
    before = {d.subject: d for d in register_contract(settings, "BACKWARD", schema_dir=v1_dir)}
    topic = results_topic(settings.topic_prefix)
    subject = value_subject(topic)
    v1_id = before[subject].schema_id

    after = {d.subject: d for d in register_contract(settings, "BACKWARD")}

    assert after[subject].new and after[subject].version == before[subject].version + 1
    assert all(not d.new for d in after.values() if d.schema_name == "email_requested")
    registry = Registry(settings)
    bounced = dataclasses.replace(RESULT, status=DeliveryStatus.BOUNCED, enhanced_code="5.1.1")
    value, headers = framing_for(settings).frame(topic, bounced)
    assert value[:5] == confluent_prefix(after[subject].schema_id)
    assert decode(EmailResult, value, headers, schema_by_id=registry.schema_by_id) == bounced

    # a recorder of the previous release reads version 2's sent by the writer's id
    value, headers = framing_for(settings).frame(topic, RESULT)
    assert decode(EmailResult, value, headers, reader=V1,
                  schema_by_id=Registry(settings).schema_by_id) == RESULT

    # today's recorder reads a version 1 result written before the upgrade
    old_record = confluent_prefix(v1_id) + encode(RESULT, V1)
    assert decode(EmailResult, old_record, [], schema_by_id=registry.schema_by_id) == RESULT
