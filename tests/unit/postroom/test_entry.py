"""The `postroom` command where the roles extra is not installed (a job's `pip install postroom`):
one line saying what to install, and `--version` from the package metadata."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata

import pytest

import postroom
from postroom.entry import ROLES_MODULES


def run_without_roles(*args: str) -> subprocess.CompletedProcess[str]:
    """``postroom ARGS`` in a process where no module of the roles extra can be imported (None in
    sys.modules makes an import fail as it fails where the library is not installed)."""
    probe = ("import sys\n"
             f"for name in {sorted(ROLES_MODULES)!r}:\n"
             "    sys.modules[name] = None\n"
             "from postroom.entry import main\n"
             f"sys.exit(main({list(args)!r}))\n")
    return subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=False, timeout=60)


@pytest.mark.parametrize("command", ["relay", "sender", "recorder", "bounces", "enqueue", "check"])
def test_a_command_without_the_roles_extra_says_what_to_install(command: str) -> None:
    proc = run_without_roles(command)
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr == (f"postroom {command} needs the roles extra: "
                           "pip install 'postroom[roles]'\n")


def test_version_needs_no_extra_and_is_the_metadata_s() -> None:
    proc = run_without_roles("--version")
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout == f"postroom {metadata.version('postroom')}\n"


def test_the_package_version_is_the_metadata_s() -> None:
    assert postroom.__version__ == metadata.version("postroom")


def test_the_full_parser_gives_the_same_version(capsys: pytest.CaptureFixture[str]) -> None:
    from postroom.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"postroom {metadata.version('postroom')}\n"


def test_another_missing_module_is_not_blamed_on_the_extra() -> None:
    probe = ("import sys; sys.modules['postroom.cli'] = None\n"
             "from postroom.entry import main; sys.exit(main(['relay']))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=False, timeout=60)
    assert proc.returncode == 1
    assert "ModuleNotFoundError" in proc.stderr and "roles extra" not in proc.stderr


def test_a_command_that_never_reaches_the_database_starts_without_sqlalchemy() -> None:
    """Help and a refused argument cost a start of Python and the parser, not SQLAlchemy's
    import (about half of every `postroom` start); the commands that use the database import
    it themselves."""
    probe = ("import sys\n"
             "from postroom.cli import main\n"
             "try:\n"
             "    main(['lag', '--watch', 'soon'])\n"
             "except SystemExit as exc:\n"
             "    assert exc.code == 2, exc.code\n"
             "print(sorted(m for m in sys.modules if m.partition('.')[0] == 'sqlalchemy'))\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60, check=True)
    assert "postroom lag: error: argument --watch" in done.stderr
    assert done.stdout == "[]\n"
