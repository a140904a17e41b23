"""One identity per mailbox: addresses with a non-ASCII domain spell it as its IDNA A-labels.

Revision ID: 0015

Enqueue now writes a row's recipient with its domain as postroom.rules.canonical_domain spells
it (UTS-46, then A-labels: ``GONE@BÜCHER.EXAMPLE`` is ``GONE@xn--bcher-kva.example``), and its
idempotency key ends with that address in lower case; suppression entries are held the same way.
Here the rows, entries and soft bounces stored before are rewritten so: those whose domain holds
a non-ASCII character, nothing else (an ASCII address keeps its spelling and its key). Only
Python can compute the spelling, so the rows are read and written back one by one.

- outbox: the recipient's domain; the key too, when it is the key enqueue wrote (the escaped
  message key, ``|``, the address in lower case) and its new form is free (two rows of one
  message to two spellings of one mailbox: the second keeps its key). The ids rewritten are kept
  in ``outbox_respelled_0015`` for the downgrade (ids only: no address outlives a purge).
- suppression: an entry moves to its new address; when that address has an entry already, the
  one that expires later stays (as a bounce extends an entry).
- soft_bounces: moved the same way; a row counted under both spellings counts once.

A domain UTS-46 refuses (a symbol, ``☃.example``, which IDNA 2003 took) is left as it is: the
relay refuses such a row as poison, ``suppression remove`` cannot name such an entry (purge
removes it when it expires). The downgrade writes the rewritten rows' domains back as U-labels
(in lower case: the key enqueue wrote for any case of it), their keys with them where free, and
gives each entry of an A-label domain a copy under its U-label spelling, so that a release before
0015, which compares the spelling as written, still stops both.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import idna
import sqlalchemy as sa
from alembic import op

from postroom.errors import InvalidContentError
from postroom.relay.validation import idempotency_key_prefix
from postroom.rules import canonical_domain

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

# A domain (what follows the last @) with a character outside ASCII: more bytes than characters.
_NON_ASCII_DOMAIN = ("octet_length(substring({column} FROM '[^@]*$')) "
                     "<> char_length(substring({column} FROM '[^@]*$'))")
_A_LABEL_DOMAIN = "substring({column} FROM '[^@]*$') ~* '(^|[.])xn--'"


def _respelled(address: str) -> str | None:
    """``address`` with its domain in its one spelling, or None when UTS-46 refuses it."""
    local, _, domain = address.rpartition("@")
    try:
        return f"{local}@{canonical_domain(domain)}"
    except InvalidContentError:
        return None


def _unicode(address: str) -> str | None:
    """``address`` with its domain's A-labels as U-labels (lower case), or None."""
    local, _, domain = address.rpartition("@")
    try:
        return f"{local}@{idna.decode(domain)}"
    except UnicodeError:
        return None


def _rekey(conn: sa.Connection, rows: Sequence[tuple[int, str, str]],
           spelled: Callable[[str], str | None]) -> list[int]:
    """Rewrite each (id, message key, recipient) of ``rows`` to ``spelled(recipient)`` (skipped
    when None), its key with it when the key is enqueue's for the old spelling and the new one
    is free (each statement sees the ones before it). The ids rewritten."""
    params: list[dict[str, Any]] = []
    for row_id, message_key, recipient in rows:
        new = spelled(recipient)
        if new is None or new == recipient:
            continue
        prefix = idempotency_key_prefix(message_key)
        params.append({"id": row_id, "new": new, "old_key": prefix + recipient.lower(),
                       "new_key": prefix + new.lower()})
    if params:
        conn.execute(sa.text("""
            UPDATE outbox AS o
            SET recipient = :new,
                idempotency_key = CASE
                    WHEN o.idempotency_key = :old_key AND NOT EXISTS (
                        SELECT 1 FROM outbox AS other WHERE other.idempotency_key = :new_key)
                    THEN :new_key ELSE o.idempotency_key END
            WHERE o.id = :id"""), params)
    return [p["id"] for p in params]


def upgrade() -> None:
    conn = op.get_bind()
    conn.execute(sa.text("CREATE TABLE outbox_respelled_0015 (id bigint PRIMARY KEY)"))
    rows = conn.execute(sa.text(f"""
        SELECT id, message_key, recipient FROM outbox
        WHERE {_NON_ASCII_DOMAIN.format(column="recipient")}
        ORDER BY id FOR UPDATE"""))
    done = _rekey(conn, [(r.id, r.message_key, r.recipient) for r in rows], _respelled)
    if done:
        conn.execute(sa.text("INSERT INTO outbox_respelled_0015 (id) "
                             "SELECT unnest(CAST(:ids AS bigint[]))"), {"ids": done})

    entries = conn.execute(sa.text(f"""
        SELECT address FROM suppression WHERE {_NON_ASCII_DOMAIN.format(column="address")}
        ORDER BY address FOR UPDATE""")).scalars().all()
    for address in entries:
        new = _respelled(address)
        if new is None:
            continue
        # lower() as SUPPRESSION_ADD holds an entry; the later expiry stays.
        conn.execute(sa.text("""
            WITH old AS (DELETE FROM suppression WHERE address = :old RETURNING *)
            INSERT INTO suppression AS s (address, reason, source, created_at, expires_at,
                                          updated_at)
            SELECT lower(:new), reason, source, created_at, expires_at, now() FROM old
            ON CONFLICT (address) DO UPDATE
                SET reason = excluded.reason, source = excluded.source,
                    created_at = excluded.created_at, expires_at = excluded.expires_at,
                    updated_at = now()
                WHERE s.expires_at < excluded.expires_at"""), {"old": address, "new": new})

    counted = conn.execute(sa.text(f"""
        SELECT DISTINCT address FROM soft_bounces
        WHERE {_NON_ASCII_DOMAIN.format(column="address")}""")).scalars().all()
    for address in counted:
        new = _respelled(address)
        if new is None:
            continue
        conn.execute(sa.text("""
            WITH old AS (DELETE FROM soft_bounces WHERE address = :old RETURNING *)
            INSERT INTO soft_bounces (address, outbox_id, occurred_at)
            SELECT lower(:new), outbox_id, occurred_at FROM old
            ON CONFLICT DO NOTHING"""), {"old": address, "new": new})


def downgrade() -> None:
    conn = op.get_bind()
    rows = conn.execute(sa.text("""
        SELECT o.id, o.message_key, o.recipient
        FROM outbox AS o JOIN outbox_respelled_0015 AS r USING (id)
        ORDER BY o.id FOR UPDATE OF o"""))
    _rekey(conn, [(r.id, r.message_key, r.recipient) for r in rows], _unicode)
    conn.execute(sa.text("DROP TABLE outbox_respelled_0015"))

    entries = conn.execute(sa.text(f"""
        SELECT address FROM suppression WHERE {_A_LABEL_DOMAIN.format(column="address")}
        ORDER BY address""")).scalars().all()
    for address in entries:
        spelled = _unicode(address)
        if spelled is None or spelled == address:
            continue
        conn.execute(sa.text("""
            INSERT INTO suppression AS s (address, reason, source, created_at, expires_at,
                                          updated_at)
            SELECT lower(:copy), reason, source, created_at, expires_at, now()
            FROM suppression WHERE address = :address
            ON CONFLICT (address) DO UPDATE
                SET reason = excluded.reason, source = excluded.source,
                    created_at = excluded.created_at, expires_at = excluded.expires_at,
                    updated_at = now()
                WHERE s.expires_at < excluded.expires_at"""),
                     {"address": address, "copy": spelled})
