"""Builds one event's message and sends it through a held SMTP slot within the send's deadline.

An email without files whose To and Message-ID lines are plain ASCII is rendered from its
report's template (:mod:`postroom.sender.render`); any other is built in full.

Every way an attempt can end comes back as an :class:`~sender.outcome.SmtpReply`: the server's,
or a local one standing in for it (no attachments root, an unreadable attachment, a header that
would be unsafe, the deadline passed).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import logging
from collections.abc import Callable
from pathlib import Path

from postroom.errors import ConfigError, PostroomError
from postroom.rules import SizeLimits
from postroom.schemas.codec import EmailRequested
from postroom.sender.attachments import attachments_refusal
from postroom.sender.claims import send_deadline_s
from postroom.sender.errors import AttachmentError
from postroom.sender.message import build_message, check_header_values
from postroom.sender.outcome import Failure, SmtpReply, Stage
from postroom.sender.render import Built, Payload, TemplateCache, Templated, plain_lines
from postroom.sender.smtp import SmtpSlot
from postroom.sender.template import TemplateError
from postroom.settings import Settings
from postroom.verp import make_token, return_path

log = logging.getLogger(__name__)


class AttachmentsOffWarning(PostroomError):
    """POSTROOM_ATTACHMENTS_ROOT is not set."""


ATTACHMENTS_OFF = ("POSTROOM_ATTACHMENTS_ROOT is not set: emails with attachments or inline "
                   "images wait on the retry tiers, not sent, until it names the directory they "
                   "are written under and the sender is restarted")


def check_attachments(settings: Settings) -> str:
    """What ``postroom check`` says of the attachments root: the directory it is, ConfigError
    when it is none, AttachmentsOffWarning (a warning, not a failure) when it is not set."""
    if settings.attachments_root is None:
        raise AttachmentsOffWarning(ATTACHMENTS_OFF)
    if not settings.attachments_root.is_dir():
        raise ConfigError("POSTROOM_ATTACHMENTS_ROOT",
                          f"not a directory: {settings.attachments_root}")
    return f"the sender reads attachments below {settings.attachments_root}"


@dataclasses.dataclass(frozen=True)
class Delivery:
    """How the sender delivers: the default sender address, the attachments root, the deadline,
    and with a bounce address, each email's own return path (VERP) signed with ``bounce_secret``."""

    mail_from: str
    attachments_root: Path | None
    deadline_s: float
    limits: SizeLimits = dataclasses.field(default_factory=SizeLimits)
    templates: TemplateCache = dataclasses.field(default_factory=TemplateCache)
    bounce_address: str | None = None  # None: the envelope sender is the From address
    bounce_secret: bytes = dataclasses.field(default=b"", repr=False)
    # Whether the missing root was logged: once per sender, the metric counts every email.
    _root_missing_said: list[bool] = dataclasses.field(default_factory=list, repr=False,
                                                       compare=False)

    @classmethod
    def from_settings(cls, settings: Settings) -> Delivery:
        """The sender's delivery as the settings give it; the first bounce secret signs."""
        return cls(settings.mail_from, settings.attachments_root, send_deadline_s(settings),
                   settings.size_limits(), bounce_address=settings.bounce_address,
                   bounce_secret=settings.bounce_secrets[0] if settings.bounce_secrets else b"")

    def envelope_sender(self, event: EmailRequested, now: dt.datetime) -> tuple[str, str | None]:
        """The MAIL FROM address of ``event`` (whose sender is set) and the DSN envelope id to
        ask for: its From address and None without a bounce address; else its return path
        ``bounces+<token>@...`` and the token. ValueError when no token can name its row."""
        if self.bounce_address is None:
            return event.sender, None
        token = make_token(event.outbox_id, self.bounce_secret, now)
        return return_path(self.bounce_address, token), token

    async def send(self, event: EmailRequested, slot: SmtpSlot, now: dt.datetime,
                   on_accepted: Callable[[str], None] | None = None) -> tuple[SmtpReply, str]:
        """The reply to ``event``'s one send, and its Message-ID ("" when none was built).
        ``on_accepted`` is given the Message-ID as soon as the server's 250 is read; a 250 read
        as the deadline passes is still the reply."""
        sender = event.sender or self.mail_from
        event = event.with_sender(sender)
        refusal = attachments_refusal(event, self.attachments_root)
        if refusal is not None:
            if not self._root_missing_said:
                self._root_missing_said.append(True)
                log.error("key=%s has attachments or inline images and POSTROOM_ATTACHMENTS_ROOT "
                          "is not set: set it to the directory they are written under and "
                          "restart the sender; until then such emails wait on the retry tiers, "
                          "not counted as attempts (postroom_attachments_waiting_total)",
                          event.idempotency_key)
            return SmtpReply(Stage.LOCAL, None, refusal, Failure.CONFIG), ""
        try:
            envelope_sender, envid = self.envelope_sender(event, now)
        except ValueError as exc:
            return SmtpReply(Stage.LOCAL, None, f"no return path for this email: {exc}",
                             Failure.BAD_MESSAGE), ""
        try:
            message = await self._payload(event, now)
        except (AttachmentError, ValueError) as exc:
            return SmtpReply(Stage.LOCAL, None, str(exc), Failure.BAD_MESSAGE), ""
        message_id = message.message_id
        accepted: list[tuple[int, str]] = []  # the 250, kept for a deadline that passes after it

        def on_reply(code: int, text: str) -> None:
            accepted.append((code, text))
            if on_accepted is not None:
                on_accepted(message_id)

        try:
            async with asyncio.timeout(self.deadline_s):
                if envid is None:
                    return await slot.send(message, sender, event.recipient, on_reply), message_id
                return await slot.send(message, envelope_sender, event.recipient, on_reply,
                                       dsn_envid=envid), message_id
        except TimeoutError:
            if accepted:
                return SmtpReply(Stage.DATA, *accepted[0]), message_id
            return SmtpReply(Stage.LOCAL, None, f"the send took longer than its deadline of "
                             f"{self.deadline_s:.0f}s", Failure.TIMEOUT), message_id

    async def _payload(self, event: EmailRequested, now: dt.datetime) -> Payload:
        if event.attachments or event.inline:
            # Reading files blocks: a worker thread does it, never the event loop.
            return Built(await asyncio.to_thread(build_message, event, now=now,
                                                 attachments_root=self.attachments_root,
                                                 limits=self.limits))
        lines = plain_lines(event, now)
        if lines is not None:
            check_header_values(event)
            # Built, serialised and checked now when it is not cached, so a bad subject or body
            # kept in the template fails here as in a full build (one in a hole passed
            # check_header_values and own_of's patterns); the variant a server needs (7-bit,
            # SMTPUTF8) at the send.
            try:
                self.templates.get(event, utf8=False, eight_bit=True, own=lines.own)
                return Templated(event, lines, self.templates)
            except TemplateError:  # no template of these holes: built in full, as below
                pass
        # No file to read: a thread hop per email would only cost.
        return Built(build_message(event, now=now, attachments_root=self.attachments_root,
                                   limits=self.limits))
