"""postroom's own commands as processes of their own, as they run in production."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

STOP_TIMEOUT_S = 40.0


def postroom_command() -> list[str]:
    """The `postroom` console script of this interpreter's environment."""
    script = Path(sys.executable).with_name("postroom")
    return [str(script)] if script.exists() else [sys.executable, "-m", "postroom.cli"]


def stop_process(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM (a clean stop), then SIGKILL after STOP_TIMEOUT_S."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(5)
