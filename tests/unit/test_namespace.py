"""postroom installs one import namespace: the code imports its roles as postroom.*, never by the
top-level folders' names, which a job's own package of the same name would shadow."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FOLDERS = ("relay", "sender", "schemas", "bounces")
BARE_IMPORT = re.compile(rf"^\s*(from|import) ({'|'.join(FOLDERS)})(\.|\s|$)", re.MULTILINE)


def test_each_role_folder_is_linked_into_the_package() -> None:
    for name in FOLDERS:
        link = REPO / "postroom" / name
        assert link.is_symlink(), link
        assert link.resolve() == (REPO / name).resolve()


def test_no_code_imports_a_role_by_its_folder_name() -> None:
    offenders = []
    for top in ("postroom", *FOLDERS, "tests", "bench", "vulture_whitelist.py"):
        root = REPO / top
        files = [root] if root.is_file() else [p for p in root.rglob("*.py") if "postroom/" not in
                                               str(p.relative_to(REPO))[len(top):]]
        for path in files:
            for match in BARE_IMPORT.finditer(path.read_text(encoding="utf-8")):
                offenders.append(f"{path.relative_to(REPO)}: {match.group(0).strip()}")
    assert offenders == []
