"""Errors shared by every postroom component; each class's docstring is its default message."""

from __future__ import annotations


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
