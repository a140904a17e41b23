"""Errors shared by every postroom component; each class's docstring is its default message."""

from __future__ import annotations


class PostroomError(Exception):
    """postroom failed."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class ConfigError(PostroomError):
    """A setting is missing or malformed."""

    def __init__(self, setting: str, problem: str) -> None:
        self.setting = setting
        super().__init__(f"{setting}: {problem}")


class KafkaClientError(PostroomError):
    """Kafka refused or failed a request."""

    def __init__(self, message: str, *, code: str | None = None, retriable: bool = False) -> None:
        self.code = code
        self.retriable = retriable
        super().__init__(f"{message} [{code}]" if code else message)
