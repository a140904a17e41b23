"""django-post-office (the most used durable mail queue in Python) as a design of the delivery
benchmark: a venv of its own (Django, django-post-office, SQLite), queued with ``mail.send``,
sent as its ``send_queued_mail`` command sends, at ``threads`` threads; the send phase is timed."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

from bench.report import BenchError, progress

PACKAGES = ("Django==5.2.*", "django-post-office==3.12.0")
VENV_DIR = Path(__file__).resolve().parents[2] / ".cache" / "bench-postoffice-venv"
HARNESS = Path(__file__).with_name("postoffice_harness.py")
BATCH_SIZE = 1000      # emails fetched per round (its default is 100: fewer rounds, fairer to it)
RUN_TIMEOUT_S = 1800


@dataclasses.dataclass(frozen=True)
class PostOfficeRun:
    queue_s: float   # mail.send for every recipient (not timed against postroom)
    send_s: float    # send_queued_mail until none is queued
    cpu_s: float     # its process, all threads, during the send phase
    sent: int


def ensure_venv() -> Path:
    """The venv's python, made and filled once (pip from PyPI); later runs reuse it."""
    python = VENV_DIR / "bin" / "python"
    stamp = VENV_DIR / ".installed"
    if python.exists() and stamp.exists() and stamp.read_text() == " ".join(PACKAGES):
        return python
    progress(f"delivery: making the django-post-office venv in {VENV_DIR} ({', '.join(PACKAGES)})")
    venv.create(VENV_DIR, with_pip=True, clear=True)
    result = subprocess.run([str(python), "-m", "pip", "install", "--quiet",
                             "--disable-pip-version-check", *PACKAGES],
                            capture_output=True, text=True, check=False, timeout=900)
    if result.returncode != 0:
        raise BenchError(f"cannot install {', '.join(PACKAGES)}: "
                         f"{(result.stderr.strip().splitlines() or ['pip failed'])[-1]}")
    stamp.write_text(" ".join(PACKAGES))
    return python


def run(host: str, port: int, recipients: list[str], *, threads: int, sender: str, subject: str,
        body: str) -> PostOfficeRun:
    """Queue one email per recipient and send them all, in a process of its own."""
    python = ensure_venv()
    with tempfile.TemporaryDirectory(prefix="bench-postoffice-") as tmp:
        plan = Path(tmp) / "plan.json"
        plan.write_text(json.dumps({
            "db": str(Path(tmp) / "outbox.sqlite3"), "host": host, "port": port,
            "threads": threads, "batch": BATCH_SIZE, "sender": sender, "subject": subject,
            "body": body, "recipients": recipients}))
        process = subprocess.Popen([str(python), str(HARNESS), str(plan)], text=True,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   stdin=subprocess.DEVNULL)
        try:
            out, err = process.communicate(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            raise BenchError(f"django-post-office did not finish within {RUN_TIMEOUT_S}s") from None
    if process.returncode != 0:
        raise BenchError(f"django-post-office harness exited {process.returncode}: "
                         f"{(err.strip().splitlines() or ['no output'])[-1]}")
    figures = json.loads(out.strip().splitlines()[-1])
    if figures["sent"] != len(recipients):
        raise BenchError(f"django-post-office sent {figures['sent']} of {len(recipients)} "
                         f"({figures['failed']} failed, {figures['queued']} still queued)")
    return PostOfficeRun(figures["queue_s"], figures["send_s"], figures["cpu_s"],
                         figures["sent"])


if __name__ == "__main__":  # a smoke run: python -m bench.peers.postoffice HOST PORT N
    figures = run(sys.argv[1], int(sys.argv[2]), [f"r{n}@example.com" for n in
                                                     range(int(sys.argv[3]))],
                     threads=20, sender="reports@example.com", subject="S", body="b\n")
    print(figures)
