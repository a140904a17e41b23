"""No production module over MODULE_MAX_LINES lines (issue 47): one that grows past it is split
along a seam a reader would name (STYLE.md: a class that wires a role stays small).

How it counts, as ``wc -l`` does: the newline characters of each ``*.py`` file under postroom/
and the top-level relay/, sender/, schemas/ and bounces/ it links to (each read once, in its
own folder, not again through postroom's links), comments, docstrings and blank lines included.
Tests, bench/, scripts/ and docs/ are not production modules.
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODULE_MAX_LINES = 400
PRODUCTION_FOLDERS = ("postroom", "relay", "sender", "schemas", "bounces")


def production_modules() -> dict[str, int]:
    """Each production module's path (from the repository's root) and its line count."""
    counts: dict[str, int] = {}
    for folder in PRODUCTION_FOLDERS:
        # followlinks=False: postroom/relay and the like are links to the folders walked here.
        for directory, _subdirs, files in os.walk(ROOT / folder, followlinks=False):
            for name in files:
                if name.endswith(".py"):
                    path = Path(directory) / name
                    counts[path.relative_to(ROOT).as_posix()] = path.read_bytes().count(b"\n")
    return counts


def test_the_count_sees_every_production_folder_once() -> None:
    counts = production_modules()
    for module in ("postroom/settings.py", "postroom/web/app.py", "relay/outbox.py",
                   "sender/attempt.py", "schemas/codec.py", "bounces/intake.py"):
        assert module in counts, module
    assert not any(path.startswith(("postroom/relay/", "postroom/sender/", "postroom/schemas/",
                                    "postroom/bounces/")) for path in counts)


def test_no_production_module_is_over_the_limit() -> None:
    over = {path: lines for path, lines in production_modules().items()
            if lines > MODULE_MAX_LINES}
    assert not over, (f"over {MODULE_MAX_LINES} lines (split each along a seam a reader would "
                      f"name): " + ", ".join(f"{path} {lines}" for path, lines in
                                             sorted(over.items(), key=lambda item: -item[1])))
