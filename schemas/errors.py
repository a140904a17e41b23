"""The contract's errors: a record that cannot be encoded or decoded, and one whose writer schema
cannot be had now."""

from __future__ import annotations

from postroom.errors import PostroomError


class SchemaError(PostroomError):
    """A record could not be encoded or decoded against the contract."""


class SchemaUnavailableError(SchemaError):
    """The writer schema of a record cannot be had now (the registry does not answer): the
    record is not unreadable, and is read again once it can be."""
