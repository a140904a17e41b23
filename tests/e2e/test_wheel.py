"""The built wheel as a job installs it: one `postroom` namespace in site-packages, beside PyPI's
`sender` and `schemas` distributions and a job folder with a `schemas/` package, a `sender.py`
and a `relay.py` of its own. The job's own imports and its enqueue into the local stack's
database both work, and the install is the light client: no role library, and the command says
which extra the roles need.

One wheel and one venv serve the module, on one pytest-xdist worker (make test's --dist loadgroup).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import sqlalchemy as sa

from postroom.relay.db import libpq_conninfo
from postroom.settings import Settings

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900),
              # One worker builds the wheel and the venv once for the module (each worker would
              # build its own module fixtures).
              pytest.mark.xdist_group("wheel")]

REPO = Path(__file__).resolve().parents[2]
# PyPI's distributions of the generic names: `sender` ("Python SMTP Client for Humans", a
# top-level sender.py) and `schemas` (a top-level schemas package).
NEIGHBOURS = ("sender==0.3", "schemas==0.7.1")
# uv (the test extra) builds and installs as pip would, from the same build backend and index,
# in a few seconds where pip's build isolation and install took about 50.
UV = Path(sys.executable).with_name("uv")


def _run(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(a) for a in args], capture_output=True, text=True, check=False,
                          cwd=cwd, timeout=600)
    assert proc.returncode == 0, f"{args}: {proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc


def _copy_sources(target: Path) -> None:
    """The repository's files as git knows them (committed or not, ignored ones left out), the
    links of postroom/<role> kept as links: the wheel is built from a copy, so no build/ or
    egg-info lands in the working tree."""
    listed = _run("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard",
                  cwd=REPO).stdout.split("\0")
    for name in filter(None, listed):
        source, copy = REPO / name, target / name
        if not source.is_symlink() and not source.exists():
            continue  # deleted in the working tree, not yet in the index
        copy.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            os.symlink(os.readlink(source), copy)
        else:
            shutil.copy2(source, copy)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    source = tmp_path_factory.mktemp("source")
    _copy_sources(source)
    dist = tmp_path_factory.mktemp("dist")
    _run(UV, "build", "--wheel", "--quiet", "--out-dir", dist, source)
    [built] = dist.glob("postroom-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Path:
    """A fresh venv with the wheel (no extra) and PyPI's sender and schemas."""
    path = tmp_path_factory.mktemp("venv")
    _run(sys.executable, "-m", "venv", "--without-pip", path)
    _run(UV, "pip", "install", "--quiet", "--python", path / "bin" / "python", wheel, *NEIGHBOURS)
    return path


JOB = {
    "schemas/__init__.py": 'WHOSE = "the job\'s schemas package"\n',
    "sender.py": 'WHOSE = "the job\'s sender.py"\n',
    "relay.py": 'WHOSE = "the job\'s relay.py"\n',
    # A report job: its own modules first, then postroom, then an enqueue on its psycopg
    # connection in its own transaction.
    "job.py": """\
import importlib
import json
import sys

own = {name: importlib.import_module(name).WHOSE for name in ("schemas", "sender", "relay")}

import psycopg

from postroom import enqueue

with psycopg.connect(sys.argv[1]) as conn:
    new = enqueue(conn, key="wheel", recipients=["a@example.com", "b@example.com"],
                  subject="From a job", body="Installed from the wheel.", schema=sys.argv[2])
again = {name: importlib.import_module(name).WHOSE for name in ("schemas", "sender", "relay")}
print(json.dumps({"own": own, "again": again, "new": new,
                  "modules": sorted({m.partition(".")[0] for m in sys.modules})}))
""",
}
ROLE_LIBRARIES = {"confluent_kafka", "fastavro", "aiosmtplib", "aiosmtpd", "alembic",
                  "prometheus_client", "httpx", "requests", "flufl", "uvloop"}


def test_the_wheel_holds_one_namespace_and_the_type_marker(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/RECORD"))
        record = archive.read(f"{info}/RECORD").decode()
        top_level = (archive.read(f"{info}/top_level.txt").decode().split()
                     if f"{info}/top_level.txt" in names else ["postroom"])
    assert {name.split("/")[0] for name in names} == {"postroom", info}
    assert {line.split("/")[0] for line in record.splitlines() if line} == {"postroom", info}
    assert top_level == ["postroom"]
    for shipped in ("postroom/py.typed", "postroom/relay/outbox.py",
                    "postroom/schemas/email_requested.avsc", "postroom/sender/service.py",
                    "postroom/bounces/__init__.py", "postroom/relay/migrations/env.py"):
        assert shipped in names, shipped


def test_a_job_with_modules_of_the_generic_names_enqueues(
        venv: Path, tmp_path: Path, engine: sa.Engine, db_settings: Settings) -> None:
    for name, text in JOB.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    python = venv / "bin" / "python"
    proc = _run(python, tmp_path / "job.py", libpq_conninfo(engine),
                db_settings.database_schema or "", cwd=tmp_path)
    found = json.loads(proc.stdout)
    mine = {"schemas": "the job's schemas package", "sender": "the job's sender.py",
            "relay": "the job's relay.py"}
    assert found["own"] == found["again"] == mine
    assert found["new"] == 2
    assert ROLE_LIBRARIES & set(found["modules"]) == set()
    with engine.connect() as conn:
        keys = conn.execute(sa.text("SELECT idempotency_key FROM outbox ORDER BY id")).scalars()
        assert list(keys) == ["wheel|a@example.com", "wheel|b@example.com"]
    # Elsewhere, the same names are PyPI's distributions, untouched by postroom's install (found,
    # not imported: PyPI's schemas 0.7.1 is Python 2 code).
    where = _run(python, "-c", "import importlib.util as u; "
                 "print(*(u.find_spec(n).origin for n in ('sender', 'schemas')))",
                 cwd=venv).stdout.split()
    site = _run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))").stdout
    assert where == [str(Path(site.strip()) / "sender.py"),
                     str(Path(site.strip()) / "schemas" / "__init__.py")]


def test_the_installed_command_without_the_roles_extra(venv: Path) -> None:
    command = venv / "bin" / "postroom"
    version = _run(venv / "bin" / "python", "-c",
                   "import importlib.metadata as m; print(m.version('postroom'))").stdout.strip()
    assert _run(command, "--version").stdout == f"postroom {version}\n"
    proc = subprocess.run([str(command), "relay"], capture_output=True, text=True, check=False,
                          timeout=60)
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr == "postroom relay needs the roles extra: pip install 'postroom[roles]'\n"
