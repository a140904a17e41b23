"""How postroom writes its log: one line per record, whatever the values in it hold.

Keys, addresses, subjects and server replies come from jobs, events and servers; a value holding a
line break could forge a whole log line. Every record's message is escaped once it is formatted,
and the credentials of any URL in it starred.
"""

from __future__ import annotations

import logging
import sys
import time

from postroom.settings_kafka import mask_urls

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Libraries whose INFO lines are their requests (httpx: one per registry call, 404s included) or
# their steps (alembic): WARNING and above only, whatever the level.
QUIET_LIBRARIES = ("alembic", "httpx", "httpcore")
_CALLER_FIELDS = ("pathname", "filename", "module", "funcName", "lineno")


def escape_unprintable(text: str) -> str:
    """``text`` with every non-printable character (line breaks, controls, U+2028, ...) written
    as a Python escape, so it stays on one line and shows what it held."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                   for c in text)


class EscapingFilter(logging.Filter):
    """Formats each record's message with its arguments and escapes it (tracebacks keep their
    lines: they are added by the formatter after this), the credentials of any URL in it starred
    (a library's line may name a URL as it was configured). The record keeps the formatted
    message without arguments, so the formatter does not format it again."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = mask_urls(escape_unprintable(record.getMessage())), None
        return True


class SecondCachingFormatter(logging.Formatter):
    """logging.Formatter whose default time stamp is formatted once per second: every line of
    that second shares it (a sender logs a line per email, and strftime was 1% of its CPU)."""

    def __init__(self, fmt: str | None = None) -> None:
        super().__init__(fmt)
        self._second: tuple[int, str] = (-1, "")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        if datefmt is not None:
            return super().formatTime(record, datefmt)
        whole = int(record.created)
        second, text = self._second
        if second != whole:
            text = time.strftime(self.default_time_format, self.converter(whole))
            self._second = (whole, text)
        return f"{text},{int(record.msecs):03d}"  # logging's default_msec_format


def configure_logging(level: str | int, fmt: str = LOG_FORMAT) -> None:
    """Log to stderr at ``level``, every message escaped; the one place logging is set up.

    A record does not gather what ``fmt`` does not show: where it was logged from (a walk up the
    stack), its thread and its process. That is the logging HOWTO's "Optimization" section; a
    sender logs a line per email, and the walk alone was 0.5% of its CPU.
    """
    if not any(f"%({field})" in fmt for field in _CALLER_FIELDS):
        logging._srcfile = None
    logging.logThreads = "%(thread" in fmt
    logging.logProcesses = "%(process)" in fmt
    logging.logMultiprocessing = "%(processName)" in fmt
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(SecondCachingFormatter(fmt))
    handler.addFilter(EscapingFilter())
    logging.basicConfig(level=level, handlers=[handler], force=True)
    for name in QUIET_LIBRARIES:
        logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLogger().level))


def command_level(level: str | int) -> int:
    """The level of a command a person runs: its result is its output, so INFO (a role's running
    log) is raised to WARNING; DEBUG stays DEBUG, for whoever asks for it."""
    number = logging.getLevelName(level) if isinstance(level, str) else level
    return logging.WARNING if number == logging.INFO else int(number)


def set_level(level: str | int) -> None:
    """Log at ``level`` from now on (a role, once it starts, logs at POSTROOM_LOG_LEVEL)."""
    logging.getLogger().setLevel(level)
