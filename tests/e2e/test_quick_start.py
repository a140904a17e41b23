"""README's pipeline by hand (beside its two-command Quick start), run as written: its fenced
`sh` block, line by line, as a shell would (`export`, `&` for the long-running commands),
against a schema and a topic prefix of this test's own. One substitution: the dev SMTP server's
port 1025 becomes a free one, since other runs share this machine. `make services && . .dev/env`
is the stack the tests already run on."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from postroom.devkit.ports import free_port, listening
from postroom.devkit.processes import Started, stop_process
from postroom.devkit.scratch import scratch, scratch_env
from postroom.devkit.wait import wait_until
from postroom.settings import Settings
from support.commands import run_postroom, start_postroom

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCUMENTED_PORT = "1025"


def quick_start_lines() -> list[str]:
    section = README.read_text(encoding="utf-8").split("\n## The pipeline by hand\n", 1)[1]
    section = section.split("\n## ", 1)[0]
    [block] = re.findall(r"^```sh\n(.*?)^```$", section, re.MULTILINE | re.DOTALL)
    return [line.split("  #", 1)[0].strip() for line in block.splitlines() if line.strip()]


@pytest.fixture
def env(stack_settings: Settings) -> Iterator[dict[str, str]]:
    with scratch(stack_settings, "qs", create=False) as settings:
        yield {**os.environ, **scratch_env(settings)}


def test_readmes_quick_start_by_hand_runs_as_written(env: dict[str, str], tmp_path: Path) -> None:
    lines = quick_start_lines()
    assert lines[0] == "make services && . .dev/env"  # the stack this test runs on
    # The lines after it call `postroom` from a shell that only sourced .dev/env.
    found = subprocess.run(["bash", "-c", ". .dev/env && command -v postroom"], cwd=ROOT,
                           env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                           check=False)
    assert found.stdout.strip() == str(ROOT / ".venv" / "bin" / "postroom"), found
    port = str(free_port())
    background: list[tuple[str, Started, Path]] = []
    status: list[str] = []
    try:
        for line in lines[1:]:
            argv = [port if word == DOCUMENTED_PORT else word for word in shlex.split(line)]
            if argv[0] == "export":
                name, _, value = argv[1].partition("=")
                env[name] = port if value == DOCUMENTED_PORT else value
                continue
            assert argv[0] == "postroom", line
            if argv[-1] == "&":
                log = tmp_path / f"{argv[1]}.log"
                background.append((argv[1], start_postroom(*argv[1:-1], env=env, log=log), log))
                if argv[1] == "devsmtp":
                    wait_until(lambda: listening(int(port)), 15, "devsmtp to listen")
                continue
            if argv[1] == "status":
                status = argv[1:]
            proc = run_postroom(*argv[1:], env=env, timeout_s=60)
            assert proc.returncode == 0, f"{line}:\n{proc.stdout}\n{proc.stderr}"
            assert "Traceback" not in proc.stderr, proc.stderr
        assert status == ["status", "--key", "hello"]

        # "again after a second or two", as the comment says, until both rows are final.
        def final() -> list[str] | None:
            out = run_postroom(*status, env=env, timeout_s=60).stdout.splitlines()
            rows = {line.split()[0]: line.split()[1] for line in out[2:]}
            return out if rows == {"you@example.com": "sent",
                                   "old.manager@example.com": "failed"} else None
        shown = wait_until(final, 90, "you@ sent and old.manager@ failed")
        assert shown[0] == "message hello, subject 'Hello': 2 recipient(s)"
        assert shown[-1].endswith("550 5.1.1 User unknown")

        # README's job example in this pipeline (issue 45): an attachment below the root it
        # exports goes out; without the export it waited for ever.
        attachment = Path(env["POSTROOM_ATTACHMENTS_ROOT"]) / f"report-{port}.csv"
        attachment.write_text("day,sent\n", encoding="utf-8")
        try:
            queued = run_postroom("enqueue", "--key", "report", "--to", "you@example.com",
                                  "--subject", "Report", "--body", "Attached.", "--attach",
                                  str(attachment), env=env, timeout_s=60)
            assert queued.returncode == 0, queued.stderr

            def attached_sent() -> bool:
                out = run_postroom("status", "--key", "report", env=env, timeout_s=60).stdout
                return out.splitlines()[2:3] != [] and out.splitlines()[2].split()[1] == "sent"
            wait_until(attached_sent, 90, "the email with an attachment to be sent")
        finally:
            attachment.unlink()
    finally:
        codes = {}
        for name, process, log in reversed(background):
            started = time.monotonic()
            codes[name] = (stop_process(process, timeout_s=15), time.monotonic() - started,
                           log.read_text(errors="replace"))
    for name, (code, took, output) in codes.items():
        assert code == 0, f"{name} exited {code}:\n{output}"
        assert took < 10, f"{name} took {took:.1f}s to stop"
        assert "Traceback" not in output, output
