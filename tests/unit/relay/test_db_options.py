"""The libpq options and conninfo postroom's connections are opened with (relay/db.py)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from psycopg.conninfo import conninfo_to_dict

from postroom.relay.db import SERVER_KEEPALIVE_OPTIONS, libpq_conninfo, with_options


@pytest.mark.parametrize(("parts", "options"), [
    ((None, "-c a=1"), "-c a=1"),
    (("", "-c a=1", ""), "-c a=1"),
    (("-c a=1", "-c x=2"), "-c a=1 -c x=2"),
    (("-c a=1", ("-c x=2", "-c y=3")), "-c a=1 -c x=2 -c y=3"),
])
def test_options_keep_their_order(parts: tuple[str | tuple[str, ...] | None, ...],
                                  options: str) -> None:
    assert with_options(*parts) == options


@pytest.mark.parametrize(("url", "expected"), [
    ("postgresql+psycopg://u:p%20s%40s@h1:5433/db?application_name=my%20app"
     "&options=-c%20statement_timeout%3D5",
     {"user": "u", "password": "p s@s", "host": "h1", "port": "5433", "dbname": "db",
      "application_name": "my app",
      "options": f"{SERVER_KEEPALIVE_OPTIONS} -c statement_timeout=5"}),
    ("postgresql+psycopg://u@/db?host=h1:5432&host=h2:5433",
     {"user": "u", "host": "h1,h2", "port": "5432,5433", "dbname": "db",
      "options": SERVER_KEEPALIVE_OPTIONS}),
    ("postgresql+psycopg://u@/db?host=/run/postgresql",
     {"user": "u", "host": "/run/postgresql", "dbname": "db", "options": SERVER_KEEPALIVE_OPTIONS}),
])
def test_the_libpq_conninfo_says_what_the_engine_connects_with(
        url: str, expected: dict[str, str]) -> None:
    # Written out as a URL again, a space came out as "+", which libpq keeps, and hosts given
    # in the query as the last of them only.
    assert conninfo_to_dict(libpq_conninfo(sa.create_engine(url))) == expected
