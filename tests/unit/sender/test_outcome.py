"""Tables for classify_reply: what each SMTP reply or failure means for delivery."""

from __future__ import annotations

import pytest

from postroom.sender.outcome import (
    MESSAGE_STAGES,
    REASON_MAX_CHARS,
    SESSION_STAGES,
    Failure,
    Outcome,
    SmtpReply,
    Stage,
    Verdict,
    classify_reply,
    parse_enhanced_code,
)

SENT, TRANSIENT, PERMANENT = Verdict.SENT, Verdict.TRANSIENT, Verdict.PERMANENT
S = Stage

# (stage, code, text) -> (verdict, server_fault, enhanced_code, reason)
CODED = [
    # accepted
    pytest.param(S.DATA, 250, "2.0.0 Ok: queued as 4F2A1", SENT, False, "2.0.0",
                 "250 2.0.0 Ok: queued as 4F2A1", id="250-data"),
    pytest.param(S.DATA, 250, "Ok", SENT, False, None, "250 Ok", id="250-data-no-enhanced"),
    pytest.param(S.RCPT_TO, 250, "2.1.5 Ok", SENT, False, "2.1.5", "250 2.1.5 Ok", id="250-rcpt"),
    pytest.param(S.RCPT_TO, 251, "2.1.5 User not local; will forward", SENT, False, "2.1.5",
                 "251 2.1.5 User not local; will forward", id="251-rcpt"),
    pytest.param(S.DATA, 250, "", SENT, False, None, "250", id="250-empty-text"),
    # 2xx before any recipient: the message cannot have been delivered
    pytest.param(S.EHLO, 250, "mail.example.com", TRANSIENT, True, None,
                 "dialogue ended before the message was accepted: 250 mail.example.com (ehlo)",
                 id="250-ehlo-unexpected"),
    pytest.param(S.MAIL_FROM, 250, "2.1.0 Ok", TRANSIENT, True, "2.1.0",
                 "dialogue ended before the message was accepted: 250 2.1.0 Ok (mail_from)",
                 id="250-mail-from-unexpected"),
    pytest.param(S.GREETING, 220, "mx ESMTP", TRANSIENT, True, None,
                 "dialogue ended before the message was accepted: 220 mx ESMTP (greeting)",
                 id="220-greeting-unexpected"),
    # 421 closing, at every stage
    *(pytest.param(stage, 421, "4.3.2 Service shutting down", TRANSIENT, True, "4.3.2",
                   "421 4.3.2 Service shutting down"
                   + ("" if stage in MESSAGE_STAGES else f" ({stage})"),
                   id=f"421-{stage}")
      for stage in Stage if stage is not S.LOCAL),
    # 4xx
    pytest.param(S.RCPT_TO, 450, "4.2.0 Mailbox busy", TRANSIENT, False, "4.2.0",
                 "450 4.2.0 Mailbox busy", id="450-rcpt"),
    pytest.param(S.RCPT_TO, 451, "4.3.0 Try again later", TRANSIENT, False, "4.3.0",
                 "451 4.3.0 Try again later", id="451-4.3.0-rcpt"),
    pytest.param(S.RCPT_TO, 451, "try again later", TRANSIENT, False, None,
                 "451 try again later", id="451-seed-greylisting"),
    pytest.param(S.RCPT_TO, 452, "4.5.3 Too many recipients", TRANSIENT, False, "4.5.3",
                 "452 4.5.3 Too many recipients", id="452-4.5.3"),
    pytest.param(S.DATA, 452, "4.2.2 Mailbox full", TRANSIENT, False, "4.2.2",
                 "452 4.2.2 Mailbox full", id="452-4.2.2-data"),
    pytest.param(S.DATA, 451, "4.7.1 Rate limited", TRANSIENT, False, "4.7.1",
                 "451 4.7.1 Rate limited", id="451-4.7.1-data"),
    pytest.param(S.STARTTLS, 454, "4.7.0 TLS not available", TRANSIENT, True, "4.7.0",
                 "454 4.7.0 TLS not available (starttls)", id="454-starttls"),
    pytest.param(S.AUTH, 454, "4.7.0 Temporary authentication failure", TRANSIENT, True,
                 "4.7.0", "454 4.7.0 Temporary authentication failure (auth)", id="454-auth"),
    pytest.param(S.MAIL_FROM, 451, "4.1.8 Sender domain lookup failed", TRANSIENT, True,
                 "4.1.8", "451 4.1.8 Sender domain lookup failed (mail_from)", id="451-mail-from"),
    # 5xx about this recipient or message
    pytest.param(S.RCPT_TO, 550, "5.1.1 User unknown", PERMANENT, False, "5.1.1",
                 "550 5.1.1 User unknown", id="550-5.1.1"),
    pytest.param(S.RCPT_TO, 550, "User unknown", PERMANENT, False, None,
                 "550 User unknown", id="550-seed"),
    pytest.param(S.RCPT_TO, 553, "5.1.3 Bad recipient address syntax", PERMANENT, False,
                 "5.1.3", "553 5.1.3 Bad recipient address syntax", id="553-rcpt"),
    pytest.param(S.DATA, 554, "5.7.1 Message rejected as spam", PERMANENT, False, "5.7.1",
                 "554 5.7.1 Message rejected as spam", id="554-5.7.1-data"),
    pytest.param(S.RCPT_TO, 554, "5.7.1 Relay access denied", PERMANENT, False, "5.7.1",
                 "554 5.7.1 Relay access denied", id="554-5.7.1-rcpt"),
    pytest.param(S.DATA, 552, "Requested mail action aborted: exceeded storage allocation",
                 PERMANENT, False, None,
                 "552 Requested mail action aborted: exceeded storage allocation",
                 id="552-data-plain"),
    pytest.param(S.DATA, 552, "5.3.4 Message size exceeds fixed limit", PERMANENT, False,
                 "5.3.4", "552 5.3.4 Message size exceeds fixed limit", id="552-5.3.4-data"),
    pytest.param(S.DATA, 551, "5.1.6 User has moved", PERMANENT, False, "5.1.6",
                 "551 5.1.6 User has moved", id="551-data"),
    # refinements by enhanced subject.detail
    pytest.param(S.RCPT_TO, 552, "5.2.2 Mailbox full", TRANSIENT, False, "5.2.2",
                 "552 5.2.2 Mailbox full", id="552-5.2.2-mailbox-full"),
    pytest.param(S.DATA, 550, "5.2.2 Over quota", TRANSIENT, False, "5.2.2",
                 "550 5.2.2 Over quota", id="550-5.2.2-over-quota"),
    pytest.param(S.RCPT_TO, 552, "5.5.3 Too many recipients", TRANSIENT, True, "5.5.3",
                 "552 5.5.3 Too many recipients", id="552-5.5.3-rfc5321-treat-as-452"),
    pytest.param(S.DATA, 552, "5.5.3 Too many recipients", PERMANENT, False, "5.5.3",
                 "552 5.5.3 Too many recipients", id="552-5.5.3-not-at-rcpt"),
    pytest.param(S.MAIL_FROM, 552, "5.3.4 Message size exceeds fixed maximum", PERMANENT,
                 False, "5.3.4", "552 5.3.4 Message size exceeds fixed maximum (mail_from)",
                 id="552-5.3.4-mail-from-too-big"),
    pytest.param(S.MAIL_FROM, 552, "Message size exceeds fixed maximum message size",
                 PERMANENT, False, None,
                 "552 Message size exceeds fixed maximum message size (mail_from)",
                 id="552-mail-from-rfc1870"),
    pytest.param(S.MAIL_FROM, 554, "5.3.4 Message too big for system", PERMANENT, False,
                 "5.3.4", "554 5.3.4 Message too big for system (mail_from)",
                 id="554-5.3.4-mail-from"),
    # 5xx before any recipient: our configuration or the server
    pytest.param(S.GREETING, 554, "5.7.1 No SMTP service here", TRANSIENT, True, "5.7.1",
                 "554 5.7.1 No SMTP service here (greeting)", id="554-greeting"),
    pytest.param(S.EHLO, 501, "5.5.4 Invalid EHLO argument", TRANSIENT, True, "5.5.4",
                 "501 5.5.4 Invalid EHLO argument (ehlo)", id="501-ehlo"),
    pytest.param(S.EHLO, 502, "Command not implemented", TRANSIENT, True, None,
                 "502 Command not implemented (ehlo)", id="502-ehlo"),
    pytest.param(S.STARTTLS, 554, "5.5.1 TLS not available", TRANSIENT, True, "5.5.1",
                 "554 5.5.1 TLS not available (starttls)", id="554-starttls"),
    pytest.param(S.AUTH, 535, "5.7.8 Authentication credentials invalid", TRANSIENT, True,
                 "5.7.8", "535 5.7.8 Authentication credentials invalid (auth)", id="535-auth"),
    pytest.param(S.AUTH, 534, "5.7.9 Authentication mechanism is too weak", TRANSIENT, True,
                 "5.7.9", "534 5.7.9 Authentication mechanism is too weak (auth)", id="534-auth"),
    pytest.param(S.MAIL_FROM, 550, "5.7.1 Sender address rejected", TRANSIENT, True, "5.7.1",
                 "550 5.7.1 Sender address rejected (mail_from)", id="550-mail-from"),
    pytest.param(S.MAIL_FROM, 553, "5.1.8 Sender domain does not exist", TRANSIENT, True,
                 "5.1.8", "553 5.1.8 Sender domain does not exist (mail_from)", id="553-mail-from"),
    pytest.param(S.MAIL_FROM, 552, "5.2.2 Mailbox full", TRANSIENT, True, "5.2.2",
                 "552 5.2.2 Mailbox full (mail_from)", id="552-5.2.2-at-mail-from-is-session"),
    pytest.param(S.CONNECT, 554, "go away", TRANSIENT, True, None, "554 go away (connect)",
                 id="554-connect"),
    # 530 authentication required: configuration, wherever the server says it
    pytest.param(S.MAIL_FROM, 530, "5.7.0 Authentication required", TRANSIENT, True, "5.7.0",
                 "530 5.7.0 Authentication required (mail_from)", id="530-mail-from"),
    pytest.param(S.RCPT_TO, 530, "5.7.0 Authentication required", TRANSIENT, True, "5.7.0",
                 "530 5.7.0 Authentication required", id="530-rcpt"),
    # enhanced class disagreeing with the basic code: the basic code decides, enhanced dropped
    pytest.param(S.RCPT_TO, 550, "4.2.2 Mailbox full", PERMANENT, False, None,
                 "550 4.2.2 Mailbox full", id="mismatch-550-4.2.2"),
    pytest.param(S.RCPT_TO, 450, "5.1.1 User unknown", TRANSIENT, False, None,
                 "450 5.1.1 User unknown", id="mismatch-450-5.1.1"),
    pytest.param(S.DATA, 250, "5.0.0 Ok", SENT, False, None, "250 5.0.0 Ok",
                 id="mismatch-250-5.0.0"),
    pytest.param(S.RCPT_TO, 552, "4.2.2 Mailbox full", PERMANENT, False, None,
                 "552 4.2.2 Mailbox full", id="mismatch-552-4.2.2"),
    # garbage, empty, odd formatting
    pytest.param(S.RCPT_TO, 550, "", PERMANENT, False, None, "550", id="550-empty-text"),
    pytest.param(S.RCPT_TO, 550, "5.1.1User unknown", PERMANENT, False, None,
                 "550 5.1.1User unknown", id="enhanced-without-space-ignored"),
    pytest.param(S.RCPT_TO, 550, "5.1 User unknown", PERMANENT, False, None,
                 "550 5.1 User unknown", id="enhanced-two-parts-ignored"),
    pytest.param(S.RCPT_TO, 550, "5.1.1.1 odd", PERMANENT, False, None,
                 "550 5.1.1.1 odd", id="enhanced-four-parts-ignored"),
    pytest.param(S.RCPT_TO, 550, "3.1.1 odd class", PERMANENT, False, None,
                 "550 3.1.1 odd class", id="enhanced-class-3-ignored"),
    pytest.param(S.RCPT_TO, 550, "User unknown (5.1.1)", PERMANENT, False, None,
                 "550 User unknown (5.1.1)", id="enhanced-not-leading-ignored"),
    pytest.param(S.RCPT_TO, 550, "\x00\x1b[31m\x7f garbage \ufffd", PERMANENT, False, None,
                 "550 [31m garbage \ufffd", id="control-characters-dropped"),
    pytest.param(S.RCPT_TO, 550, "  5.1.10   User\tunknown  ", PERMANENT, False, "5.1.10",
                 "550 5.1.10 User unknown", id="whitespace-collapsed"),
    pytest.param(S.RCPT_TO, 550, "550 5.1.1 User unknown", PERMANENT, False, "5.1.1",
                 "550 5.1.1 User unknown", id="basic-code-repeated-in-text"),
    pytest.param(S.RCPT_TO, 550,
                 "550-5.1.1 The email account that you tried\n550-5.1.1 to reach does not exist."
                 "\n550 5.1.1 https://support.example/answer",
                 PERMANENT, False, "5.1.1",
                 "550 5.1.1 The email account that you tried to reach does not exist. "
                 "https://support.example/answer", id="multiline-full-lines"),
    pytest.param(S.RCPT_TO, 550, "5.1.1 No such user\r\n5.1.1 see https://help.example",
                 PERMANENT, False, "5.1.1", "550 5.1.1 No such user see https://help.example",
                 id="multiline-message-only"),
    pytest.param(S.DATA, 250, "\n\n2.0.0 Ok\n", SENT, False, "2.0.0", "250 2.0.0 Ok",
                 id="blank-lines-skipped"),
    # unexpected codes
    pytest.param(S.DATA, 354, "End data with <CR><LF>.<CR><LF>", TRANSIENT, True, None,
                 "unexpected reply: 354 End data with <CR><LF>.<CR><LF> (data)", id="354-data"),
    pytest.param(S.AUTH, 334, "VXNlcm5hbWU6", TRANSIENT, True, None,
                 "unexpected reply: 334 VXNlcm5hbWU6 (auth)", id="334-auth"),
    pytest.param(S.RCPT_TO, 199, "odd", TRANSIENT, True, None,
                 "unexpected reply: 199 odd (rcpt_to)", id="1xx"),
    pytest.param(S.DATA, 600, "6.0.0 odd", TRANSIENT, True, None,
                 "unexpected reply: 600 6.0.0 odd (data)", id="6xx"),
    pytest.param(S.DATA, 0, "", TRANSIENT, True, None, "unexpected reply: 0 (data)", id="zero"),
    pytest.param(S.DATA, -250, "", TRANSIENT, True, None, "unexpected reply: -250 (data)",
                 id="negative"),
    pytest.param(S.LOCAL, 550, "5.1.1 x", TRANSIENT, True, "5.1.1",
                 "unexpected reply: 550 5.1.1 x (local)", id="code-at-local"),
]


@pytest.mark.parametrize(("stage", "code", "text", "verdict", "server_fault", "enhanced",
                          "reason"), CODED)
def test_classify_coded_reply(stage: Stage, code: int, text: str, verdict: Verdict,
                              server_fault: bool, enhanced: str | None, reason: str) -> None:
    assert classify_reply(SmtpReply(stage, code, text)) == Outcome(
        verdict, code, enhanced, reason, server_fault=server_fault)


# (stage, failure, text) -> (verdict, server_fault, reason)
FAILURES = [
    pytest.param(S.CONNECT, Failure.REFUSED, "", TRANSIENT, True,
                 "connection refused (connect)", id="refused"),
    pytest.param(S.CONNECT, Failure.REFUSED, "[Errno 111] Connect call failed", TRANSIENT, True,
                 "connection refused (connect): [Errno 111] Connect call failed",
                 id="refused-with-text"),
    pytest.param(S.DATA, Failure.RESET, "Connection lost", TRANSIENT, True,
                 "connection reset (data): Connection lost", id="reset-mid-data"),
    pytest.param(S.GREETING, Failure.TIMEOUT, "", TRANSIENT, True, "timed out (greeting)",
                 id="timeout-greeting"),
    pytest.param(S.DATA, Failure.TIMEOUT, "", TRANSIENT, True, "timed out (data)",
                 id="timeout-data"),
    pytest.param(S.STARTTLS, Failure.TLS, "certificate verify failed", TRANSIENT, True,
                 "TLS failure (starttls): certificate verify failed", id="tls"),
    pytest.param(S.CONNECT, Failure.UNREACHABLE, "Name or service not known", TRANSIENT, True,
                 "server unreachable (connect): Name or service not known", id="unreachable"),
    pytest.param(S.LOCAL, Failure.BAD_MESSAGE, "attachment outside the allowed root",
                 PERMANENT, False,
                 "message cannot be sent (local): attachment outside the allowed root",
                 id="bad-message-outside-root"),
    pytest.param(S.LOCAL, Failure.BAD_MESSAGE, "attachment missing: q3.xlsx", PERMANENT, False,
                 "message cannot be sent (local): attachment missing: q3.xlsx",
                 id="bad-message-missing-attachment"),
    pytest.param(S.DATA, Failure.BAD_MESSAGE, "", PERMANENT, False,
                 "message cannot be sent (data)", id="bad-message-at-data"),
    pytest.param(S.LOCAL, Failure.CONFIG, "attachments are off: POSTROOM_ATTACHMENTS_ROOT is not set",
                 TRANSIENT, True, "configuration problem (local): attachments are off: "
                 "POSTROOM_ATTACHMENTS_ROOT is not set", id="config-no-attachments-root"),
    pytest.param(S.AUTH, Failure.CONFIG, "No suitable authentication method found.",
                 TRANSIENT, True, "configuration problem (auth): No suitable authentication method "
                 "found.", id="config-no-common-auth"),
]


@pytest.mark.parametrize(("stage", "failure", "text", "verdict", "server_fault", "reason"),
                         FAILURES)
def test_classify_failure(stage: Stage, failure: Failure, text: str, verdict: Verdict,
                          server_fault: bool, reason: str) -> None:
    assert classify_reply(SmtpReply(stage, None, text, failure)) == Outcome(
        verdict, None, None, reason, server_fault=server_fault)


def test_every_failure_has_a_row() -> None:
    covered = {p.values[1] for p in FAILURES}
    assert covered == set(Failure)


@pytest.mark.parametrize("stage", list(Stage))
def test_no_code_and_no_failure_is_an_adapter_bug(stage: Stage) -> None:
    outcome = classify_reply(SmtpReply(stage, None, "huh"))
    assert outcome == Outcome(
        TRANSIENT, None, None,
        f"unexpected: neither a reply code nor a failure ({stage}): huh", server_fault=True)


def test_a_code_wins_over_a_failure() -> None:
    reply = SmtpReply(S.RCPT_TO, 550, "5.1.1 User unknown", Failure.RESET)
    assert classify_reply(reply).verdict is PERMANENT


@pytest.mark.parametrize("stage", sorted(SESSION_STAGES))
@pytest.mark.parametrize("code", [500, 501, 502, 503, 504, 550, 553, 554])
def test_5xx_before_any_recipient_is_the_servers_fault(stage: Stage, code: int) -> None:
    outcome = classify_reply(SmtpReply(stage, code, "5.0.0 no"))
    assert (outcome.verdict, outcome.server_fault) == (TRANSIENT, True)


@pytest.mark.parametrize("stage", sorted(MESSAGE_STAGES))
@pytest.mark.parametrize("code", [500, 501, 550, 551, 553, 554])
def test_5xx_about_the_recipient_is_permanent(stage: Stage, code: int) -> None:
    outcome = classify_reply(SmtpReply(stage, code, "5.0.0 no"))
    assert (outcome.verdict, outcome.server_fault) == (PERMANENT, False)


def test_stage_groups_cover_every_stage_but_local_once() -> None:
    assert SESSION_STAGES | MESSAGE_STAGES == set(Stage) - {S.LOCAL}
    assert not SESSION_STAGES & MESSAGE_STAGES


@pytest.mark.parametrize("text", ["x" * 5000, "5.1.1 " + "y " * 3000, "z\n" * 4000])
def test_reason_is_one_clipped_line(text: str) -> None:
    reason = classify_reply(SmtpReply(S.RCPT_TO, 550, text)).reason
    assert len(reason) == REASON_MAX_CHARS
    assert reason.endswith("...")
    assert "\n" not in reason


def test_reason_at_the_limit_is_not_clipped() -> None:
    text = "x" * (REASON_MAX_CHARS - len("550 "))
    assert classify_reply(SmtpReply(S.RCPT_TO, 550, text)).reason == f"550 {text}"


@pytest.mark.parametrize(("text", "expected"), [
    ("5.1.1 User unknown", "5.1.1"),
    ("2.0.0", "2.0.0"),
    ("  4.7.1\tslow down", "4.7.1"),
    ("5.123.456 long parts", "5.123.456"),
    ("5.1234.1 too long", None),
    ("5.1.1234 too long", None),
    ("1.1.1 bad class", None),
    ("5.1.1: colon", None),
    ("5.1.x letters", None),
    ("", None),
    ("User unknown", None),
])
def test_parse_enhanced_code(text: str, expected: str | None) -> None:
    assert parse_enhanced_code(text) == expected
