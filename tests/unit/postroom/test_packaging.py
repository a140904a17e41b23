"""What a production install carries: the core dependencies (the bounce intake's aiosmtpd among
them), and what `postroom devsmtp` says where aiosmtpd is missing."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[3] / "pyproject.toml"


def project() -> dict[str, object]:
    with PYPROJECT.open("rb") as f:
        table: dict[str, object] = tomllib.load(f)["project"]
    return table


def test_aiosmtpd_is_a_core_dependency_since_postroom_bounces_listens_with_it() -> None:
    """The bounce intake is a production role (issue 24); the extras that named aiosmtpd for the
    test server keep it, so an install of an extra alone still has it."""
    core = project()["dependencies"]
    extras = project()["optional-dependencies"]
    assert isinstance(core, list) and isinstance(extras, dict)
    assert [d for d in core if d.startswith("aiosmtpd")]
    assert [d for d in core if d.startswith("flufl.bounce")]
    for extra in ("devsmtp", "demo", "test"):
        assert [d for d in extras[extra] if d.startswith("aiosmtpd")], extra


def test_devsmtp_without_aiosmtpd_says_which_extra_to_install() -> None:
    # None in sys.modules makes the import fail as it would where aiosmtpd is not installed.
    probe = ("import sys; sys.modules['aiosmtpd'] = None; from postroom.cli import main; "
             "sys.exit(main(['devsmtp', '--port', '0']))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=False, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.strip() == ("postroom devsmtp: error: the test server needs aiosmtpd: "
                                   "pip install 'postroom[devsmtp]'")
