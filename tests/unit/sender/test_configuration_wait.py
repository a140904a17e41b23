"""An email our configuration keeps from being sent (no POSTROOM_ATTACHMENTS_ROOT) waits on its
retry tier, its attempt not counted, instead of walking the tiers to dead (issue 29 item 3)."""

from __future__ import annotations

import dataclasses
import datetime as dt
from pathlib import Path

import pytest

from postroom.rules import SizeLimits
from postroom.schemas.codec import DeliveryStatus, EmailRequested
from postroom.sender.admission import Admission, refuse_event
from postroom.sender.delivery import Delivery
from postroom.sender.outcome import Failure, SmtpReply, Stage, classify_reply, waits_for_configuration
from postroom.sender.retry import Action, RetryDecision, RetryPolicy
from postroom.sender.routing import Origin, route

NOW = dt.datetime(2026, 12, 2, 20, 0, tzinfo=dt.UTC)
DELAYS_S = (60.0, 300.0, 900.0)
POLICY = RetryPolicy(DELAYS_S)
ADMISSION = Admission.for_tiers(SizeLimits(), DELAYS_S)
EVENT = EmailRequested(
    idempotency_key="k|ops@example.com", message_key="k", outbox_id=7, recipient="ops@example.com",
    sender="reports@example.com", subject="S", body="b", attachments=("/srv/q3.xlsx",),
    priority="normal", created_at=NOW)
ROOT_MISSING = SmtpReply(Stage.LOCAL, None,
                         "POSTROOM_ATTACHMENTS_ROOT is not set: attachments are off", Failure.CONFIG)


def after(seconds: float) -> dt.datetime:
    return NOW + dt.timedelta(seconds=seconds)


@pytest.mark.parametrize(("attempt", "decision"), [
    (1, RetryDecision(Action.RETRY, tier=1, not_before=after(60), counted=False)),
    (2, RetryDecision(Action.RETRY, tier=1, not_before=after(60), counted=False)),
    (3, RetryDecision(Action.RETRY, tier=2, not_before=after(300), counted=False)),
    (4, RetryDecision(Action.RETRY, tier=3, not_before=after(900), counted=False)),  # the last
    (6, RetryDecision(Action.RETRY, tier=5, not_before=after(900), counted=False)),  # removed tier
])
def test_a_waiting_attempt_goes_back_to_its_tier_uncounted(attempt: int,
                                                           decision: RetryDecision) -> None:
    assert POLICY.wait(attempt, NOW) == decision


def test_with_no_tiers_there_is_nowhere_to_wait() -> None:
    assert RetryPolicy(()).wait(1, NOW) == RetryDecision(Action.DEAD)


@pytest.mark.parametrize("attempt", [1, 2, 3, 4, 9])
def test_a_waiting_email_is_never_dead_and_its_copy_is_admitted_where_it_goes(
        attempt: int) -> None:
    """Read, waited and forwarded ten times over from any attempt: always a retry on a tier
    that admits the forwarded record, never counted as an attempt (issue 45: the first wait
    counted one), its result saying the attempts made before it."""
    event = dataclasses.replace(EVENT, attempt=attempt)
    tier = attempt - 1 or None
    for _ in range(10):
        assert refuse_event(event, tier=tier, now=NOW, admission=dataclasses.replace(
            ADMISSION, max_attempt=max(ADMISSION.max_attempt, attempt))) is None
        decision = POLICY.wait(event.attempt, NOW)
        routing = route("p.", Origin(f"p.email.retry.{tier}", 0, 1), event,
                        classify_reply(ROOT_MISSING), decision, "", NOW)
        assert routing.status is DeliveryStatus.RETRYING
        assert routing.forward is not None
        assert "POSTROOM_ATTACHMENTS_ROOT is not set" in (routing.result.error or "")
        assert (routing.waited, routing.result.attempt) == (True, attempt - 1)
        event, tier = routing.forward.event, decision.tier
        assert routing.forward.topic == f"p.email.retry.{tier}"
    assert event.attempt == attempt


@pytest.mark.parametrize(("reply", "waits"), [
    (ROOT_MISSING, True),
    (SmtpReply(Stage.AUTH, None, "no AUTH mechanism", Failure.CONFIG), False),  # the server's side
    (SmtpReply(Stage.LOCAL, None, "attachment 'x' does not exist", Failure.BAD_MESSAGE), False),
    (SmtpReply(Stage.RCPT_TO, 451, "4.3.0 later"), False),
])
def test_only_a_local_configuration_fault_waits(reply: SmtpReply, waits: bool) -> None:
    assert waits_for_configuration(reply) is waits


def test_the_delivery_says_what_to_set_and_gives_the_reply_that_waits(
        caplog: pytest.LogCaptureFixture) -> None:
    import asyncio

    delivery = Delivery("reports@example.com", None, 30.0)

    async def twice() -> list[SmtpReply]:
        return [(await delivery.send(EVENT, None, NOW))[0] for _ in range(2)]  # type: ignore[arg-type]

    replies = asyncio.run(twice())
    assert all(waits_for_configuration(reply) for reply in replies)
    said = [r for r in caplog.records if "POSTROOM_ATTACHMENTS_ROOT" in r.getMessage()]
    assert [r.levelname for r in said] == ["ERROR"]  # once, however many emails wait
    assert "restart the sender" in said[0].getMessage()


def test_check_warns_without_a_root_and_fails_for_one_that_is_no_directory(tmp_path: Path) -> None:
    from postroom.errors import ConfigError
    from postroom.sender.delivery import AttachmentsOffWarning, check_attachments
    from postroom.settings import Settings

    with pytest.raises(AttachmentsOffWarning, match=r"POSTROOM_ATTACHMENTS_ROOT is not set: .* "
                                                    r"the sender is restarted"):
        check_attachments(Settings())
    with pytest.raises(ConfigError, match="POSTROOM_ATTACHMENTS_ROOT: not a directory"):
        check_attachments(Settings(attachments_root=tmp_path / "none"))
    assert str(tmp_path) in check_attachments(Settings(attachments_root=tmp_path))
