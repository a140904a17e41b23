"""SmtpPool against real SMTP servers: the dev server, a silent one and a scripted one."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import ssl
import subprocess
from collections.abc import Callable, Coroutine, Iterator
from email.message import EmailMessage
from pathlib import Path
from typing import Any, TypeVar

import pytest
import uvloop

from postroom.devkit.devsmtp import DevSmtpServer
from postroom.devkit.ports import free_port
from postroom.sender.outcome import REASON_MAX_CHARS, Failure, SmtpReply, Stage, Verdict, classify_reply
from postroom.sender.smtp import SmtpPool
from postroom.sender.smtp_config import SmtpConfig
from postroom.settings import Secret, Settings, TlsMode

pytestmark = pytest.mark.integration


LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
_client_loop: list[Callable[[], asyncio.AbstractEventLoop]] = [asyncio.new_event_loop]
_servers_pipeline = [True]


@pytest.fixture(autouse=True, params=[(loop, pipelining) for loop in LOOPS
                                      for pipelining in ("pipelining", "one-by-one")],
                ids="-".join)
def client_kind(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """Every test's client on both loops the sender runs on (POSTROOM_EVENT_LOOP), against
    servers that offer PIPELINING and servers that do not (the client then waits for each
    reply): TLS, timeouts, refusals and dropped connections behave alike. The servers keep
    asyncio's loop."""
    loop, pipelining = request.param
    _client_loop[0] = LOOPS[loop]
    _servers_pipeline[0] = pipelining == "pipelining"
    try:
        yield request.param
    finally:
        _client_loop[0] = asyncio.new_event_loop
        _servers_pipeline[0] = True


def run_client(coro: Coroutine[Any, Any, T]) -> T:
    with asyncio.Runner(loop_factory=_client_loop[0]) as runner:
        return runner.run(coro)


T = TypeVar("T")
SENDER = "reports@example.com"


def make_message(recipient: str = "finance@example.com") -> EmailMessage:
    message = EmailMessage()
    message["From"] = SENDER
    message["To"] = recipient
    message["Subject"] = "Sales report — September 2026"
    message["Message-ID"] = "<m1@example.com>"
    message.set_content("The September sales report is attached. Grüße\n")
    return message


def config(port: int, **changes: object) -> SmtpConfig:
    base = SmtpConfig(host="127.0.0.1", port=port, tls=TlsMode.AUTO, connect_timeout_s=5.0,
                      timeout_s=5.0, concurrency=3, local_hostname="client.postroom.test")
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def send_all(cfg: SmtpConfig, *recipients: str,
             loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None) -> list[SmtpReply]:
    """Send one message per recipient, one after the other, through one pool."""

    async def run() -> list[SmtpReply]:
        async with SmtpPool(cfg) as pool:
            return [await pool.send(make_message(r), SENDER, r) for r in recipients]

    with asyncio.Runner(loop_factory=loop_factory or _client_loop[0]) as runner:
        return runner.run(run())



def dev_server(**options: Any) -> DevSmtpServer:
    """A dev server on a free loopback port, offering PIPELINING or not as this test runs."""
    return DevSmtpServer("127.0.0.1", 0, pipelining=_servers_pipeline[0], **options)


@pytest.fixture
def dev() -> Iterator[DevSmtpServer]:
    server = dev_server(reject={"old.manager@example.com"}, defer={"ops@example.com": 1},
                        drop={"flaky@example.com"})
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key, made with the openssl CLI."""
    directory = tmp_path_factory.mktemp("tls")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        check=True, capture_output=True,
    )
    return cert, key


@pytest.fixture
def tls_dev(certificate: tuple[Path, Path]) -> Iterator[DevSmtpServer]:
    """A dev server offering STARTTLS with the self-signed certificate."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*certificate)
    server = dev_server(tls_context=context)
    server.start()
    yield server
    server.stop()


# --- replies from the dev server


def test_accepted_message_is_a_250_at_data(dev: DevSmtpServer) -> None:
    [reply] = send_all(config(dev.port), "finance@example.com")
    assert (reply.stage, reply.code, reply.failure) == (Stage.DATA, 250, None)
    assert reply.text.startswith("2.0.0 Ok queued as ")
    assert dev.message_ids() == ["<m1@example.com>"]
    assert "Grüße".encode() in dev.messages[0].raw  # sent as 8BITMIME, which the server offers


def test_rejected_recipient_is_a_550_at_rcpt_to(dev: DevSmtpServer) -> None:
    [reply] = send_all(config(dev.port), "old.manager@example.com")
    assert reply == SmtpReply(Stage.RCPT_TO, 550, "5.1.1 User unknown")


def test_deferred_recipient_is_a_451_then_accepted(dev: DevSmtpServer) -> None:
    first, second = send_all(config(dev.port), "ops@example.com", "ops@example.com")
    assert first == SmtpReply(Stage.RCPT_TO, 451, "4.3.0 try again later")
    assert (second.stage, second.code) == (Stage.DATA, 250)
    assert dev.connections == 1  # the connection survives a refused recipient (RSET)


def test_drop_during_data_is_a_reset_and_the_next_send_reconnects(dev: DevSmtpServer) -> None:
    dropped, after = send_all(config(dev.port), "flaky@example.com", "finance@example.com")
    assert (dropped.stage, dropped.code, dropped.failure) == (Stage.DATA, None, Failure.RESET)
    assert (after.stage, after.code) == (Stage.DATA, 250)
    assert dev.connections == 2
    assert dev.count() == 1


def test_one_connection_is_reused_for_several_sends(dev: DevSmtpServer) -> None:
    replies = send_all(config(dev.port), *(f"user{i}@example.com" for i in range(5)))
    assert [r.code for r in replies] == [250] * 5
    assert dev.connections == 1


def test_concurrency_bounds_the_open_connections() -> None:
    server = dev_server(latency_ms=200)
    server.start()
    try:
        async def run() -> list[SmtpReply]:
            async with SmtpPool(config(server.port, concurrency=3)) as pool:
                return await asyncio.gather(*(
                    pool.send(make_message(), SENDER, f"user{i}@example.com") for i in range(9)))

        replies = run_client(run())
        assert [r.code for r in replies] == [250] * 9
        assert server.peak_connections == 3
        assert server.connections == 3
    finally:
        server.stop()


def test_a_held_slot_counts_against_the_same_limit_as_sends() -> None:
    """The sender holds a slot around its ledger claim and send: one limit, not two."""
    server = dev_server()
    server.start()
    try:
        async def run() -> tuple[bool, list[int | None]]:
            async with SmtpPool(config(server.port, concurrency=2)) as pool:
                async with pool.slot() as first, pool.slot():
                    blocked = asyncio.ensure_future(
                        pool.send(make_message(), SENDER, "queued@example.com"))
                    await asyncio.sleep(0.3)
                    was_blocked = not blocked.done() and server.count() == 0
                    reply = await first.send(make_message(), SENDER, "held@example.com")
                return was_blocked, [reply.code, (await blocked).code]

        was_blocked, codes = run_client(run())
    finally:
        server.stop()
    assert was_blocked
    assert codes == [250, 250]
    assert server.peak_connections <= 2


def test_slow_reply_to_data_is_a_timeout_at_data() -> None:
    server = dev_server(latency_ms=2000)
    server.start()
    try:
        [reply] = send_all(config(server.port, timeout_s=0.3), "finance@example.com")
    finally:
        server.stop()
    assert (reply.stage, reply.code, reply.failure) == (Stage.DATA, None, Failure.TIMEOUT)


def test_a_cancelled_send_discards_its_connection() -> None:
    server = dev_server(latency_ms=500)
    server.start()
    try:
        async def run() -> SmtpReply:
            async with SmtpPool(config(server.port, concurrency=1)) as pool:
                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(
                        pool.send(make_message(), SENDER, "finance@example.com"), 0.2)
                return await pool.send(make_message(), SENDER, "ceo@example.com")

        reply = run_client(run())
    finally:
        server.stop()
    assert (reply.stage, reply.code) == (Stage.DATA, 250)
    assert server.connections == 2  # the half-finished dialogue was not reused


# --- no server, or one that says nothing


def test_nothing_listening_is_refused_at_connect() -> None:
    [reply] = send_all(config(free_port()), "finance@example.com")
    assert (reply.stage, reply.code, reply.failure) == (Stage.CONNECT, None, Failure.REFUSED)


class ResolverWithoutNames(asyncio.SelectorEventLoop):
    """An event loop whose resolver answers every name as DNS answers a `.invalid` one (RFC 6761),
    whatever resolver this host has, or none; it records the names it was asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[str] = []

    async def getaddrinfo(self, host: Any, *args: Any, **kwargs: Any) -> Any:
        self.asked.append(host)
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")


def test_unknown_host_is_unreachable_at_connect() -> None:
    loop = ResolverWithoutNames()
    [reply] = send_all(config(25, host="no-such-host.invalid"), "finance@example.com",
                       loop_factory=lambda: loop)
    assert loop.asked == ["no-such-host.invalid"]
    assert (reply.stage, reply.code, reply.failure) == (Stage.CONNECT, None, Failure.UNREACHABLE)


def test_silent_server_is_a_timeout_waiting_for_the_greeting() -> None:
    async def run() -> SmtpReply:
        writers: list[asyncio.StreamWriter] = []

        async def accept_and_stay_silent(
            reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
        ) -> None:
            writers.append(writer)

        silent = await asyncio.start_server(accept_and_stay_silent, "127.0.0.1", 0)
        port = silent.sockets[0].getsockname()[1]
        try:
            async with SmtpPool(config(port, connect_timeout_s=0.3)) as pool:
                return await pool.send(make_message(), SENDER, "finance@example.com")
        finally:
            for writer in writers:
                writer.close()
            silent.close()
            await silent.wait_closed()

    reply = run_client(run())
    assert (reply.stage, reply.code, reply.failure) == (Stage.GREETING, None, Failure.TIMEOUT)


# --- TLS


def test_starttls_required_but_not_offered_is_a_tls_failure(dev: DevSmtpServer) -> None:
    [reply] = send_all(config(dev.port, tls=TlsMode.STARTTLS), "finance@example.com")
    assert (reply.stage, reply.code, reply.failure) == (Stage.STARTTLS, None, Failure.TLS)
    assert dev.count() == 0


def test_implicit_tls_to_a_plain_server_is_a_tls_failure(dev: DevSmtpServer) -> None:
    [reply] = send_all(config(dev.port, tls=TlsMode.TLS), "finance@example.com")
    assert (reply.stage, reply.code, reply.failure) == (Stage.CONNECT, None, Failure.TLS)


def test_auto_tls_verifies_the_certificate(tls_dev: DevSmtpServer) -> None:
    [reply] = send_all(config(tls_dev.port, tls=TlsMode.AUTO), "finance@example.com")
    assert (reply.stage, reply.code, reply.failure) == (Stage.STARTTLS, None, Failure.TLS)
    assert "certificate verify failed" in reply.text
    assert tls_dev.count() == 0


@pytest.mark.parametrize("mode", [TlsMode.AUTO, TlsMode.STARTTLS])
def test_starttls_with_a_trusted_private_ca_delivers(
    tls_dev: DevSmtpServer, certificate: tuple[Path, Path], mode: TlsMode,
) -> None:
    cfg = config(tls_dev.port, tls=mode, tls_ca_file=certificate[0])
    first, second = send_all(cfg, "finance@example.com", "ceo@example.com")
    assert (first.stage, first.code, second.code) == (Stage.DATA, 250, 250)
    assert tls_dev.connections == 1


def test_tls_none_never_upgrades(tls_dev: DevSmtpServer) -> None:
    [reply] = send_all(config(tls_dev.port, tls=TlsMode.NONE), "finance@example.com")
    assert (reply.stage, reply.code) == (Stage.DATA, 250)


# --- a scripted server, for replies the dev server does not give


Script = Callable[[int, int, str], str | None]


def run_scripted(script: Script, recipients: list[str], greeting: str = "220 scripted ESMTP",
                 **changes: object) -> tuple[list[SmtpReply], int]:
    """Send through a server answering ``script(connection_no, mail_no, command)``.

    The script answers each command line (DATA content arrives as "<content>"); None or a
    421 closes the connection. Returns the replies and the number of connections made.
    """
    connections = 0

    async def session(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        number, mails = connections, 0
        writer.write(f"{greeting}\r\n".encode())
        try:
            while greeting.startswith("220") and (line := await reader.readline()):
                command = line.decode().strip()
                if command.upper() == "DATA":
                    writer.write(b"354 go ahead\r\n")
                    while await reader.readline() != b".\r\n":
                        pass
                    command = "<content>"
                mails += command.upper().startswith("MAIL")
                answer = "221 bye" if command.upper() == "QUIT" else script(number, mails, command)
                if answer is None:
                    break
                writer.write(f"{answer}\r\n".encode())
                await writer.drain()
                if answer[:3] in ("221", "421"):
                    break
        finally:
            writer.close()

    async def run() -> list[SmtpReply]:
        server = await asyncio.start_server(session, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            async with SmtpPool(config(port, **{"tls": TlsMode.NONE, **changes})) as pool:
                replies = []
                for rcpt in recipients:
                    replies.append(await pool.send(make_message(rcpt), SENDER, rcpt))
                    await asyncio.sleep(0.05)  # let a closing server's EOF arrive
                return replies
        finally:
            server.close()
            await server.wait_closed()

    return run_client(run()), connections


def ordinary(command: str) -> str:
    verb = command.split(" ", 1)[0].upper()
    ehlo = "250-scripted\r\n" + ("250-PIPELINING\r\n" if _servers_pipeline[0] else "") + "250 8BITMIME"
    return {"EHLO": ehlo, "<content>": "250 2.0.0 queued"}.get(verb, "250 2.1.0 Ok")


def test_421_at_mail_from_is_reported_and_the_connection_dropped() -> None:
    def script(conn: int, mails: int, command: str) -> str | None:
        if command.upper().startswith("MAIL"):
            return "421 4.3.2 Service shutting down"
        return ordinary(command)

    replies, connections = run_scripted(script, ["a@example.com", "b@example.com"])
    assert replies == [SmtpReply(Stage.MAIL_FROM, 421, "4.3.2 Service shutting down")] * 2
    assert connections == 2


def test_421_at_data_is_reported_and_the_connection_dropped() -> None:
    def script(conn: int, mails: int, command: str) -> str | None:
        return "421 4.4.2 Timeout" if command == "<content>" else ordinary(command)

    replies, connections = run_scripted(script, ["a@example.com", "b@example.com"])
    assert replies == [SmtpReply(Stage.DATA, 421, "4.4.2 Timeout")] * 2
    assert connections == 2


def test_an_idle_connection_closed_by_the_server_is_replaced_without_a_lost_send() -> None:
    def script(conn: int, mails: int, command: str) -> str | None:
        # The first connection times out after one message, as servers do with idle clients.
        if conn == 1 and mails == 2 and command.upper().startswith("MAIL"):
            return "421 4.4.2 Idle timeout"
        return ordinary(command)

    replies, connections = run_scripted(script, ["a@example.com", "b@example.com"])
    assert [(r.stage, r.code) for r in replies] == [(Stage.DATA, 250), (Stage.DATA, 250)]
    assert connections == 2


def test_greeting_refusal_is_reported_at_greeting() -> None:
    replies, _ = run_scripted(lambda *_: "250 Ok", ["a@example.com"],
                              greeting="554 5.3.2 No service here")
    assert replies == [SmtpReply(Stage.GREETING, 554, "5.3.2 No service here")]


def test_ehlo_refused_falls_back_to_helo() -> None:
    def script(conn: int, mails: int, command: str) -> str | None:
        if command.upper().startswith("EHLO"):
            return "502 5.5.1 EHLO not implemented"
        return ordinary(command)

    replies, _ = run_scripted(script, ["a@example.com"])
    assert (replies[0].stage, replies[0].code) == (Stage.DATA, 250)


def test_sender_refused_is_reported_at_mail_from_and_the_connection_kept() -> None:
    def script(conn: int, mails: int, command: str) -> str | None:
        if command.upper().startswith("MAIL") and mails == 1:
            return "553 5.7.1 Sender not allowed"
        return ordinary(command)

    replies, connections = run_scripted(script, ["a@example.com", "b@example.com"])
    assert replies[0] == SmtpReply(Stage.MAIL_FROM, 553, "5.7.1 Sender not allowed")
    assert (replies[1].stage, replies[1].code) == (Stage.DATA, 250)
    assert connections == 1


def test_auth_rejected_is_reported_at_auth() -> None:
    def script(conn: int, mails: int, command: str) -> str | None:
        if command.upper().startswith("EHLO"):
            return "250-scripted\r\n250 AUTH PLAIN LOGIN"
        if command.upper().startswith("AUTH"):
            return "535 5.7.8 Authentication credentials invalid"
        return ordinary(command)

    replies, _ = run_scripted(script, ["a@example.com"], username="postroom",
                              password=Secret("not-the-password"), insecure_auth_without_tls=True)
    assert replies == [SmtpReply(Stage.AUTH, 535, "5.7.8 Authentication credentials invalid")]


# --- no AUTH without TLS (issue 10)


def auth_without_starttls(seen: list[str]) -> Script:
    """A server offering AUTH but not STARTTLS (as when an attacker strips it from the EHLO
    reply) that accepts any login; ``seen`` records every command it gets."""
    def script(conn: int, mails: int, command: str) -> str | None:
        seen.append(command)
        if command.upper().startswith("EHLO"):
            return "250-scripted\r\n250-AUTH PLAIN LOGIN\r\n250 8BITMIME"
        if command.upper().startswith("AUTH"):
            return "235 2.7.0 Authentication successful"
        return ordinary(command)
    return script


def authenticated(seen: list[str]) -> bool:
    return any(command.upper().startswith("AUTH") for command in seen)


@pytest.mark.parametrize("mode", [TlsMode.AUTO, TlsMode.STARTTLS])
def test_auto_with_credentials_needs_starttls_and_never_sends_auth(mode: TlsMode) -> None:
    seen: list[str] = []
    replies, _ = run_scripted(auth_without_starttls(seen), ["a@example.com"], tls=mode,
                              username="postroom", password=Secret("s3cret"))
    [reply] = replies
    assert (reply.stage, reply.failure) == (Stage.STARTTLS, Failure.TLS)
    assert not authenticated(seen)
    assert not any(command.upper().startswith("MAIL") for command in seen)


def test_tls_none_with_credentials_is_refused_before_auth() -> None:
    seen: list[str] = []
    replies, _ = run_scripted(auth_without_starttls(seen), ["a@example.com"], tls=TlsMode.NONE,
                              username="postroom", password=Secret("s3cret"))
    [reply] = replies
    assert (reply.stage, reply.failure) == (Stage.AUTH, Failure.CONFIG)
    assert "POSTROOM_SMTP_INSECURE_AUTH_WITHOUT_TLS" in reply.text
    assert not authenticated(seen)


@pytest.mark.parametrize("mode", [TlsMode.AUTO, TlsMode.NONE])
def test_the_explicit_setting_allows_plain_text_auth(mode: TlsMode) -> None:
    seen: list[str] = []
    replies, _ = run_scripted(auth_without_starttls(seen), ["a@example.com"], tls=mode,
                              username="postroom", password=Secret("s3cret"),
                              insecure_auth_without_tls=True)
    assert [(r.stage, r.code) for r in replies] == [(Stage.DATA, 250)]
    assert authenticated(seen)


def test_auto_without_credentials_still_sends_without_tls() -> None:
    seen: list[str] = []
    replies, _ = run_scripted(auth_without_starttls(seen), ["a@example.com"], tls=TlsMode.AUTO)
    assert [(r.stage, r.code) for r in replies] == [(Stage.DATA, 250)]
    assert not authenticated(seen)


def test_auto_with_credentials_logs_in_after_starttls(
        tls_dev: DevSmtpServer, certificate: tuple[Path, Path]) -> None:
    [reply] = send_all(config(tls_dev.port, tls=TlsMode.AUTO, tls_ca_file=certificate[0],
                              username="postroom", password=Secret("s3cret")),
                       "finance@example.com")
    # STARTTLS went through, then the login was tried (the dev server refuses every login).
    assert (reply.stage, reply.code) == (Stage.AUTH, 535)


class AuthRecorder:
    """An aiosmtpd server of the test's own: AUTH over plain text, no STARTTLS; it records each
    login it receives."""

    def __init__(self) -> None:
        from aiosmtpd.controller import Controller
        from aiosmtpd.smtp import AuthResult

        self.logins: list[str] = []

        def authenticator(server: object, session: object, envelope: object, mechanism: str,
                          auth_data: object) -> AuthResult:
            self.logins.append(mechanism)
            return AuthResult(success=True)

        class Handler:
            async def handle_DATA(self, server: object, session: object,
                                  envelope: object) -> str:
                return "250 OK"

        self.port = free_port()
        self.controller = Controller(Handler(), hostname="127.0.0.1", port=self.port,
                                     authenticator=authenticator, auth_require_tls=False)

    def __enter__(self) -> AuthRecorder:
        self.controller.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.controller.stop()


def check_settings(port: int, **changes: object) -> Settings:
    return dataclasses.replace(  # type: ignore[arg-type]
        Settings(smtp_host="127.0.0.1", smtp_port=port, smtp_username="postroom",
                 smtp_password=Secret("s3cret"), smtp_connect_timeout_s=5.0,
                 smtp_timeout_s=5.0), **changes)


def test_check_reports_a_server_that_would_get_the_password_in_clear_text() -> None:
    from postroom.errors import PostroomError
    from postroom.sender.smtp import check_smtp

    with AuthRecorder() as server:
        with pytest.raises(PostroomError, match="refusing to send the AUTH password in clear"):
            check_smtp(check_settings(server.port))
        with pytest.raises(PostroomError, match="POSTROOM_SMTP_INSECURE_AUTH_WITHOUT_TLS"):
            check_smtp(check_settings(server.port, smtp_tls=TlsMode.NONE))
        assert server.logins == []
        allowed = check_smtp(check_settings(server.port, smtp_insecure_auth_without_tls=True))
        assert server.logins != []
    assert "WARNING: the AUTH password went in clear text" in allowed


def test_control_characters_in_an_address_never_reach_the_server(dev: DevSmtpServer) -> None:
    async def run() -> SmtpReply:
        async with SmtpPool(config(dev.port)) as pool:
            return await pool.send(make_message(), SENDER,
                                   "finance@example.com\r\nRCPT TO:<x@evil.test>")

    reply = run_client(run())
    assert (reply.stage, reply.code, reply.failure) == (Stage.LOCAL, None, Failure.BAD_MESSAGE)
    assert dev.connections == 0


def test_config_from_settings() -> None:
    settings = Settings(smtp_host="mail.example.com", smtp_port=587, smtp_tls=TlsMode.STARTTLS,
                        smtp_username="u", smtp_password=Secret("p"), smtp_concurrency=4)
    cfg = SmtpConfig.from_settings(settings)
    assert (cfg.host, cfg.port, cfg.tls, cfg.username, cfg.concurrency) == (
        "mail.example.com", 587, TlsMode.STARTTLS, "u", 4)
    assert "p'" not in repr(cfg)


# --- internationalised addresses (issue 10)


class Recording:
    """An aiosmtpd server of the test's own that keeps each envelope and message, with or
    without SMTPUTF8."""

    def __init__(self, *, smtputf8: bool) -> None:
        from aiosmtpd.controller import Controller

        self.received: list[tuple[str, list[str], bytes]] = []
        outer = self

        class Handler:
            async def handle_DATA(self, server: object, session: object, envelope: Any) -> str:
                outer.received.append((envelope.mail_from, list(envelope.rcpt_tos),
                                       envelope.original_content))
                return "250 OK"

        self.port = free_port()
        self.controller = Controller(Handler(), hostname="127.0.0.1", port=self.port,
                                     enable_SMTPUTF8=smtputf8)

    def __enter__(self) -> Recording:
        self.controller.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.controller.stop()


def send_built(port: int, recipient: str, sender: str = SENDER) -> SmtpReply:
    """Build the message as the sender does and send it."""
    import datetime as dt

    from postroom.schemas.codec import EmailRequested
    from postroom.sender.message import build_message

    event = EmailRequested(idempotency_key="k|" + recipient, message_key="k", outbox_id=1,
                           recipient=recipient, sender=sender, subject="Grüße", body="b",
                           attachments=(), priority="normal", created_at=dt.datetime.now(dt.UTC))
    message = build_message(event, attachments_root=None, now=dt.datetime.now(dt.UTC))

    async def run() -> SmtpReply:
        async with SmtpPool(config(port, tls=TlsMode.NONE)) as pool:
            return await pool.send(message, sender, recipient)

    return run_client(run())


@pytest.mark.parametrize("smtputf8", [True, False])
def test_a_non_ascii_domain_goes_out_as_idna_without_needing_smtputf8(smtputf8: bool) -> None:
    with Recording(smtputf8=smtputf8) as server:
        reply = send_built(server.port, "user@bücher.example")
    assert (reply.stage, reply.code) == (Stage.DATA, 250)
    [(_, rcpts, content)] = server.received
    assert rcpts == ["user@xn--bcher-kva.example"]
    assert b"\r\nTo: user@xn--bcher-kva.example\r\n" in content


def test_a_non_ascii_local_part_is_sent_with_smtputf8() -> None:
    with Recording(smtputf8=True) as server:
        reply = send_built(server.port, "josé@example.com")
    assert (reply.stage, reply.code) == (Stage.DATA, 250)
    [(_, rcpts, content)] = server.received
    assert rcpts == ["josé@example.com"]
    assert "To: josé@example.com".encode() in content


def test_a_non_ascii_local_part_is_refused_clearly_without_smtputf8() -> None:
    with Recording(smtputf8=False) as server:
        reply = send_built(server.port, "josé@example.com")
    assert (reply.failure, reply.text) == (
        Failure.BAD_MESSAGE, "a non-ASCII address needs SMTPUTF8, which the server does not offer")
    assert server.received == []


BOUNCE_SECRET = b"0123456789abcdef-secret"


def send_with_return_path(port: int, sender: str, kind: str) -> SmtpReply:
    """Send an email from ``sender`` as the sender does with POSTROOM_BOUNCE_ADDRESS set: the
    envelope sender is the ASCII return path, the From header ``sender``; ``kind`` says whether
    the bytes come from a template (Delivery's choice for an email without files) or a full
    build."""
    import datetime as dt

    from postroom.schemas.codec import EmailRequested
    from postroom.sender.delivery import Delivery
    from postroom.sender.message import build_message

    now = dt.datetime.now(dt.UTC)
    event = EmailRequested(idempotency_key="k|finance@example.com", message_key="k",
                           outbox_id=7, recipient="finance@example.com", sender=sender,
                           subject="S", body="b", attachments=(), priority="normal",
                           created_at=now)
    delivery = Delivery("postroom@example.com", None, 30.0,
                        bounce_address="bounces@bounce.example.com", bounce_secret=BOUNCE_SECRET)

    async def run() -> SmtpReply:
        async with SmtpPool(config(port, tls=TlsMode.NONE)) as pool:
            if kind == "templated":
                async with pool.slot() as slot:
                    reply, _ = await delivery.send(event, slot, now)
                    return reply
            return_path, _ = delivery.envelope_sender(event, now)
            return await pool.send(build_message(event, attachments_root=None, now=now),
                                   return_path, event.recipient)

    return run_client(run())


@pytest.mark.parametrize("kind", ["templated", "built"])
def test_a_non_ascii_from_needs_smtputf8_under_an_ascii_return_path(kind: str) -> None:
    """The return path is ASCII, so the envelope alone said no SMTPUTF8 was needed, and the
    From went out as ``=?utf-8?q?jos=C3=A9?=@example.com`` (issue 24's review)."""
    with Recording(smtputf8=True) as server:
        reply = send_with_return_path(server.port, "josé@example.com", kind)
    assert (reply.stage, reply.code) == (Stage.DATA, 250)
    [(mail_from, _, content)] = server.received
    assert mail_from.startswith("bounces+") and mail_from.isascii()
    assert "From: josé@example.com\r\n".encode() in content
    assert b"=?utf-8?" not in content.split(b"\r\n\r\n")[0].lower()


@pytest.mark.parametrize("kind", ["templated", "built"])
def test_a_non_ascii_from_is_refused_clearly_without_smtputf8(kind: str) -> None:
    with Recording(smtputf8=False) as server:
        reply = send_with_return_path(server.port, "josé@example.com", kind)
    assert (reply.failure, reply.text) == (
        Failure.BAD_MESSAGE, "a non-ASCII address needs SMTPUTF8, which the server does not offer")
    assert server.received == []


@pytest.mark.parametrize("kind", ["templated", "built"])
def test_a_from_with_a_non_ascii_name_or_domain_needs_no_smtputf8(kind: str) -> None:
    with Recording(smtputf8=False) as server:
        reply = send_with_return_path(server.port, "José Núñez <reports@bücher.example>", kind)
    assert (reply.stage, reply.code) == (Stage.DATA, 250)
    [(_, _, content)] = server.received
    assert b"<reports@xn--bcher-kva.example>" in content


def send_to_a_server_that_answers_groups(**changes: object) -> SmtpReply:
    """Send one email to a server that answers MAIL, RCPT and DATA only once it holds all three:
    only a pipelining client gets through; one that waits for each reply times out at MAIL."""

    async def session(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        offer = "250-PIPELINING\r\n" if _servers_pipeline[0] else ""
        writer.write(b"220 groups ESMTP\r\n")
        held: list[str] = []
        try:
            while line := await reader.readline():
                command = line.decode().strip().upper()
                if command.startswith("EHLO"):
                    writer.write(f"250-groups\r\n{offer}250 8BITMIME\r\n".encode())
                elif command.startswith(("MAIL", "RCPT")):
                    held.append("250 2.1.0 Ok\r\n")
                elif command == "DATA":
                    writer.write("".join([*held, "354 go ahead\r\n"]).encode())
                    held.clear()
                    while await reader.readline() != b".\r\n":
                        pass
                    writer.write(b"250 2.0.0 queued as G1\r\n")
                elif command == "QUIT":
                    writer.write(b"221 bye\r\n")
                    break
                await writer.drain()
        finally:
            writer.close()

    async def run() -> SmtpReply:
        server = await asyncio.start_server(session, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            cfg = config(port, **{"tls": TlsMode.NONE, "timeout_s": 1.0, **changes})
            async with SmtpPool(cfg) as pool:
                return await pool.send(make_message(), SENDER, "finance@example.com")
        finally:
            server.close()
            await server.wait_closed()

    return run_client(run())


def test_pipelining_is_used_exactly_when_the_server_offers_it() -> None:
    reply = send_to_a_server_that_answers_groups()
    if _servers_pipeline[0]:
        assert (reply.stage, reply.code) == (Stage.DATA, 250)
    else:
        assert (reply.stage, reply.failure) == (Stage.MAIL_FROM, Failure.TIMEOUT)


def test_pipelining_off_waits_for_each_reply_even_when_offered() -> None:
    reply = send_to_a_server_that_answers_groups(pipelining=False)
    assert (reply.stage, reply.failure) == (Stage.MAIL_FROM, Failure.TIMEOUT)


# --- a server whose replies are broken bytes (issue 23): each attempt is classified, the pool goes on


DRIP_S = 0.2  # between the bytes of a dripped reply; the client's reply timeout is 1 s
Hostile = tuple[str, bytes]  # the command it answers ("RCPT", "<content>", "greeting"), the bytes


def run_hostile(hostile: Hostile, *, drip: bool = False) -> list[SmtpReply]:
    """Send to ``bad@example.com`` and then ``good@example.com`` through one pool, on a server that
    answers the bad recipient's ``hostile[0]`` with the raw bytes ``hostile[1]`` (a byte every
    DRIP_S with ``drip``), and everything else as a server should."""
    where, answer = hostile
    mails = 0

    async def session(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        offer = b"250-PIPELINING\r\n" if _servers_pipeline[0] else b""
        rcpt = ""

        async def say(data: bytes) -> None:
            if drip:
                for i in range(len(data)):
                    writer.write(data[i:i + 1])
                    await writer.drain()
                    await asyncio.sleep(DRIP_S)
            else:
                writer.write(data)
                await writer.drain()

        try:
            if where == "greeting":
                await say(answer + b"\r\n")
            else:
                writer.write(b"220 hostile ESMTP\r\n")
            while line := await reader.readline():
                command = line.decode("ascii", "replace").strip()
                verb = command.split(" ", 1)[0].upper()
                nonlocal mails
                if verb == "MAIL":
                    mails, rcpt = mails + 1, ""
                if verb == "RCPT":
                    rcpt = command
                bad = "bad@" in rcpt or (verb == "MAIL" and mails == 1)
                if verb == "DATA":
                    if "bad@" in rcpt and where == "RCPT":
                        writer.write(b"554 5.5.1 no valid recipients\r\n")
                        continue
                    if bad and where == "DATA":
                        await say(answer + b"\r\n")
                        continue
                    writer.write(b"354 go ahead\r\n")
                    while await reader.readline() not in (b".\r\n", b""):
                        pass
                    if bad and where == "<content>":
                        await say(answer + b"\r\n")
                    else:
                        writer.write(b"250 2.0.0 queued\r\n")
                    continue
                if bad and verb == where:
                    await say(answer + b"\r\n")
                elif verb == "EHLO":
                    writer.write(b"250-hostile\r\n" + offer + b"250 8BITMIME\r\n")
                elif verb == "QUIT":
                    writer.write(b"221 bye\r\n")
                    break
                else:
                    writer.write(b"250 2.1.0 Ok\r\n")
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def run() -> list[SmtpReply]:
        server = await asyncio.start_server(session, "127.0.0.1", 0, limit=1 << 20)
        port = server.sockets[0].getsockname()[1]
        try:
            cfg = config(port, tls=TlsMode.NONE, timeout_s=1.0, connect_timeout_s=1.0)
            async with SmtpPool(cfg) as pool:
                first = await pool.send(make_message("bad@example.com"), SENDER, "bad@example.com")
                await asyncio.sleep(0.05)  # let a closing server's EOF arrive
                return [first, await pool.send(make_message("good@example.com"), SENDER,
                                               "good@example.com")]
        finally:
            server.close()
            await server.wait_closed()

    return run_client(run())


@pytest.mark.parametrize(("hostile", "stage", "verdict"), [
    (("RCPT", b"451 4.3.0 try\x00again later"), Stage.RCPT_TO, Verdict.TRANSIENT),
    (("RCPT", b"451 4.3.0 \xff\xfe\xc3( later"), Stage.RCPT_TO, Verdict.TRANSIENT),
    (("RCPT", b"550 5.1.1 " + b"x" * 100_000), Stage.RCPT_TO, Verdict.TRANSIENT),  # too long
    (("RCPT", b"451-4.3.0 first\r\n451-\xff\x00\xfe\r\n451 4.3.0 last"), Stage.RCPT_TO,
     Verdict.TRANSIENT),
    (("RCPT", b"550-5.1.1 first\r\n550 5.1.1 \x00 unknown"), Stage.RCPT_TO, Verdict.PERMANENT),
    (("RCPT", b"\xff\xfe\x00 no code at all"), Stage.RCPT_TO, Verdict.TRANSIENT),
    (("RCPT", b"2_5 underscores"), Stage.RCPT_TO, Verdict.TRANSIENT),
    (("<content>", b"250 2.0.0 Ok \xff\xfe\x00 queued"), Stage.DATA, Verdict.SENT),
    (("<content>", b"250-2.0.0 Ok\r\n250 \xc3(\x00"), Stage.DATA, Verdict.SENT),
    (("<content>", b"250-" + b"y" * 9000 + b"\r\n250 z"), Stage.DATA, Verdict.TRANSIENT),
    (("MAIL", b"999 \x00"), Stage.MAIL_FROM, Verdict.TRANSIENT),
    # A 2xx where the dialogue allows none: the message was not taken, whatever the code says.
    (("RCPT", b"252 2.1.5 cannot verify, will try"), Stage.RCPT_TO, Verdict.TRANSIENT),
    (("DATA", b"250 2.0.0 no need for the message"), Stage.DATA, Verdict.TRANSIENT),
    # The reply to the message judged by its first digit: a 251 there is a delivery, and sent
    # again it would arrive again (it was taken as out of turn, and retried up to the last tier).
    (("<content>", b"251 2.0.0 queued elsewhere"), Stage.DATA, Verdict.SENT),
    (("greeting", b"\x00\x00\x00 hello"), Stage.CONNECT, Verdict.TRANSIENT),
], ids=lambda v: v[0] if isinstance(v, tuple) else str(v))
def test_a_broken_reply_is_classified_and_the_pool_goes_on(hostile: Hostile, stage: Stage,
                                                          verdict: Verdict) -> None:
    bad, good = run_hostile(hostile)
    outcome = classify_reply(bad)
    assert (bad.stage, outcome.verdict) == (stage, verdict)
    assert outcome.reason.isprintable() and len(outcome.reason) <= REASON_MAX_CHARS
    if hostile[0] != "greeting":
        assert (good.stage, good.code) == (Stage.DATA, 250)


def test_a_reply_dripped_a_byte_at_a_time_times_out_within_the_reply_timeout() -> None:
    # 28 bytes at 0.2 s: the reply would be whole after 5.6 s; the timeout is 1 s from its start.
    bad, good = run_hostile(("<content>", b"250 2.0.0 queued, slowly..."), drip=True)
    assert (bad.stage, bad.failure) == (Stage.DATA, Failure.TIMEOUT)
    assert classify_reply(bad).verdict is Verdict.TRANSIENT
    assert (good.stage, good.code) == (Stage.DATA, 250)


def test_check_names_the_settings_and_the_address_it_could_not_reach() -> None:
    from postroom.errors import PostroomError
    from postroom.sender.smtp import check_smtp

    port = free_port()  # nothing listens there
    with pytest.raises(PostroomError) as raised:
        check_smtp(Settings(smtp_host="127.0.0.1", smtp_port=port, smtp_connect_timeout_s=5.0))
    said = str(raised.value)
    assert said.startswith(f"connect: refused at 127.0.0.1:{port} "
                           "(POSTROOM_SMTP_HOST, POSTROOM_SMTP_PORT): ")
    assert "('127.0.0.1'" not in said
