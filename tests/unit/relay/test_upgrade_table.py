"""docs/operations.md's upgrade table has a row for every revision the migrations hold (but the
first, which creates the outbox), and names no revision that does not exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_the_upgrade_table_names_every_revision() -> None:
    revisions = {path.name[:4] for path in (ROOT / "relay" / "migrations" / "versions").glob(
        "[0-9][0-9][0-9][0-9]_*.py")}
    text = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    header = "| from before | stop first | what the migration locks | what changes for jobs |"
    assert header in text
    rows = text[text.index(header):].split("\n\n", 1)[0].splitlines()[2:]
    named = {number for row in rows
             for number in re.findall(r"\b(\d{4})\b", row.strip().split("|")[1])}
    assert named == revisions - {"0001"}
    assert all(len(row.strip().strip("|").split(" | ")) == 4 for row in rows), rows
