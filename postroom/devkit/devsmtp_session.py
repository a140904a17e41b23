"""aiosmtpd's SMTP session and controller as the dev SMTP server subclasses them: the session
tells its handler when a connection comes and goes and takes RFC 3461's parameters when DSN is
offered; the controller learns the port the OS picked for port 0.

The handler (what the server answers and keeps) is postroom.devkit.devsmtp_handler's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP

DSN_PARAMETERS = ("RET", "ENVID", "NOTIFY", "ORCPT")  # RFC 3461's, taken when DSN is offered


class DevSMTP(SMTP):
    """aiosmtpd's SMTP session, telling the handler when a connection comes and goes."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        first = self.transport is None  # aiosmtpd calls this again after STARTTLS
        super().connection_made(transport)
        if first:
            self.event_handler.opened(self)

    def connection_lost(self, error: Exception | None) -> None:
        super().connection_lost(error)
        self.event_handler.closed(self)

    def _getparams(self, params: Sequence[str]) -> dict[str, str | bool] | None:
        # aiosmtpd refuses parameters it does not know (555); offering DSN, take RFC 3461's,
        # which it keeps in the envelope's mail_options and rcpt_options.
        found = super()._getparams(params)
        if found is not None and self.event_handler.dsn:
            for name in DSN_PARAMETERS:
                found.pop(name, None)
        return found


class DevController(Controller):
    def factory(self) -> SMTP:
        return DevSMTP(self.handler, loop=self.loop, **self.SMTP_kwargs)

    def _trigger_server(self) -> None:
        # With port 0 the OS picks the port; learn it before aiosmtpd probes the server.
        if self.port == 0 and isinstance(self.server, asyncio.Server):
            self.port = self.server.sockets[0].getsockname()[1]
        super()._trigger_server()  # type: ignore[no-untyped-call]

