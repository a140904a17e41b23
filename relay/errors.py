"""Errors raised by the outbox and relay; each class's docstring is its default message."""

from __future__ import annotations

from postroom.errors import PostroomError


class EnqueueError(PostroomError):
    """The email could not be queued; nothing was written."""


class InvalidEmailError(EnqueueError):
    """An address, subject or body is not acceptable."""


class InvalidAttachmentError(EnqueueError):
    """An attachment path does not name a readable regular file within the size limit."""


class SchemaNotReadyError(PostroomError):
    """The outbox schema is missing or out of date: run `postroom db upgrade`."""


class UnsupportedDatabaseError(PostroomError):
    """The PostgreSQL server is older than postroom supports."""


class PoisonRowError(PostroomError):
    """An outbox row cannot become an event: it is marked failed, never published."""


class InvalidConnectionError(EnqueueError):
    """The connection given is not one enqueue writes through: a SQLAlchemy Connection or
    Session, a psycopg 3 Connection, or Django's connection to PostgreSQL with psycopg 3."""
