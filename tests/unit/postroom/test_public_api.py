"""Report jobs import postroom's API from the postroom package; the roles stay internal."""

from __future__ import annotations

import subprocess
import sys

from postroom.relay import batch, outbox


def run(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          check=False, timeout=60)


def test_enqueue_is_the_outbox_function() -> None:
    import postroom

    assert postroom.enqueue is outbox.enqueue


def test_importing_the_base_does_not_load_the_roles() -> None:
    proc = run("import sys, postroom.settings; print(sorted(m for m in ('postroom.relay', "
               "'postroom.sender') if m in sys.modules))")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_unknown_attributes_are_still_attribute_errors() -> None:
    import postroom

    assert not hasattr(postroom, "send_now")


def test_enqueue_many_and_email_are_the_outbox_ones() -> None:
    import postroom

    assert postroom.enqueue_many is batch.enqueue_many
    assert postroom.Email is outbox.Email
    assert postroom.Batch is batch.Batch
    assert {"enqueue", "enqueue_many", "Email", "Batch"} <= set(postroom.__all__)
