"""How the tables of the commands print a cell: on one line, clipped, times in UTC to the second."""

from __future__ import annotations

import datetime as dt

ERROR_WIDTH = 70


def flat(text: str) -> str:
    """``text`` on one line ("-" when empty): a row written by SQL may hold line breaks."""
    return " ".join(text.split()) or "-"


def clip(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters, an ellipsis marking the cut."""
    return text if len(text) <= width else text[:width - 1] + "…"


def seconds(value: dt.datetime | None) -> str:
    """``value`` in UTC to the second, "-" for none."""
    return value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S") if value else "-"
