"""`python -m postroom.devkit.smarthost` as a person runs it by hand: its --help, and SIGTERM (a
supervisor's stop, `kill`) stopping Postfix with it (issue 45 item 10: master and smtpd kept
listening)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from postroom.devkit.ports import free_port, listening
from postroom.devkit.wait import wait_until
from support.postfix import smarthost_dir

pytestmark = [pytest.mark.integration]

COMMAND = [sys.executable, "-m", "postroom.devkit.smarthost"]


def test_its_help_describes_each_argument() -> None:
    shown = subprocess.run([*COMMAND, "--help"], capture_output=True, text=True, timeout=30,
                           check=True).stdout
    for said in ("DIR ", "the instance's own directory", "--port PORT", "127.0.0.1:PORT",
                 "--route DOMAIN=HOST:PORT", "relay mail for DOMAIN to HOST:PORT",
                 "SIGTERM"):
        assert said in shown, shown


def test_a_bad_route_is_one_line() -> None:
    done = subprocess.run([*COMMAND, "smarthost-dir", "--route", "example.com"], capture_output=True,
                          text=True, timeout=30, check=False)
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1].endswith("not DOMAIN=HOST:PORT: 'example.com'")


def test_sigterm_stops_postfix_with_it(tmp_path: Path) -> None:
    directory = smarthost_dir()
    port = free_port()
    log = tmp_path / "smarthost.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([*COMMAND, str(directory), "--port", str(port),
                                 "--route", "example.com=127.0.0.1:1"],
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        wait_until(lambda: listening(port) and "running;" in log.read_text(), 60,
                   "the smarthost to run")
        master = int((directory / "queue" / "pid" / "master.pid").read_text().split()[0])
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text()
        wait_until(lambda: not listening(port), 15, "Postfix to stop listening")
        with pytest.raises(ProcessLookupError):
            os.kill(master, 0)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        subprocess.run(["/usr/sbin/postfix", "-c", str(directory / "etc"), "abort"],
                       capture_output=True, check=False, timeout=60)
        shutil.rmtree(directory, ignore_errors=True)
