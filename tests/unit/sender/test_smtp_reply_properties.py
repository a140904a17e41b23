"""Properties of the SMTP reply boundary (hypothesis): whatever bytes a server answers (NUL, invalid
UTF-8, 100 KB lines, odd continuation lines, a reply cut anywhere or dripped a byte at a time), the
pipelined reader reads the reply aiosmtplib's reader reads, or refuses it as aiosmtplib does; and
whatever reply comes of it is classified by the rules of sender/outcome.py into a result whose
text PostgreSQL and the results schema take."""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import re
from typing import Any, cast

import aiosmtplib
import pytest
from aiosmtplib.protocol import MAX_RESPONSE_LENGTH, SMTPProtocol
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from postroom.schemas.codec import DeliveryStatus, EmailResult, encode
from postroom.schemas.decoding import decode
from postroom.schemas.framing import headers_for
from postroom.sender import pipelining
from postroom.sender.outcome import (
    MESSAGE_STAGES,
    REASON_MAX_CHARS,
    Failure,
    SmtpReply,
    Stage,
    Verdict,
    classify_reply,
)
from postroom.sender.pipelining import MAX_REPLY_BYTES, Pipeline, _take_reply
from postroom.sender.throttle import is_throttling
from support.fuzz import examples

EXAMPLES = examples(150)
pytestmark = pytest.mark.timeout(60 + EXAMPLES // 25)
BOUNDED = settings(max_examples=EXAMPLES, deadline=dt.timedelta(seconds=5), database=None,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
NOW = dt.datetime(2026, 12, 2, 20, 0, tzinfo=dt.UTC)

CODES = st.sampled_from([b"250", b"251", b"354", b"421", b"451", b"452", b"550", b"552",
                         b"554", b"999", b"099", b"-12", b"+50", b"2_5", b" 25", b"25",
                         b"", b"\x00\x00\x00", b"\xff\xfe\xfd"]) | st.binary(min_size=3, max_size=3)
TEXTS = st.one_of(
    st.binary(max_size=60),
    st.sampled_from([b"2.0.0 Ok", b"4.7.28 rate limited", b"5.1.1 User unknown", b"5.2.2 full",
                     b"\x00", b"\xff\xfe\xc3(", b"\xed\xa0\x80 lone surrogate", b"5.\xd9\xa1.1"]),
    st.tuples(st.sampled_from([b"x", b"\x00", b"\xff", b"5.1.1 "]),
              st.integers(1, 40_000)).map(lambda t: t[0] * t[1]),  # up to 40 KB lines
)
SEPARATORS = st.sampled_from([b" ", b"-", b"", b"\t", b"\x00"])
ENDINGS = st.sampled_from([b"\r\n", b"\n", b"\r", b""])
LINE = st.tuples(CODES, SEPARATORS, TEXTS, ENDINGS).map(b"".join)
REPLY_BYTES = st.lists(LINE, max_size=6).map(b"".join)


def _aiosmtplib_protocol() -> SMTPProtocol:
    loop = asyncio.new_event_loop()
    try:
        return SMTPProtocol(loop=loop)
    finally:
        loop.close()


_THEIRS = _aiosmtplib_protocol()
Read = tuple[int, str, int] | str | None  # (code, text, bytes taken), "refused", None: not all there


def ours(data: bytes) -> Read:
    """What the pipelined reader makes of ``data``: its first reply, a refusal, or a wait."""
    buffer = bytearray(data)
    try:
        reply = _take_reply(buffer)
    except aiosmtplib.SMTPResponseException as exc:
        assert exc.code == -1
        return "refused"
    if reply is None:
        # Pipeline.data_received refuses a partial reply beyond the bound.
        return "refused" if len(buffer) > MAX_REPLY_BYTES else None
    return reply.code, reply.message, len(data) - len(buffer)


def theirs(data: bytes) -> Read:
    """What aiosmtplib's reader makes of ``data`` (its data_received bounds the buffer first)."""
    if len(data) > MAX_RESPONSE_LENGTH:
        return "refused"
    _THEIRS._buffer = bytearray(data)
    try:
        reply = _THEIRS._read_response_from_buffer()
    except aiosmtplib.SMTPResponseException as exc:
        assert exc.code == -1
        return "refused"
    if reply is None:
        return None
    return reply.code, reply.message, len(data) - len(_THEIRS._buffer)


@BOUNDED
@given(REPLY_BYTES)
@example(b"550 " + b"x" * 100_000 + b"\r\n")                 # one 100 KB line
@example(b"250-" + b"y" * 9000 + b"\r\n250 z\r\n")            # a continuation over a line's bound
@example(b"250-a\r\n" * 5000 + b"250 b\r\n")                  # a reply over the whole bound
@example(b"250-\r\n250 x\r\n")                                # an empty first line
@example(b"451-4.3.0 first\r\n451-\xff\x00\xfe\r\n451 4.3.0 last\r\n")
def test_the_pipelined_reader_reads_what_aiosmtplib_reads(data: bytes) -> None:
    mine = ours(data)
    if isinstance(mine, tuple):
        assert theirs(data[:mine[2]]) == mine
    elif mine is None:
        assert theirs(data) is None
    else:
        # Refused here; aiosmtplib refuses too, at the latest once more bytes make it too long.
        assert theirs(data) == "refused" or theirs(data + b"x" * MAX_RESPONSE_LENGTH) == "refused"


class _Transport:
    def __init__(self) -> None:
        self.closed = False

    def write(self, data: bytes) -> None:
        pass

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


def fed(chunks: list[bytes]) -> tuple[list[tuple[int, str]], str | None]:
    """The replies a pipeline reads from ``chunks`` as they arrive, and why it was lost."""
    pipeline = Pipeline(cast(asyncio.Transport, _Transport()), {}, 30)
    pipeline._owed = len(b"".join(chunks))  # replies asked for: any number that come
    for chunk in chunks:
        pipeline.data_received(chunk)  # never raises: whatever comes is a reply or a loss
    lost = pipeline._lost
    return ([(r.code, r.message) for r in pipeline._replies],
            None if lost is None else type(lost).__name__)


@BOUNDED
@given(REPLY_BYTES, st.lists(st.integers(0, 50_000), max_size=8))
def test_a_reply_dripped_in_any_pieces_is_read_as_the_whole(data: bytes, cuts: list[int]) -> None:
    points = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
    chunks = [data[a:b] for a, b in itertools.pairwise(points)]
    whole = fed([data])
    dripped = fed(chunks)
    if whole[1] is None and dripped[1] is None:
        assert dripped == whole
    else:
        # A refusal may come earlier when bytes come apart, never after a different reply.
        assert whole[0][:len(dripped[0])] == dripped[0] or dripped[0][:len(whole[0])] == whole[0]
        assert dripped[1] is not None or whole[1] is not None


def _ascii_enhanced(code: str) -> bool:
    return re.fullmatch(r"[245]\.[0-9]{1,3}\.[0-9]{1,3}", code, re.ASCII) is not None


ANY_TEXT = st.one_of(
    st.text(max_size=200),
    st.binary(max_size=200).map(lambda b: b.decode("utf-8", "surrogateescape")),
    TEXTS.map(lambda b: b.decode("utf-8", "surrogateescape")),
)


@BOUNDED
@given(st.sampled_from(list(Stage)), st.none() | st.integers(-(2**40), 2**40) | st.integers(0, 999),
       ANY_TEXT, st.none() | st.sampled_from(list(Failure)))
@example(Stage.RCPT_TO, 550, "5.\u0661.\u0661 User unknown", None)  # Arabic-Indic digits
@example(Stage.DATA, 451, "4.3.0 try\x00again \udcff later", None)
def test_any_reply_is_classified_by_the_rules_into_a_result_that_can_be_stored(
        stage: Stage, code: int | None, text: str, failure: Failure | None) -> None:
    reply = SmtpReply(stage, code, text, failure)
    outcome = classify_reply(reply)
    reason = outcome.reason
    assert len(reason) <= REASON_MAX_CHARS
    assert reason.isprintable() and "\x00" not in reason
    assert outcome.enhanced_code is None or _ascii_enhanced(outcome.enhanced_code)
    klass = code // 100 if code is not None and 200 <= code <= 599 else None
    if code is None:
        permanent = failure is Failure.BAD_MESSAGE
        assert outcome.verdict is (Verdict.PERMANENT if permanent else Verdict.TRANSIENT)
    elif klass is None or klass == 3 or stage is Stage.LOCAL:
        assert outcome.verdict is Verdict.TRANSIENT
    elif klass == 2:
        assert outcome.verdict is (Verdict.SENT if stage in MESSAGE_STAGES else Verdict.TRANSIENT)
    elif klass == 4:
        assert outcome.verdict is Verdict.TRANSIENT
    else:
        assert outcome.verdict in (Verdict.PERMANENT, Verdict.TRANSIENT)
    failed = outcome.verdict is not Verdict.SENT
    result = EmailResult(
        idempotency_key="k|a@example.com", outbox_id=1, recipient="a@example.com",
        status=DeliveryStatus.FAILED if failed else DeliveryStatus.SENT, attempt=1,
        occurred_at=NOW, smtp_code=outcome.code if outcome.code is None
        or -(2**31) <= outcome.code < 2**31 else None,
        enhanced_code=outcome.enhanced_code, error=reason if failed else None)
    assert decode(EmailResult, encode(result), headers_for(result)) == result
    is_throttling(reply)  # any text, answered without an error


@pytest.mark.parametrize(("text", "throttling"), [
    ("4.7.28 rate limited", True),
    ("4.3.0 " + "x" * 2000 + " throttled", False),  # only the start of a reply is searched
    ("try again later" * 10_000, False),
])
def test_only_the_start_of_a_reply_is_searched_for_throttling_words(text: str,
                                                                    throttling: bool) -> None:
    assert is_throttling(SmtpReply(Stage.RCPT_TO, 451, text)) is throttling


class _FakeTransport(_Transport):
    def get_extra_info(self, name: str, default: object = None) -> object:
        return default


@BOUNDED
@given(REPLY_BYTES, st.lists(st.integers(0, 50_000), max_size=8))
def test_aiosmtplib_takes_any_reply_in_any_pieces_without_an_error_of_its_own(
        data: bytes, cuts: list[int]) -> None:
    """The other reader a reply meets (POSTROOM_SMTP_PIPELINING off, and every connection's
    greeting, EHLO, STARTTLS and AUTH): fed the same pieces, it raises nothing, and what it reads
    first is the reply the pipelined reader reads first, or a refusal."""
    points = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
    chunks = [data[a:b] for a, b in itertools.pairwise(points)]
    loop = asyncio.new_event_loop()
    try:
        protocol = SMTPProtocol(loop=loop)
        protocol.connection_made(cast(asyncio.Transport, _FakeTransport()))
        for chunk in chunks:
            protocol.data_received(chunk)
        waiter = protocol._response_waiter
        assert waiter is not None
        # Not done: still waiting for the rest of a reply, which its timeout ends.
        refused = waiter.exception() if waiter.done() else None
        read = waiter.result() if waiter.done() and refused is None else None
    finally:
        loop.close()
    if refused is not None:
        assert isinstance(refused, aiosmtplib.SMTPResponseException)
    if read is not None:
        replies, _ = fed(chunks)
        assert replies[:1] == [(read.code, read.message)]


def test_a_reply_dripped_a_line_at_a_time_is_parsed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that sends thousands of continuation lines, one a segment: each segment used to
    parse every line before it again (seconds of the event loop for 32 KiB, review); only a
    segment that can end the reply is parsed now, and the reply is the same."""
    parses: list[int] = []
    take_reply = pipelining._take_reply

    def counted(buffer: bytearray) -> Any:
        parses.append(len(buffer))
        return take_reply(buffer)

    monkeypatch.setattr(pipelining, "_take_reply", counted)
    lines = [b"250-x\r\n"] * 4000 + [b"250 done\r\n", b"221-a\r\n", b"221 b\r\n"]
    replies, lost = fed(lines)
    assert lost is None
    assert replies == [(250, "\n".join(["x"] * 4000 + ["done"])), (221, "a\nb")]
    assert len(parses) == 2
