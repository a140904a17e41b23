"""sender.pipelining's pure parts: reading replies out of a buffer, and which reply of a group
refused."""

from __future__ import annotations

import aiosmtplib
import pytest
from aiosmtplib.response import SMTPResponse

from sender.outcome import Stage
from sender.pipelining import _refusal, _take_reply


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
