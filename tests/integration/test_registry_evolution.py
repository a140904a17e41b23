"""The contract's first evolution through a real Schema Registry: version 2 of email_requested
(html, inline) registers as a BACKWARD-compatible version over version 1, a version 1 reader
reads the new records by their id, and today's reader reads records of version 1."""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

import support.registry
from postroom.schemas.codec import EmailRequested, encode, load_schema
from postroom.schemas.decoding import decode, earlier_versions
from postroom.schemas.framing import confluent_prefix
from postroom.schemas.registry import Registry, framing_for, register_contract
from postroom.sender.message import build_message
from postroom.settings import Settings
from postroom.topics import retry_topic, value_subject

pytestmark = pytest.mark.integration

NOW = dt.datetime(2026, 10, 1, 7, 0, tzinfo=dt.UTC)
V1 = earlier_versions("email_requested")[0]
EVENT = EmailRequested(
    idempotency_key="sales-report-2026-09|ceo@example.com", message_key="sales-report-2026-09",
    outbox_id=4, recipient="ceo@example.com", sender="reports@example.com", subject="Sales",
    body="Revenue 1,200", attachments=(), priority="normal", created_at=NOW,
    html="<table><tr><td>Revenue</td><td>1,200</td></tr></table>")


@pytest.fixture
def settings_v1(tmp_path: Path, stack_settings: Settings) -> Iterator[tuple[Settings, Path]]:
    """A prefix of this test's own whose subjects hold version 1, as before the upgrade."""
    url = support.registry.registry_url()
    settings = dataclasses.replace(stack_settings, schema_registry_url=url,
                                   topic_prefix=f"evo{os.urandom(5).hex()}.")
    (tmp_path / "email_requested.avsc").write_text(V1.text)
    (tmp_path / "email_result.avsc").write_text(load_schema("email_result").text)
    yield settings, tmp_path
    support.registry.delete_subjects(url, settings)


def test_version_2_registers_over_version_1_and_both_readers_read_both(
        settings_v1: tuple[Settings, Path]) -> None:
    settings, v1_dir = settings_v1
    before = {d.subject: d for d in register_contract(settings, "BACKWARD", schema_dir=v1_dir)}
    registry = Registry(settings)
    topic = retry_topic(settings.topic_prefix, 1)  # records of version 1 wait on retry tiers
    v1_id = before[value_subject(topic)].schema_id

    after = {d.subject: d for d in register_contract(settings, "BACKWARD")}

    # BACKWARD: the registry accepted version 2 as the next version of every subject
    requested = [s for s, d in after.items() if d.schema_name == "email_requested"]
    assert requested and all(after[s].new and after[s].version == before[s].version + 1
                             for s in requested)
    assert all(not d.new for d in after.values() if d.schema_name == "email_result")
    # a sender of the new release writes version 2 under its new id
    value, headers = framing_for(settings).frame(topic, EVENT)
    assert value[:5] == confluent_prefix(after[value_subject(topic)].schema_id)

    # a sender of the previous release (reader version 1) fetches the writer by its id
    old_sender = decode(EmailRequested, value, headers, reader=V1,
                        schema_by_id=Registry(settings).schema_by_id)
    assert old_sender.html is None and old_sender.body == "Revenue 1,200"
    assert build_message(old_sender, attachments_root=None,
                         now=NOW).get_content_type() == "text/plain"

    # today's sender reads a version 1 record written before the upgrade
    old_record = confluent_prefix(v1_id) + encode(dataclasses.replace(EVENT, html=None), V1)
    today = decode(EmailRequested, old_record, [], schema_by_id=registry.schema_by_id)
    assert today == dataclasses.replace(EVENT, html=None)
