"""Where the local stack of `scripts/services.sh` keeps its state, as the script finds it."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def dev_dir() -> Path:
    """The stack's state dir: POSTROOM_DEV_DIR when set and not empty, else <repo>/.dev (the
    script's ``${POSTROOM_DEV_DIR:-$REPO/.dev}``)."""
    return Path(os.environ.get("POSTROOM_DEV_DIR") or REPO / ".dev").resolve()
