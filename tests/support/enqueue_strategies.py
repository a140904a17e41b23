"""Hypothesis strategies for enqueue's arguments, good and bad, shared by the differential
tests of its fast path and of Batch."""

from __future__ import annotations

import datetime as dt
from typing import Any

from hypothesis import strategies as st

ROW_COLUMNS = ("idempotency_key", "message_key", "recipient", "sender", "subject", "body",
               "attachments", "html", "inline", "priority", "status", "attempts")
# What array literals quote or escape, what JSON escapes, and what no row may hold.
TRICKY = st.sampled_from(['"', "\\", "{", "}", ",", " ", "NULL", "é", "|", "'", "\t", "\n",
                          "\x00", "\ud800", "=?utf-8?q?=0D=0A?=", "[]"])
TEXT = st.lists(st.text(max_size=6) | TRICKY, max_size=4).map("".join)
ADDRESSES = st.sampled_from(["a@example.com", "A@Example.com", "b.c+d@example.org",
                             " e@example.net ", "bad", "x@-y.com", "ü@exämple.de"])
SEND_AFTER = st.none() | st.just(dt.datetime(2026, 12, 24, 7, 0, tzinfo=dt.UTC))


def email_kwargs(draw: st.DrawFn, files: list[str]) -> dict[str, Any]:
    """The keyword arguments of one enqueue call, some of them refused (bad addresses, text no
    event can carry, an unknown priority); ``files`` are paths that exist."""
    return {"key": draw(st.none() | st.sampled_from(["k", "k|1", "k\\2"]) | TEXT),
            "recipients": draw(st.lists(ADDRESSES, min_size=0, max_size=4)),
            "subject": draw(st.sampled_from(["Invoice", "Q3 report"]) | TEXT),
            "body": draw(TEXT), "sender": draw(st.none() | ADDRESSES),
            "html": draw(st.none() | TEXT), "attachments": draw(st.lists(st.sampled_from(files),
                                                                         max_size=2)),
            "priority": draw(st.sampled_from(["normal", "high", "urgent"])),
            "send_after": draw(SEND_AFTER)}
