"""What an install carries: a job's enqueue client alone (`pip install postroom`), the roles'
libraries with the roles extra (the bounce intake's aiosmtpd among them), and what `postroom
devsmtp` says where aiosmtpd is missing."""

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


def test_the_core_dependencies_are_what_enqueue_needs() -> None:
    core = project()["dependencies"]
    assert isinstance(core, list)
    assert sorted(d.split(">")[0].split("[")[0] for d in core) == ["idna", "psycopg",
                                                                   "sqlalchemy"]


def test_the_roles_extra_has_every_role_s_library() -> None:
    """The bounce intake is a production role (issue 24): aiosmtpd and flufl.bounce come with
    the roles; the extras that named aiosmtpd for the test server keep it."""
    extras = project()["optional-dependencies"]
    assert isinstance(extras, dict)
    names = {d.split(">")[0].split("[")[0] for d in extras["roles"]}
    assert names >= {"confluent-kafka", "fastavro", "aiosmtplib", "alembic", "prometheus-client",
                     "aiosmtpd", "flufl.bounce", "uvloop"}
    for extra in ("devsmtp", "demo", "test"):
        assert [d for d in extras[extra] if d.startswith("aiosmtpd")], extra
        assert "postroom[roles]" in extras[extra], extra


def test_devsmtp_without_aiosmtpd_says_which_extra_to_install() -> None:
    # None in sys.modules makes the import fail as it would where aiosmtpd is not installed.
    probe = ("import sys; sys.modules['aiosmtpd'] = None; from postroom.cli import main; "
             "sys.exit(main(['devsmtp', '--port', '0']))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=False, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.strip() == ("postroom devsmtp: error: the test server needs aiosmtpd: "
                                   "pip install 'postroom[devsmtp]'")
