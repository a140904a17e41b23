"""librdkafka's fatal state: a client fenced as a static group member (another took its
``group.instance.id``) or an idempotent producer that lost its guarantees can never work again.
The clients built here note the first such error of the process and raise it as ours; a role's
loop exits on it and its readiness says so until then (docs/operations.md)."""

from __future__ import annotations

import contextlib
import threading
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer

from postroom.errors import KafkaFatalError


class FatalState:
    """The first fatal client error of this process, if any (each role runs in its own)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._error: KafkaFatalError | None = None

    @property
    def error(self) -> KafkaFatalError | None:
        return self._error

    def note(self, err: KafkaError, client: str) -> KafkaFatalError:
        """Keep ``err`` unless an earlier fatal error is kept; the error kept."""
        with self._lock:
            if self._error is None:
                self._error = KafkaFatalError(
                    f"the Kafka {client} is in a fatal state and cannot work again "
                    f"({err.str()}); exiting so that the role is started afresh",
                    code=err.name())
            return self._error


FATAL = FatalState()


def is_fatal(err: object) -> bool:
    """Whether ``err`` (a KafkaError, or a KafkaException carrying one) is librdkafka's fatal
    state: flagged fatal, or ``_FATAL`` (what a client in that state answers every call)."""
    if isinstance(err, KafkaException) and err.args:
        err = err.args[0]
    return isinstance(err, KafkaError) and (err.fatal() or err.code() == KafkaError._FATAL)


def raise_if_fatal() -> None:
    """KafkaFatalError when a client of this process is in its fatal state."""
    error = FATAL.error
    if error is not None:
        raise error


def fatal_check() -> str:
    """A readiness check: raises the fatal error, if one came."""
    raise_if_fatal()
    return "no client in a fatal state"


def _raised(exc: KafkaException, client: str) -> KafkaException | KafkaFatalError:
    err = exc.args[0] if exc.args else None
    if isinstance(err, KafkaError) and is_fatal(err):
        return FATAL.note(err, client)
    return exc


class WatchedProducer(Producer):
    """A Producer whose fatal error (raised once by ``poll`` or ``flush``, then ``_FATAL`` by
    every ``produce``) is noted and raised as KafkaFatalError; anything else as before."""

    def produce(self, *args: Any, **kwargs: Any) -> None:
        try:
            super().produce(*args, **kwargs)
        except KafkaException as exc:
            if FATAL.error is None and is_fatal(exc):
                # "_FATAL" says only that the client is in that state; the poll that serves
                # the state's error raises its cause (a fenced epoch, say), kept instead.
                with contextlib.suppress(KafkaException, KafkaFatalError):
                    self.poll(0)
            raise _raised(exc, "producer") from exc

    def poll(self, timeout: float = -1) -> int:
        try:
            return super().poll(timeout)
        except KafkaException as exc:
            raise _raised(exc, "producer") from exc

    def flush(self, timeout: float = -1) -> int:
        try:
            return super().flush(timeout)
        except KafkaException as exc:
            raise _raised(exc, "producer") from exc


class WatchedConsumer(Consumer):
    """A group member whose fatal error (a message whose error is ``_FATAL``, as a fenced
    static member reads) is noted and raised as KafkaFatalError from ``consume`` and ``poll``;
    the messages read with it are read again by the group's next owner."""

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        try:
            messages = super().consume(num_messages, timeout)
        except KafkaException as exc:
            raise _raised(exc, "consumer") from exc
        for message in messages:
            _check(message)
        return messages

    def poll(self, timeout: float = -1) -> Message | None:
        try:
            message = super().poll(timeout)
        except KafkaException as exc:
            raise _raised(exc, "consumer") from exc
        if message is not None:
            _check(message)
        return message


def _check(message: Message) -> None:
    err = message.error()
    if err is not None and is_fatal(err):
        raise FATAL.note(err, "consumer")
