"""postroom.sender.pipelining's pure parts: reading replies out of a buffer, which reply of a group
refused, and the wait for a reply (on an event loop, over a transport that answers as told)."""

from __future__ import annotations

import asyncio
import collections
from typing import Any, cast

import aiosmtplib
import pytest
from aiosmtplib.protocol import PERIOD_REGEX, normalize_message_line_endings
from aiosmtplib.response import SMTPResponse
from hypothesis import given
from hypothesis import strategies as st

from postroom.sender.outcome import Stage
from postroom.sender.pipelining import Pipeline, _refusal, _take_reply, data_bytes


def replies_in(data: bytes) -> tuple[list[SMTPResponse], bytes]:
    buffer = bytearray(data)
    found = []
    while (reply := _take_reply(buffer)) is not None:
        found.append(reply)
    return found, bytes(buffer)


@pytest.mark.parametrize(("data", "replies", "left"), [
    (b"", [], b""),
    (b"250 2.1.0 Ok\r\n", [(250, "2.1.0 Ok")], b""),
    (b"250 Ok\r\n250 Ok\r\n354 go", [(250, "Ok"), (250, "Ok")], b"354 go"),
    (b"250-first\r\n250-second\r\n250 last\r\n", [(250, "first\nsecond\nlast")], b""),
    (b"250-first\r\n250-sec", [], b"250-first\r\n250-sec"),  # not all there yet
    (b"550 5.1.1 no such user\n", [(550, "5.1.1 no such user")], b""),  # a bare LF
    (b"354\r\n", [(354, "")], b""),
])
def test_replies_are_taken_whole_and_in_order(data: bytes, replies: list[tuple[int, str]],
                                              left: bytes) -> None:
    found, rest = replies_in(data)
    assert [(r.code, r.message) for r in found] == replies
    assert rest == left


def test_a_line_without_a_code_is_a_malformed_reply() -> None:
    with pytest.raises(aiosmtplib.SMTPResponseException, match="Malformed") as raised:
        replies_in(b"hello there\r\n")
    assert raised.value.code == -1


OK, DATA = SMTPResponse(250, "Ok"), SMTPResponse(354, "go ahead")


@pytest.mark.parametrize(("mail", "rcpt", "data", "refused"), [
    (OK, OK, DATA, None),
    (OK, SMTPResponse(251, "will forward"), DATA, None),
    (SMTPResponse(553, "no"), SMTPResponse(503, "need MAIL"), SMTPResponse(503, "need RCPT"),
     Stage.MAIL_FROM),
    (OK, SMTPResponse(550, "no such user"), SMTPResponse(554, "no valid recipients"),
     Stage.RCPT_TO),
    (OK, SMTPResponse(451, "later"), DATA, Stage.RCPT_TO),  # a server that said 354 anyway
    (OK, OK, SMTPResponse(452, "no room"), Stage.DATA),
])
def test_the_first_refusal_of_a_group_is_the_one_reported(
        mail: SMTPResponse, rcpt: SMTPResponse, data: SMTPResponse,
        refused: Stage | None) -> None:
    found = _refusal(mail, rcpt, data)
    if refused is None:
        assert found is None
    else:
        assert found is not None
        assert found[0] is refused
        assert found[1] is {Stage.MAIL_FROM: mail, Stage.RCPT_TO: rcpt, Stage.DATA: data}[refused]


class ScriptedTransport:
    """Answers each write with the next scripted reply (None: no answer, ever)."""

    def __init__(self, answers: list[bytes | None]) -> None:
        self.answers = collections.deque(answers)
        self.pipeline: Pipeline | None = None
        self.closed = False

    def write(self, data: bytes) -> None:
        answer = self.answers.popleft()
        if answer is not None and self.pipeline is not None:
            asyncio.get_running_loop().call_soon(self.pipeline.data_received, answer)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


class CountingLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        super().__init__()
        self.timers = 0

    def call_at(self, when: float, callback: Any, *args: Any, **kwargs: Any) -> Any:
        self.timers += 1
        return super().call_at(when, callback, *args, **kwargs)


def pipeline_answering(answers: list[bytes | None], timeout_s: float) -> Pipeline:
    transport = ScriptedTransport(answers)
    pipeline = Pipeline(cast(asyncio.Transport, transport), {}, timeout_s)
    transport.pipeline = pipeline
    return pipeline


def test_replies_that_come_at_once_share_one_timer() -> None:
    loop = CountingLoop()
    pipeline = pipeline_answering([b"250 Ok\r\n"] * 200, timeout_s=30)

    async def run() -> list[int]:
        return [(await pipeline.execute_command(b"NOOP")).code for _ in range(200)]

    try:
        assert loop.run_until_complete(run()) == [250] * 200
    finally:
        loop.close()
    assert loop.timers == 1


def test_a_reply_that_never_comes_times_out_and_closes_the_connection() -> None:
    pipeline = pipeline_answering([b"250 Ok\r\n", None], timeout_s=0.2)

    async def run() -> float:
        await pipeline.execute_command(b"NOOP")  # its timer fires 0.2 s from now
        await asyncio.sleep(0.1)
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(aiosmtplib.SMTPReadTimeoutError):
            await asyncio.wait_for(pipeline.execute_command(b"NOOP"), 5)
        return loop.time() - start

    waited = asyncio.run(run())
    # The first wait's timer fired 0.1 s into the second: it was armed again for the second's
    # own deadline, not taken as the second's.
    assert waited >= 0.2
    assert not pipeline.is_connected


def test_a_shorter_timeout_is_not_held_to_an_earlier_longer_one() -> None:
    pipeline = pipeline_answering([b"250 Ok\r\n", None], timeout_s=60)

    async def run() -> None:
        await pipeline.execute_command(b"NOOP")  # arms a timer for a minute from now
        with pytest.raises(aiosmtplib.SMTPReadTimeoutError):
            await asyncio.wait_for(pipeline.execute_command(b"QUIT", timeout=0.1), 5)

    asyncio.run(run())


GROUP_ACCEPTED = b"250 2.1.0 Ok\r\n250 2.1.5 Ok\r\n354 go ahead\r\n"


def test_the_acceptance_is_told_from_the_read_of_the_250_before_the_send_resumes() -> None:
    pipeline = pipeline_answering([GROUP_ACCEPTED, b"250 2.0.0 queued as 1\r\n"], timeout_s=30)
    told: list[tuple[int, str, list[int]]] = []

    def accepted(code: int, text: str) -> None:
        # Every reply is still queued: the waiting send has not taken even the group's yet.
        told.append((code, text, [r.code for r in pipeline._replies]))

    async def run() -> int:
        reply = await pipeline.transaction(b"MAIL FROM:<a@x>", b"RCPT TO:<b@x>", b"hi\r\n",
                                           accepted)
        # Replies to later commands are not the message's.
        await pipeline.execute_command(b"NOOP")
        return reply.code

    pipeline.transport.answers.append(b"250 2.0.0 Ok\r\n")  # type: ignore[union-attr]
    assert asyncio.run(run()) == 250
    assert told == [(250, "2.0.0 queued as 1", [250, 250, 354, 250])]


def test_the_send_is_woken_before_its_acceptance_is_told() -> None:
    """So that at the loop's next turn the send (which gives its connection back) runs before
    what the acceptance wakes: the next send, which the 250 gives the destination's turn."""
    class Later(ScriptedTransport):
        def write(self, data: bytes) -> None:  # the 250 comes once the send waits for it
            answer = self.answers.popleft()
            asyncio.get_running_loop().call_later(0.01, pipeline.data_received, answer)

    pipeline = Pipeline(cast(asyncio.Transport, Later([GROUP_ACCEPTED, b"250 2.0.0 Ok\r\n"])),
                        {}, 30)
    woken: list[bool] = []

    def accepted(code: int, text: str) -> None:
        waiter = pipeline._waiter
        woken.append(waiter is not None and waiter.done())

    async def run() -> int:
        reply = await pipeline.transaction(b"MAIL FROM:<a@x>", b"RCPT TO:<b@x>", b"hi\r\n",
                                           accepted)
        return reply.code

    assert asyncio.run(run()) == 250
    assert woken == [True]


class RecordingTransport(ScriptedTransport):
    """A scripted transport that keeps what was written, with the replies then still queued."""

    def __init__(self, answers: list[bytes | None]) -> None:
        super().__init__(answers)
        self.written: list[tuple[bytes, int]] = []

    def write(self, data: bytes) -> None:
        queued = len(self.pipeline._replies) if self.pipeline is not None else 0
        self.written.append((data, queued))
        super().write(data)


def recording_pipeline(answers: list[bytes | None]) -> tuple[Pipeline, RecordingTransport]:
    transport = RecordingTransport(answers)
    pipeline = Pipeline(cast(asyncio.Transport, transport), {}, 30)
    transport.pipeline = pipeline
    return pipeline, transport


def test_the_message_goes_from_the_read_of_the_354_not_from_the_send_resumed() -> None:
    pipeline, transport = recording_pipeline([GROUP_ACCEPTED, b"250 2.0.0 queued\r\n"])

    async def run() -> int:
        return (await pipeline.transaction(b"MAIL FROM:<a@x>", b"RCPT TO:<b@x>",
                                           b"hi\r\n.dot\r\n")).code

    assert asyncio.run(run()) == 250
    assert transport.written == [
        (b"MAIL FROM:<a@x>\r\nRCPT TO:<b@x>\r\nDATA\r\n", 0),
        # Written with the group's three replies queued, none yet taken by the send.
        (b"hi\r\n..dot\r\n.\r\n", 3),
    ]


@pytest.mark.parametrize("stray", [
    b"250 2.0.0 queued\r\n",                    # a message answered twice
    b"421 4.4.2 idle too long, closing\r\n",    # a server that gives up an idle connection
])
def test_a_reply_nothing_asked_for_gives_the_connection_up(stray: bytes) -> None:
    """A reply read as the next group's MAIL reply would shift every reply after it: the next
    message would be written and reported failed (and sent again). The connection is given up
    before anything more is written on it."""
    pipeline, transport = recording_pipeline([GROUP_ACCEPTED, b"250 2.0.0 Ok\r\n" + stray,
                                              GROUP_ACCEPTED, b"250 2.0.0 Ok\r\n"])

    async def run() -> None:
        first = await pipeline.transaction(b"MAIL FROM:<a@x>", b"RCPT TO:<b@x>", b"one\r\n")
        assert first.code == 250
        await asyncio.sleep(0)  # the stray reply is read
        assert not pipeline.is_connected
        with pytest.raises(aiosmtplib.SMTPServerDisconnected, match="reply out of turn"):
            await pipeline.transaction(b"MAIL FROM:<a@x>", b"RCPT TO:<c@x>", b"two\r\n")

    asyncio.run(run())
    assert [data for data, _ in transport.written] == [
        b"MAIL FROM:<a@x>\r\nRCPT TO:<b@x>\r\nDATA\r\n", b"one\r\n.\r\n"]
    assert transport.closed


@pytest.mark.parametrize(("answers", "after_group"), [
    ([b"550 5.1.0 sender refused\r\n503 need MAIL\r\n503 need RCPT\r\n"], []),
    ([b"250 Ok\r\n550 5.1.1 no such user\r\n554 no valid recipients\r\n"], []),
    ([b"250 Ok\r\n250 Ok\r\n452 no room\r\n"], []),
    # A server that said 354 after refusing the recipient gets an empty message, not this one.
    ([b"250 Ok\r\n451 later\r\n354 go ahead\r\n", b"554 no recipients\r\n"], [b".\r\n"]),
])
def test_a_refused_group_never_writes_the_message(answers: list[bytes | None],
                                                  after_group: list[bytes]) -> None:
    pipeline, transport = recording_pipeline(answers)

    async def run() -> None:
        with pytest.raises(aiosmtplib.SMTPResponseException):
            await pipeline.transaction(b"MAIL FROM:<a@x>", b"RCPT TO:<b@x>", b"secret\r\n")

    asyncio.run(run())
    assert [data for data, _ in transport.written[1:]] == after_group


@pytest.mark.parametrize("answers", [
    [GROUP_ACCEPTED, b"550 5.7.1 content rejected\r\n"],  # the message refused
    [GROUP_ACCEPTED, b"451 4.3.0 try later\r\n"],
    [b"250 Ok\r\n550 5.1.1 no such user\r\n554 no valid recipients\r\n", b"250 Ok\r\n"],
])
def test_no_acceptance_is_told_for_a_refusal(answers: list[bytes | None]) -> None:
    pipeline = pipeline_answering(answers, timeout_s=30)
    told: list[int] = []

    async def run() -> None:
        with pytest.raises(aiosmtplib.SMTPResponseException):
            await pipeline.transaction(b"MAIL FROM:<a@x>", b"RCPT TO:<b@x>", b"hi\r\n",
                                       lambda code, _text: told.append(code))

    asyncio.run(run())
    assert told == []


def _aiosmtplib_data(content: bytes) -> bytes:
    return PERIOD_REGEX.sub(b"..", normalize_message_line_endings(content)) + b".\r\n"


@pytest.mark.parametrize("content", [
    b"Subject: s\r\n\r\nbody\r\n",           # as the email package writes it: the quick way
    b"Subject: s\r\n\r\n.starts with a period\r\n",
    b".first line\r\n\r\nx\r\n",
    b"Subject: s\n\nbare line feeds\n",
    b"Subject: s\r\rbare carriage returns\r",
    b"Subject: s\r\n\r\nno line end at the end",
    b"Subject: s\r\n\r\n..two\r\n.\r\n",
    b"",
])
def test_data_bytes_are_what_aiosmtplib_writes(content: bytes) -> None:
    assert data_bytes(content) == _aiosmtplib_data(content)


@given(st.lists(st.sampled_from([b"a", b".", b"\r", b"\n", b"\r\n", b"\n.", b" "]),
                           max_size=40).map(b"".join))
def test_no_content_is_written_other_than_aiosmtplib_writes_it(content: bytes) -> None:
    assert data_bytes(content) == _aiosmtplib_data(content)
