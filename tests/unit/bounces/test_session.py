"""The intake's SMTP session on a local socket, with the intake's decisions over in-memory rows and
results: sessions past the caps are answered 421; after a fault of ours the next MAIL on the
connection is taken; AUTH is off and aiosmtpd logs no line per session; a report reads the same
through the bounded DATA reader as through aiosmtpd's own; a message over the size limit is
answered 552 once read, and the connection goes on."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import re
import select
import smtplib
import socket
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from aiosmtpd.smtp import SMTP, Envelope, Session
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from postroom.bounces.intake import BounceConfig, Intake
from postroom.bounces.limits import (
    ERRORS_MAX,
    JUNK_COMMANDS_MAX,
    RECIPIENTS_MAX,
    SessionLimits,
)
from postroom.bounces.mapping import OutboxRow
from postroom.bounces.reports import parse_report
from postroom.bounces.service import _Handler
from postroom.bounces.session import SESSION_MAX_S, BounceSession, read_data
from postroom.metrics import Metrics
from postroom.schemas.codec import EmailResult
from postroom.verp import make_token, return_path
from support.fuzz import examples
from support.metrics import counter

FIXTURES = Path(__file__).parents[2] / "fixtures" / "bounces"
SECRET = b"0123456789abcdef-bounce-secret"
BOUNCE = "bounces@bounce.example.com"
ROW = OutboxRow(17, "sales-report|gone@example.com", "gone@example.com", 1, "sent")
TOKEN = make_token(ROW.outbox_id, SECRET, dt.datetime.now(dt.UTC))
WAIT_S = 10.0


class Rows:
    def row(self, outbox_id: int) -> OutboxRow | None:
        return ROW if outbox_id == ROW.outbox_id else None


class Results:
    """Publishes into a list; ``faults`` raises that many times first (a fault of ours, not an
    outage the intake knows)."""

    def __init__(self, faults: int = 0) -> None:
        self.published: list[EmailResult] = []
        self.faults = faults

    def publish(self, results: Sequence[EmailResult]) -> None:
        if self.faults:
            self.faults -= 1
            raise RuntimeError("a bug of ours")
        self.published.extend(results)


class Listener:
    """A server on 127.0.0.1 (an ephemeral port) on an event loop of its own thread."""

    def __init__(self, factory: Callable[[], asyncio.Protocol]) -> None:
        self._factory = factory
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self.port = 0

    def __enter__(self) -> Listener:
        self._thread.start()
        server = asyncio.run_coroutine_threadsafe(
            self._loop.create_server(self._factory, "127.0.0.1", 0), self._loop).result(WAIT_S)
        self._server = server
        self.port = int(server.sockets[0].getsockname()[1])
        return self

    def __exit__(self, *_exc: object) -> None:
        async def close() -> None:
            self._server.close()
            await self._server.wait_closed()
        asyncio.run_coroutine_threadsafe(close(), self._loop).result(WAIT_S)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(WAIT_S)
        self._loop.close()

    def client(self) -> smtplib.SMTP:
        return smtplib.SMTP("127.0.0.1", self.port, timeout=WAIT_S)


def intake_listener(results: Results, metrics: Metrics, limits: SessionLimits,
                    size_limit: int = 64 * 1024 * 1024,
                    session_max_s: float = SESSION_MAX_S) -> Listener:
    from concurrent.futures import ThreadPoolExecutor

    workers = ThreadPoolExecutor(2)
    intake = Intake(BounceConfig(BOUNCE, (SECRET,), dt.timedelta(days=60)), Rows(), results,
                    metrics)
    handler = _Handler(intake, workers, workers)
    return Listener(lambda: BounceSession(handler, metrics, limits, size_limit, session_max_s))


def dsn() -> bytes:
    return (FIXTURES / "postfix_failed.eml").read_bytes().replace(b"1-a-aaaa", TOKEN.encode())


def until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, "the condition did not come in time"
        time.sleep(0.01)


def test_sessions_past_the_caps_are_answered_421_and_a_slot_comes_back() -> None:
    metrics = Metrics()
    limits = SessionLimits(max_sessions=2, max_per_client=2)
    with intake_listener(Results(), metrics, limits) as listener:
        first, second = listener.client(), listener.client()
        with pytest.raises(smtplib.SMTPConnectError) as refused:
            listener.client()
        assert refused.value.smtp_code == 421
        assert b"too many connections" in refused.value.smtp_error
        first.quit()
        until(lambda: limits.open == 1)
        third = listener.client()
        assert third.noop()[0] == 250
        second.quit()
        third.quit()
        until(lambda: limits.open == 0)
    assert counter(metrics, "bounce_sessions_total", outcome="too_many") == 1
    assert counter(metrics, "bounce_sessions_total", outcome="admitted") == 3


def test_sessions_from_one_client_past_its_cap_are_answered_421() -> None:
    metrics = Metrics()
    limits = SessionLimits(max_sessions=10, max_per_client=1)
    with intake_listener(Results(), metrics, limits) as listener:
        first = listener.client()
        with pytest.raises(smtplib.SMTPConnectError) as refused:
            listener.client()
        assert b"from your address" in refused.value.smtp_error
        first.quit()
    assert counter(metrics, "bounce_sessions_total", outcome="too_many_from_client") == 1


def test_after_a_fault_of_ours_the_next_mail_on_the_connection_is_taken() -> None:
    """RFC 5321 lets a client send MAIL again without RSET; the envelope of the failed message
    must not answer it `503 nested MAIL command` (a permanent refusal: the report lost)."""
    results = Results(faults=1)
    with intake_listener(results, Metrics(), SessionLimits(5, 5)) as listener:
        client = listener.client()
        client.ehlo("mx.example.com")
        rcpt = return_path(BOUNCE, TOKEN)
        assert client.mail("")[0] == 250
        assert client.rcpt(rcpt)[0] == 250
        assert client.data(dsn())[0] == 451
        assert client.mail("")[0] == 250
        assert client.rcpt(rcpt)[0] == 250
        assert client.data(dsn())[0] == 250
        client.quit()
    assert [r.outbox_id for r in results.published] == [ROW.outbox_id]


def test_auth_is_off_and_aiosmtpd_logs_no_line_per_session(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    metrics = Metrics()
    with intake_listener(Results(), metrics, SessionLimits(5, 5)) as listener:
        client = listener.client()
        client.ehlo("mx.example.com")
        assert not client.has_extn("auth")
        assert client.docmd("AUTH", "PLAIN AGpvZQBzZWNyZXQ=")[0] == 502
        client.sendmail("", [return_path(BOUNCE, TOKEN)], dsn())
        client.quit()
    assert [r.getMessage() for r in caplog.records if r.name == "mail.log"] == []
    assert counter(metrics, "bounce_replies_total", code="502") == 1
    assert counter(metrics, "bounce_replies_total", code="250") >= 4


class Recording:
    """aiosmtpd's DATA hook, keeping what each message's DATA gave it."""

    def __init__(self) -> None:
        self.contents: list[bytes] = []

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        self.contents.append(envelope.original_content or b"")
        return "250 OK"


def sent_through(factory: Callable[[Any], asyncio.Protocol], raw: bytes) -> bytes:
    recording = Recording()
    with Listener(lambda: factory(recording)) as listener:
        client = listener.client()
        client.sendmail("", ["bounces@bounce.example.com"], raw)
        client.quit()
    [content] = recording.contents
    return content


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.glob("*.eml")))
def test_a_report_reads_the_same_through_the_bounded_reader_as_through_aiosmtpds(
        name: str) -> None:
    raw = re.sub(rb"\r?\n", b"\r\n", (FIXTURES / name).read_bytes() + b"\n.leading dot\n..two\n")
    ours = sent_through(
        lambda handler: BounceSession(handler, Metrics(), SessionLimits(5, 5), 1 << 20), raw)
    theirs = sent_through(lambda handler: SMTP(handler, hostname="reference"), raw)
    assert ours == theirs or parse_report(ours) == parse_report(theirs)
    assert b"\r\n.leading dot\r\n..two\r\n" in theirs


def test_empty_and_one_line_messages_end_where_they_should() -> None:
    for raw in (b"", b"Subject: one line", b"Subject: s\r\n\r\nlast line.\r\n.\r\nnot the end\r\n"):
        ours = sent_through(
            lambda handler: BounceSession(handler, Metrics(), SessionLimits(5, 5), 1 << 20), raw)
        theirs = sent_through(lambda handler: SMTP(handler, hostname="reference"), raw)
        assert ours == theirs


def test_a_message_over_the_limit_is_552_once_read_and_the_connection_goes_on() -> None:
    metrics = Metrics()
    results = Results()
    with intake_listener(results, metrics, SessionLimits(5, 5), size_limit=256 * 1024) as listener:
        client = listener.client()
        rcpt = return_path(BOUNCE, TOKEN)
        client.ehlo("mx.example.com")
        client.mail("")  # no SIZE: it would be refused at MAIL
        client.rcpt(rcpt)
        assert client.data(dsn() + (b"y" * 76 + b"\r\n") * 5000)[0] == 552
        client.sendmail("", [rcpt], dsn())
        client.quit()
    assert counter(metrics, "bounce_refused_total", reason="too_large") == 1
    assert len(results.published) == 1


class Collected:
    """A pruner that keeps everything it is fed."""

    def __init__(self) -> None:
        self.data = bytearray()

    def feed(self, data: bytes) -> None:
        self.data += data


_BODY_LINES = st.sampled_from([b"", b".", b"..", b"x.", b". ", b"text", b"-- ", b"\r", b"a" * 2500,
                               b"sentence.", b".\r\n.", b"\n"])


@settings(max_examples=examples(200), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(lines=st.lists(_BODY_LINES, max_size=30), cuts=st.lists(st.integers(1, 6000), max_size=10),
       near_end=st.integers(0, 6))
def test_the_data_reader_hands_over_the_message_and_reads_not_a_byte_past_its_end(
        lines: list[bytes], cuts: list[int], near_end: int) -> None:
    """However the bytes come, the reader gives the message as sent (dot-stuffed, its last line
    break its own) and leaves what follows the final "." line (a pipelined QUIT) unread."""
    # Dot-stuffed where SMTP lines start: at the start and after each CRLF (RFC 5321 4.5.2).
    body = re.sub(rb"(?:^|(?<=\r\n))\.", b"..", b"".join(line + b"\r\n" for line in lines))
    # A cut inside the end's "<CRLF>.<CRLF>" too: the bytes before it arrive alone.
    data, received, rest = _read_data(body + b".\r\nQUIT\r\n",
                                      [*cuts, max(1, len(body) + 3 - near_end)])
    assert data == body
    assert received == len(body)
    assert rest == b"QUIT\r\n"


@pytest.mark.parametrize("back", range(1, 6))
def test_the_data_reader_finds_the_end_when_a_long_message_arrives_cut_inside_it(
        back: int) -> None:
    """Bytes that arrive without a ".<CRLF>" past the reader's limit are handed over as they
    are, cut anywhere: the end's CRLF may be in that piece and its ".<CRLF>" in the next (a
    TCP segment ending in "<CRLF>." left the message unended, the next commands read as
    data)."""
    body = b"a" * 2500 + b"\r\n"
    wire = body + b".\r\nQUIT\r\n"
    data, received, rest = _read_data(wire, [len(body) + 3 - back])
    assert data == body
    assert received == len(body)
    assert rest == b"QUIT\r\n"


def _read_data(wire: bytes, cuts: list[int]) -> tuple[bytes, int, bytes]:
    """The message read_data hands over of ``wire`` arriving cut at ``cuts``, the bytes it
    counts, and what it left unread; IncompleteReadError if it has not found the end."""

    async def run() -> tuple[bytes, int, bytes]:
        reader = asyncio.StreamReader(limit=1001)
        collected = Collected()

        async def arrive() -> None:
            start = 0
            for cut in [*sorted({c for c in cuts if c < len(wire)}), len(wire)]:
                reader.feed_data(wire[start:cut])
                start = cut
                await asyncio.sleep(0)
            reader.feed_eof()  # a reader that missed the end raises IncompleteReadError

        feeding = asyncio.ensure_future(arrive())
        received = await read_data(reader, collected, len(wire), lambda: None)
        await feeding
        return bytes(collected.data), received, await reader.read(len(wire))

    return asyncio.run(run())


class Raw:
    """A client on a plain socket: commands sent pipelined, replies read one by one (the last
    line of each), b"" once the server has closed."""

    def __init__(self, port: int) -> None:
        self._socket = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
        self._file = self._socket.makefile("rb")
        self.greeting = self.reply()

    def send(self, data: bytes) -> None:
        self._socket.sendall(data)

    def reply(self) -> bytes:
        while True:
            line = self._file.readline()
            if line[3:4] != b"-":
                return line

    def trickle(self, data: bytes) -> bytes | None:
        """Send ``data``, then the server's reply if one comes within 50 ms (the pace)."""
        self._socket.sendall(data)
        readable, _, _ = select.select([self._socket], [], [], 0.05)
        return self.reply() if readable else None

    def replies(self) -> list[bytes]:
        """Every reply until the server closes."""
        found = []
        while line := self.reply():
            found.append(line)
        return found

    def close(self) -> None:
        self._file.close()
        self._socket.close()


def test_recipients_past_the_cap_are_452_and_the_message_is_taken() -> None:
    """A report goes to one return path: past RECIPIENTS_MAX a RCPT gets 452 (RFC 5321
    4.5.3.1.10: the client sends the rest later), where each one grew the envelope (100,000
    recipients: 19 MiB a session) and the intake's walk over them."""
    results = Results()
    with intake_listener(results, Metrics(), SessionLimits(5, 5)) as listener:
        client = Raw(listener.port)
        rcpt = return_path(BOUNCE, TOKEN)
        client.send(b"EHLO mx.example.com\r\nMAIL FROM:<>\r\n"
                    + f"RCPT TO:<{rcpt}>\r\n".encode() * (RECIPIENTS_MAX + 5))
        assert client.reply()[:3] == client.reply()[:3] == b"250"
        codes = [client.reply()[:3] for _ in range(RECIPIENTS_MAX + 5)]
        assert codes == [b"250"] * RECIPIENTS_MAX + [b"452"] * 5
        client.send(b"DATA\r\n")
        assert client.reply()[:3] == b"354"
        client.send(re.sub(rb"(?m)^\.", b"..", re.sub(rb"\r?\n", b"\r\n", dsn()))
                    + b"\r\n.\r\nQUIT\r\n")
        assert client.reply()[:3] == b"250"
        client.close()
    assert [r.outbox_id for r in results.published] == [ROW.outbox_id]


def test_a_session_is_closed_past_its_errors_and_logs_no_more(
        caplog: pytest.LogCaptureFixture) -> None:
    """Each refused RCPT is a log line: past ERRORS_MAX errors the session gets 421 and is
    closed (20,000 refused RCPTs on one connection were 20,000 lines)."""
    caplog.set_level(logging.INFO)
    metrics = Metrics()
    with intake_listener(Results(), metrics, SessionLimits(5, 5)) as listener:
        client = Raw(listener.port)
        client.send(b"EHLO mx.example.com\r\nMAIL FROM:<>\r\n"
                    + b"RCPT TO:<someone@elsewhere.example>\r\n" * 1000)
        replies = client.replies()
        client.close()
    assert [r[:3] for r in replies] == [b"250"] * 2 + [b"550"] * ERRORS_MAX + [b"421"]
    assert b"too many errors" in replies[-1]
    assert len(caplog.records) <= ERRORS_MAX
    assert counter(metrics, "bounce_replies_total", code="421") == 1


def test_commands_that_change_nothing_are_421_past_their_cap() -> None:
    """Each NOOP reset the idle timeout: a session could be held for ever, and a hundred of
    them fill the intake. Past JUNK_COMMANDS_MAX, 421 and closed."""
    with intake_listener(Results(), Metrics(), SessionLimits(5, 5)) as listener:
        client = Raw(listener.port)
        client.send(b"NOOP\r\n" * (JUNK_COMMANDS_MAX + 50))
        replies = client.replies()
        client.close()
    assert [r[:3] for r in replies] == [b"250"] * JUNK_COMMANDS_MAX + [b"421"]


def test_sessions_refused_in_a_row_are_logged_once_and_all_counted(
        caplog: pytest.LogCaptureFixture) -> None:
    """A refused connect costs a client nothing: it was a log line each (a connect loop, a
    flood of lines). Logged once until a session is admitted again, each one counted."""
    metrics = Metrics()
    limits = SessionLimits(max_sessions=1, max_per_client=1)
    with intake_listener(Results(), metrics, limits) as listener:
        held = listener.client()
        for _ in range(30):
            refused = Raw(listener.port)
            assert refused.greeting.startswith(b"421")
            refused.close()
        held.quit()
    refusals = [r for r in caplog.records if "session refused" in r.getMessage()]
    assert len(refusals) == 1
    assert counter(metrics, "bounce_sessions_total", outcome="too_many") == 30


def test_a_session_that_trickles_its_data_ends_at_its_deadline() -> None:
    """Each piece of DATA, a byte even, reset the idle timeout: a client trickling held its
    session for ever. The session's whole life is bounded: 421 at its deadline."""
    metrics = Metrics()
    with intake_listener(Results(), metrics, SessionLimits(5, 5), session_max_s=0.5) as listener:
        client = Raw(listener.port)
        client.send(f"EHLO mx.example.com\r\nMAIL FROM:<>\r\nRCPT TO:<{BOUNCE}>\r\nDATA\r\n"
                    .encode())
        assert [client.reply()[:3] for _ in range(4)] == [b"250", b"250", b"250", b"354"]
        deadline = time.monotonic() + WAIT_S
        while (answer := client.trickle(b"x")) is None:
            assert time.monotonic() < deadline, "the session outlived its deadline"
        client.close()
    assert answer.startswith(b"421 4.4.2")
    assert counter(metrics, "bounce_replies_total", code="421") == 1
