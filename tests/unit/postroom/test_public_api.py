"""Report jobs import postroom's API from the postroom package, and a shadowed role is refused."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import relay.batch
import relay.outbox


def run(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          check=False, timeout=60)


def test_enqueue_is_the_outbox_function() -> None:
    import postroom

    assert postroom.enqueue is relay.outbox.enqueue


def test_importing_the_base_does_not_load_the_roles() -> None:
    proc = run("import sys, postroom.settings; print(sorted(m for m in ('relay', 'sender') "
               "if m in sys.modules))")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_a_foreign_relay_package_is_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / "relay").mkdir()
    (tmp_path / "relay" / "__init__.py").write_text("SOMEONE_ELSE = True\n")
    # Another distribution's relay, imported first by the job (an editable install's finder
    # would otherwise always find ours, whatever sys.path says).
    proc = run("import sys, postroom; sys.path.insert(0, sys.argv[1]); "
               "sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f)]; "
               "import relay; assert relay.SOMEONE_ELSE; postroom.enqueue", str(tmp_path))
    assert proc.returncode == 1, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: postroom's 'relay' package is shadowed by "
                           f"{tmp_path / 'relay' / '__init__.py'}")


def test_unknown_attributes_are_still_attribute_errors() -> None:
    import postroom

    assert not hasattr(postroom, "send_now")


def test_enqueue_many_and_email_are_the_outbox_ones() -> None:
    import postroom

    assert postroom.enqueue_many is relay.batch.enqueue_many
    assert postroom.Email is relay.outbox.Email
    assert postroom.Batch is relay.batch.Batch
    assert {"enqueue", "enqueue_many", "Email", "Batch"} <= set(postroom.__all__)
