"""Errors shared by every postroom component; each class's docstring is its default message."""

from __future__ import annotations

import re

REASON_MAX_CHARS = 1000  # a refusal's reason goes into a header, a log line and last_error
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")


def printable(text: str) -> str:
    """``text`` on one line, without control characters or lone surrogates, at most
    REASON_MAX_CHARS long: what a refusal says may quote what a record or a row held."""
    text = _UNPRINTABLE.sub("?", text)
    return text if len(text) <= REASON_MAX_CHARS else text[:REASON_MAX_CHARS - 3] + "..."


def first_line(exc: BaseException) -> str:
    """One line saying what went wrong: the first line of the error's text, taken from the
    driver's own error where a library wraps one (SQLAlchemy's ``orig``), else its type name."""
    text = str(getattr(exc, "orig", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class PostroomError(Exception):
    """postroom failed."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class ConfigError(PostroomError):
    """A setting is missing or malformed."""

    def __init__(self, setting: str, problem: str) -> None:
        self.setting = setting
        super().__init__(f"{setting}: {problem}")


class InvalidContentError(PostroomError, ValueError):
    """A part of an email (address, subject, key, body, attachment path) breaks postroom's rules."""


class UnsafeHeaderError(InvalidContentError):
    """A header would not say exactly what was meant: it holds a line break or would add headers."""


class KafkaClientError(PostroomError):
    """Kafka refused or failed a request."""

    def __init__(self, message: str, *, code: str | None = None, retriable: bool = False) -> None:
        self.code = code
        self.retriable = retriable
        super().__init__(f"{message} [{code}]" if code else message)


class KafkaFatalError(KafkaClientError):
    """A Kafka client is in librdkafka's fatal state (a fenced static group member, a fatal
    idempotent producer) and can never work again: the role exits, for its supervisor to
    start it afresh."""
