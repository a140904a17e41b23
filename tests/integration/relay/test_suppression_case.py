"""The suppression list folds case as the database does, the one place every path compares it:
an operator's entry for a non-ASCII address stops the relay's row to it, and is removed by any
spelling the database folds to the same address."""

from __future__ import annotations

import sqlalchemy as sa

from postroom.relay import suppression

ADDRESS = "JOSÉ@Example.COM"


def test_an_entry_is_held_as_the_database_lowers_it_and_matches_the_relays_compare(
        engine: sa.Engine) -> None:
    with engine.begin() as conn:
        entry = suppression.add(conn, ADDRESS, "left", 3600)
        lowered = conn.execute(sa.text("SELECT lower(:a)"), {"a": ADDRESS}).scalar_one()
        assert entry.address == lowered
        # The relay's test of a row (relay/sql/publish.py): the entry against lower(recipient).
        assert conn.execute(sa.text("SELECT EXISTS (SELECT 1 FROM suppression "
                                    "WHERE address = lower(:r))"), {"r": ADDRESS}).scalar_one()
    with engine.begin() as conn:
        assert suppression.remove(conn, "josÉ@example.com") == lowered
        assert [e.address for e in suppression.entries(conn)] == []
