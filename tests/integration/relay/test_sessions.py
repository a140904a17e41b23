"""Every session postroom opens asks the server to notice a peer that stopped answering within
seconds (relay.db.SERVER_KEEPALIVE_OPTIONS): the relay's claims and a sender's ledger claims are
kept by advisory locks that only the session's end frees."""

from __future__ import annotations

import dataclasses
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from postroom.relay.connections import Connections
from postroom.relay.db import libpq_conninfo, make_engine
from postroom.sender.ledger_session import ledger_conninfo
from postroom.settings import Settings

pytestmark = pytest.mark.integration

SETTINGS = ("tcp_keepalives_idle", "tcp_keepalives_interval", "tcp_keepalives_count",
            "statement_timeout", "search_path", "enable_seqscan")
READ = "SELECT name, setting FROM pg_settings WHERE name = ANY(%(names)s) ORDER BY name"
# The URL's own options come after postroom's: its count wins.
KEEPALIVE = {"tcp_keepalives_count": "4", "tcp_keepalives_idle": "10",
             "tcp_keepalives_interval": "5"}


def _read(execute: Any) -> dict[str, str]:
    return dict(execute(READ, {"names": list(SETTINGS)}))


def _on_engine(engine: sa.Engine) -> dict[str, str]:
    with engine.connect() as conn:
        return _read(lambda query, params: conn.exec_driver_sql(query, params).all())


def _on_conninfo(conninfo: str) -> dict[str, str]:
    with psycopg.connect(conninfo) as conn:
        return _read(lambda query, params: conn.execute(query, params).fetchall())


def test_the_sessions_of_an_engine_and_its_libpq_conninfo_keep_alive(
        db_settings: Settings) -> None:
    # The URL's own options stay, and may change postroom's.
    url = sa.make_url(db_settings.require("database_url")).update_query_dict(
        {"options": "-c statement_timeout=1234 -c tcp_keepalives_count=4"})
    settings = dataclasses.replace(db_settings, database_url=url.render_as_string(False))
    engine = make_engine(settings)
    try:
        on_engine = _on_engine(engine)
        assert {k: on_engine[k] for k in KEEPALIVE} == KEEPALIVE
        assert on_engine["statement_timeout"] == "1234"
        assert on_engine["search_path"] == settings.database_schema
        relay = Connections(engine)
        try:
            claims = _read(lambda query, params: relay.claims().exec_driver_sql(
                query, params).all())
            assert {k: claims[k] for k in KEEPALIVE} == KEEPALIVE
        finally:
            relay.close()
        listen = _on_conninfo(libpq_conninfo(engine))
        assert {k: listen[k] for k in KEEPALIVE} == KEEPALIVE
        assert listen["statement_timeout"] == "1234"
        ledger = _on_conninfo(ledger_conninfo(libpq_conninfo(engine), settings.database_schema))
        assert {k: ledger[k] for k in KEEPALIVE} == KEEPALIVE
        assert (ledger["statement_timeout"], ledger["search_path"], ledger["enable_seqscan"]) == (
            "1234", settings.database_schema, "off")
    finally:
        engine.dispose()
