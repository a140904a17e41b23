"""The pipelined dialogue (sender/pipelining.py: MAIL, RCPT and DATA written as one group, behind
aiosmtplib's back) against the plain one (aiosmtplib's commands, one reply awaited at a time,
POSTROOM_SMTP_PIPELINING=false) as its reference: for the same emails the dev server receives
the same envelopes, parameters and bytes, and the client reads the same replies."""

from __future__ import annotations

import asyncio
import re
from email.message import EmailMessage
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from postroom.devkit.devsmtp import DevSmtpServer
from postroom.devkit.devsmtp_handler import ReceivedMessage
from postroom.sender.pipelining import Pipeline
from postroom.sender.smtp import SmtpPool
from postroom.sender.smtp_config import SmtpConfig
from postroom.settings import TlsMode
from support.fuzz import examples

pytestmark = pytest.mark.integration

SENDER = "reports@example.com"
QUEUE_ID = re.compile(r"(?<=queued as )\w+")
REJECTED = "gone@example.com"
DEFERRED = "busy@example.com"
# Text with the shapes SMTP's DATA rewrites or refuses: a lone dot, a leading dot, long lines,
# CR and LF on their own, 8-bit text.
LINES = st.sampled_from(["", ".", "..", ".leading dot", "plain text", "Grüße aus Köln",
                         "x" * 990, "tab\there", "a\rb", "end."])
# No line breaks of any kind (the email package refuses them in a header, U+2028 included).
SUBJECTS = st.text(st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp")), max_size=40)
LOCAL = st.sampled_from(["finance", "ceo", "a.b+tag", "gone", "busy", "o'brien"])


def message(recipient: str, subject: str, lines: list[str], n: int) -> EmailMessage:
    email = EmailMessage()
    email["From"] = SENDER
    email["To"] = recipient
    email["Subject"] = subject
    email["Message-ID"] = f"<m{n}@example.com>"
    email.set_content("\n".join(lines) + "\n")
    return email


def deliver(emails: list[tuple[str, EmailMessage]], *, pipelining: bool,
            dsn: bool) -> tuple[list[ReceivedMessage], list[tuple[object, ...]]]:
    """Send every email through one pool to a fresh dev server; what it kept, and each reply
    as (stage, code, text, failure), the
    server's queue id left out."""
    with DevSmtpServer(port=0, reject=[REJECTED], defer={DEFERRED: 10**6}, dsn=dsn) as server:
        config = SmtpConfig(host="127.0.0.1", port=server.port, tls=TlsMode.NONE,
                            connect_timeout_s=5.0, timeout_s=5.0, concurrency=2,
                            local_hostname="client.postroom.test", pipelining=pipelining)

        async def run() -> list[tuple[object, ...]]:
            async with SmtpPool(config) as pool:
                replies = []
                for n, (recipient, email) in enumerate(emails):
                    reply = await pool.send(email, SENDER, recipient,
                                            dsn_envid=f"env{n}" if dsn else None)
                    replies.append((reply.stage, reply.code, QUEUE_ID.sub("<id>", reply.text),
                                    reply.failure))
                return replies

        with mock.patch.object(Pipeline, "take_over", side_effect=Pipeline.take_over) as spy:
            replies = asyncio.run(run())
        # The path under test was the one taken: the pipelined dialogue took over a connection.
        assert spy.called == pipelining, spy.call_count
        return sorted(server.messages, key=lambda m: m.message_id or ""), replies


@settings(max_examples=examples(15), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(LOCAL, SUBJECTS, st.lists(LINES, max_size=6)),
                min_size=1, max_size=6),
       st.booleans())
def test_pipelined_and_plain_dialogues_deliver_the_same_bytes(
        drafts: list[tuple[str, str, list[str]]], dsn: bool) -> None:
    emails = [(f"{local}@example.com", message(f"{local}@example.com", subject, lines, n))
              for n, (local, subject, lines) in enumerate(drafts)]
    pipelined = deliver(emails, pipelining=True, dsn=dsn)
    plain = deliver(emails, pipelining=False, dsn=dsn)
    assert pipelined == plain
    # Each accepted email arrived once, the refused and deferred ones not at all.
    wanted = sum(1 for recipient, _ in emails if recipient not in (REJECTED, DEFERRED))
    assert len(plain[0]) == wanted
