"""The benchmarks' messages: one 500-byte plain-text body, distinct recipients; or, for an
invoice run, a subject and a body of their own for each."""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

from postroom import Email, enqueue, enqueue_many

SUBJECT = "Sales report - September 2026"
_LINE = "The September sales report is ready; figures by region are in the attached workbook.\n"
BODY = (_LINE * 6)[:499] + "\n"
assert len(BODY.encode()) == 500
MAIL_FROM = "reports@example.com"


def recipients(count: int, first: int = 0, tag: str = "r") -> list[str]:
    """``count`` distinct addresses, numbered from ``first``."""
    return [f"{tag}{n}@example.com" for n in range(first, first + count)]


def enqueue_rows(conn: sa.Connection, key: str, addresses: Sequence[str]) -> int:
    """Queue BODY to ``addresses`` under message key ``key`` in the caller's transaction."""
    return enqueue(conn, key=key, recipients=addresses, subject=SUBJECT, body=BODY,
                   sender=MAIL_FROM)


def enqueue_own_rows(conn: sa.Connection, key: str, addresses: Sequence[str], *,
                     html: bool = False) -> int:
    """Queue one email to each of ``addresses``, each with a subject and a body of its own (an
    invoice run: the body a line of its own before BODY's lines; with ``html`` an HTML part of
    its own too, the same paragraphs), under message key ``key``, in the caller's
    transaction."""
    def email(n: int, address: str) -> Email:
        greeting = f"Dear customer {n:05d}, your invoice is attached."
        return Email(key=key, recipients=[address], subject=f"Invoice {n:05d} for September 2026",
                     body=f"{greeting}\n{BODY}", sender=MAIL_FROM,
                     html=(f"<html><body><p>{greeting}</p>"
                           + "".join(f"<p>{line}</p>" for line in BODY.splitlines())
                           + "</body></html>\n") if html else None)
    return enqueue_many(conn, (email(n, address) for n, address in enumerate(addresses)))
