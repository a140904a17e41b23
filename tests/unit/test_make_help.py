"""`make` alone, as a newcomer reads it: every target with its description, the descriptions in
one column (issue 45 item 12: services-cluster-down and compose-test pushed theirs out)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_make_lists_every_target_with_its_description_in_one_column() -> None:
    shown = subprocess.run(["make", "--no-print-directory"], cwd=ROOT, capture_output=True,
                           text=True, timeout=60, check=True).stdout.splitlines()
    documented = re.findall(r"^([a-z-]+):.*## ", (ROOT / "Makefile").read_text(), re.MULTILINE)
    rows = [re.fullmatch(r"  make (\S+)( +)(\S.*)", line) for line in shown]
    assert all(rows), shown
    assert [row[1] for row in rows if row] == documented
    columns = {row.start(3) for row in rows if row}
    assert len(columns) == 1, shown
    assert all(len(row[2]) >= 2 for row in rows if row)  # two spaces at least after the name
