"""The benchmark's slow server answers each message's end after its delay, and every other command
at once, in order under pipelining."""

from __future__ import annotations

import asyncio
import json
import time

import aiosmtplib
import pytest

from bench.slowsink import SlowSession
from postroom.devkit.ports import free_port

DELAY_S = 0.05
MESSAGE = "From: a@example.com\r\nTo: b@example.com\r\nSubject: x\r\n\r\n.leading dot\r\nhi\r\n"


async def _with_server(work: object) -> object:
    port = free_port()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: SlowSession(DELAY_S), "127.0.0.1", port)
    async with server:
        return await work(port)  # type: ignore[operator]


def test_each_message_waits_its_delay_and_is_accepted() -> None:
    async def send(port: int) -> tuple[list[str], float]:
        client = aiosmtplib.SMTP(hostname="127.0.0.1", port=port)
        await client.connect()
        assert client.supports_extension("pipelining")
        started = time.monotonic()
        codes = []
        for n in range(3):
            errors, reply = await client.sendmail("a@example.com", [f"b{n}@example.com"], MESSAGE)
            assert errors == {}
            codes.append(reply)
        elapsed = time.monotonic() - started
        await client.quit()
        return codes, elapsed

    codes, elapsed = asyncio.run(_with_server(send))  # type: ignore[misc]
    assert codes == ["2.0.0 Ok: queued"] * 3
    assert elapsed >= 3 * DELAY_S


def test_pipelined_commands_are_answered_in_order_after_the_delayed_reply() -> None:
    async def pipelined(port: int) -> list[bytes]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        await reader.readline()  # greeting
        writer.write(b"EHLO me\r\nMAIL FROM:<a@example.com>\r\nRCPT TO:<b@example.com>\r\nDATA\r\n")
        lines = [await reader.readline() for _ in range(8)]  # 5 of EHLO, MAIL, RCPT, 354
        # The message (its first line the terminator's dot: empty), then the next transaction
        # already pipelined behind it, whose replies must wait for the delayed 250.
        writer.write(b".\r\nMAIL FROM:<a@example.com>\r\nNOOP\r\nFROB\r\nQUIT\r\n")
        started = time.monotonic()
        first = await reader.readline()
        waited = time.monotonic() - started
        lines += [first, *[await reader.readline() for _ in range(4)]]
        assert await reader.read() == b""  # closed after QUIT
        writer.close()
        assert waited >= DELAY_S * 0.9
        return [line[:3] for line in lines]

    codes = asyncio.run(_with_server(pipelined))  # type: ignore[misc]
    assert codes == [b"250"] * 5 + [b"250", b"250", b"354",
                                    b"250", b"250", b"250", b"502", b"221"]


@pytest.mark.parametrize("chunk", [1, 3, 7])
def test_a_message_split_anywhere_ends_once(chunk: int) -> None:
    """The terminator split across reads is still found; the content is not kept."""
    async def split(port: int) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        await reader.readline()
        wire = (b"HELO me\r\nMAIL FROM:<a@example.com>\r\nRCPT TO:<b@example.com>\r\nDATA\r\n"
                + MESSAGE.encode() + b".\r\nQUIT\r\n")
        for start in range(0, len(wire), chunk):
            writer.write(wire[start:start + chunk])
            await writer.drain()
        replies = await reader.read()
        writer.close()
        return replies

    replies = asyncio.run(_with_server(split))  # type: ignore[misc]
    assert [line[:3] for line in replies.splitlines()] == [
        b"250", b"250", b"250", b"354", b"250", b"221"]


def test_xturn_tells_the_clients_turn_around_and_starts_again() -> None:
    """A client that waits after the 250 before its next MAIL shows that wait; one that writes
    its next MAIL behind the message shows none; a second XTURN starts from nothing."""
    pause_s = 0.03

    async def measured(port: int) -> list[dict[str, dict[str, float]]]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        await reader.readline()
        envelope = b"MAIL FROM:<a@example.com>\r\nRCPT TO:<b@example.com>\r\nDATA\r\n"
        writer.write(b"HELO me\r\n" + envelope)
        for _ in range(4):  # HELO, MAIL, RCPT, 354
            await reader.readline()
        writer.write(b".\r\n")
        await reader.readline()  # the delayed 250
        await asyncio.sleep(pause_s)
        writer.write(envelope)  # the next MAIL, pause_s after the 250
        for _ in range(3):
            await reader.readline()
        writer.write(b".\r\n" + envelope)  # the one after it, behind the message
        for _ in range(4):  # 250 to the message, then MAIL, RCPT, 354
            await reader.readline()
        writer.write(b".\r\nXTURN\r\nXTURN\r\nQUIT\r\n")
        await reader.readline()  # 250 to the message
        taken = [json.loads((await reader.readline())[4:]) for _ in range(2)]
        writer.close()
        return taken

    first, second = asyncio.run(_with_server(measured))  # type: ignore[misc]
    after_250, after_354 = first["after_250"], first["after_354"]
    assert after_250["count"] == 2 and after_354["count"] == 3
    # Of two turns the p90 is the longer and the median their mean, so the shorter is known:
    # the waiting client's turn is at least its pause (however late the loaded machine woke it),
    # and the one written behind the message is read with it, at once.
    longer = after_250["p90_ms"]
    shorter = 2 * after_250["p50_ms"] - longer
    assert longer >= pause_s * 1000
    assert shorter < pause_s * 1000 / 2
    assert second == {"after_250": {"count": 0}, "after_354": {"count": 0}}
