"""What the commands share: exit codes, the migrated database engine, and ISO times as arguments."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
from collections.abc import Iterator
from typing import TYPE_CHECKING, TypeAlias

from postroom.settings import Settings

if TYPE_CHECKING:  # imported by the commands that use the database, not by every start
    import sqlalchemy as sa

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports it


@contextlib.contextmanager
def migrated_engine(settings: Settings) -> Iterator[sa.Engine]:
    """The database engine once its schema is at the newest revision; disposed after."""
    from postroom.relay.db import check_schema, make_engine

    engine = make_engine(settings)
    try:
        check_schema(engine)
        yield engine
    finally:
        engine.dispose()


def iso_datetime(text: str) -> dt.datetime:
    """An ISO 8601 time with a timezone, as an argparse type."""
    try:
        value = dt.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO 8601 time: {text!r}") from None
    if value.tzinfo is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} has no timezone; add one, e.g. {text}+00:00")
    try:
        value.astimezone(dt.UTC)
    except OverflowError:  # 0001-01-01T00:00+14:00 is in year 0 in UTC
        raise argparse.ArgumentTypeError(f"{text!r} is out of range in UTC") from None
    return value


# What build_parser's add_subparsers returns: each command group adds its commands to it.
Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
