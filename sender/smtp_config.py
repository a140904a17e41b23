"""How the sender reaches and talks to its SMTP server: :class:`SmtpConfig`, read from the
settings, and what follows from it (whether STARTTLS is required, the TLS context).
"""

from __future__ import annotations

import dataclasses
import ssl
from pathlib import Path

from postroom.errors import ConfigError
from postroom.settings import Secret, Settings, TlsMode


@dataclasses.dataclass(frozen=True)
class SmtpConfig:
    """How to reach and talk to the SMTP server."""

    host: str
    port: int
    # The defaults are the settings' defaults, defined there once.
    tls: TlsMode = Settings.smtp_tls
    username: str | None = None
    password: Secret | None = None
    connect_timeout_s: float = Settings.smtp_connect_timeout_s
    timeout_s: float = Settings.smtp_timeout_s
    concurrency: int = Settings.smtp_concurrency
    local_hostname: str | None = None  # the EHLO name; None: this host's FQDN, looked up once
    tls_ca_file: Path | None = None    # extra CA certificates trusted besides the system's
    insecure_auth_without_tls: bool = Settings.smtp_insecure_auth_without_tls
    pipelining: bool = Settings.smtp_pipelining  # MAIL, RCPT, DATA as one group when offered

    @classmethod
    def from_settings(cls, settings: Settings) -> SmtpConfig:
        return cls(
            host=settings.smtp_host,
            port=settings.smtp_port,
            tls=settings.smtp_tls,
            username=settings.smtp_username,
            password=settings.smtp_password,
            connect_timeout_s=settings.smtp_connect_timeout_s,
            timeout_s=settings.smtp_timeout_s,
            concurrency=settings.smtp_concurrency,
            tls_ca_file=settings.smtp_tls_ca_file,
            insecure_auth_without_tls=settings.smtp_insecure_auth_without_tls,
            pipelining=settings.smtp_pipelining,
        )


def starttls_required(config: SmtpConfig) -> bool:
    """Whether a server without STARTTLS is refused: ``starttls`` says so, and ``auto`` does
    too when there is a password to protect, unless plain-text AUTH is explicitly allowed."""
    if config.tls is TlsMode.STARTTLS:
        return True
    return (config.tls is TlsMode.AUTO and config.username is not None
            and not config.insecure_auth_without_tls)



def tls_context(config: SmtpConfig) -> ssl.SSLContext:
    """A verifying client context: the system's CAs, plus ``tls_ca_file`` when set."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    if config.tls_ca_file is not None:
        try:
            context.load_verify_locations(cafile=config.tls_ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError("POSTROOM_SMTP_TLS_CA_FILE",
                              f"cannot load {config.tls_ca_file}: {exc}") from exc
    return context
