"""What a job's process holds once it has enqueued, on each kind of connection: postroom, the
standard library, its own connection's library, and what `pip install postroom` installs
(pyproject.toml's dependencies and theirs), never a library of the roles extra alone. The
source tree's venv has the roles extra installed, so an import of one of its libraries would go
unseen here and fail only in a job's install (tests/e2e/test_wheel.py, which needs PyPI)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
import sqlalchemy as sa

from postroom.relay.db import libpq_conninfo
from postroom.settings import Settings

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
# The job: its connection's library loaded first, then one enqueue of one recipient, one of
# several (an internationalised domain among them) and a Batch, in one transaction; it prints
# the top-level modules postroom's import and calls added.
JOB = """\
import json, os, sys
kind, dsn, schema = sys.argv[1:4]
if kind == "django":
    sys.path.insert(0, os.path.join(sys.argv[4], "tests"))
    os.environ["DJANGO_SETTINGS_MODULE"] = "django_project.settings"
    import django
    django.setup()
    from django.db import connection, transaction
    opened = transaction.atomic()
    conn = connection
elif kind == "psycopg":
    import psycopg
    conn = opened = psycopg.connect(dsn)
else:
    import sqlalchemy
    opened = sqlalchemy.create_engine(dsn).begin()
before = set(sys.modules)
from postroom import Batch, enqueue
with opened as held:
    conn = conn if kind == "django" else held
    enqueue(conn, key="one", recipients=["a@example.com"], subject="s", body="b", schema=schema)
    enqueue(conn, key="two", recipients=["a@example.com", "b@b\\u00fccher.example"],
            subject="s", body="b", schema=schema)
    with Batch(conn, schema=schema) as batch:
        batch.enqueue(key="batch", recipients=["c@example.com"], subject="s", body="b")
print(json.dumps(sorted({name.partition(".")[0] for name in set(sys.modules) - before})))
"""

# The standard library's network clients: a job's enqueue talks to its own connection only.
STDLIB_CLIENTS = {"smtplib", "http", "urllib", "ssl", "xmlrpc", "ftplib", "imaplib", "poplib"}


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed_with(requirements: list[str]) -> set[str]:
    """The distributions ``requirements`` install, with theirs (any marker but an extra not asked
    for counts: more than a platform installs, never less)."""
    found: set[str] = set()
    todo = list(requirements)
    while todo:
        match = re.match(r"\s*([A-Za-z0-9._-]+)\s*(?:\[([^\]]*)\])?", todo.pop())
        assert match, todo
        name, extras = _normal(match.group(1)), {
            _normal(e) for e in (match.group(2) or "").split(",") if e.strip()}
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        if name in found:
            continue
        found.add(name)
        for requirement in requires:
            wanted = re.findall(r"""extra\s*==\s*["']([^"']+)["']""", requirement)
            if not wanted or {_normal(e) for e in wanted} & extras:
                todo.append(requirement)
    return found


def job_install() -> set[str]:
    """What `pip install postroom` installs: pyproject.toml's dependencies, with theirs."""
    with (ROOT / "pyproject.toml").open("rb") as f:
        return installed_with(tomllib.load(f)["project"]["dependencies"])


def distributions_of(modules: list[str]) -> dict[str, set[str]]:
    """Each third-party top-level module and the distributions that install it."""
    owners = metadata.packages_distributions()
    return {module: {_normal(d) for d in owners.get(module, ["?"])} for module in modules
            if module not in sys.stdlib_module_names and module != "postroom"
            and not module.startswith("_")}


@pytest.mark.parametrize("kind", ["sqlalchemy", "psycopg", "django"])
def test_a_job_s_enqueue_loads_only_what_pip_install_postroom_installs(
        kind: str, engine: sa.Engine, db_settings: Settings) -> None:
    dsn = (engine.url.render_as_string(hide_password=False) if kind == "sqlalchemy"
           else libpq_conninfo(engine))
    proc = subprocess.run([sys.executable, "-c", JOB, kind, dsn, db_settings.database_schema or "",
                           str(ROOT)], capture_output=True, text=True, check=False, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    loaded = json.loads(proc.stdout)
    assert set(loaded) & STDLIB_CLIENTS == set()
    allowed = job_install() | (installed_with(["django"]) if kind == "django" else set())
    outside = {module: owners for module, owners in distributions_of(loaded).items()
               if not owners & allowed}
    assert outside == {}, f"loaded by enqueue, not installed by `pip install postroom`: {outside}"
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM outbox")).scalar_one() == 4
