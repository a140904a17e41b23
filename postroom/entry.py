"""The `postroom` command's entry point: one line saying what to install when the command's
libraries are missing (``pip install postroom`` brings a job's enqueue only), else
postroom.cli's ``main``; ``--version`` answered without them."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence

EXIT_FAILURE = 1  # postroom.cli.common's, which this module cannot import without the extra
ROLES_EXTRA = "pip install 'postroom[roles]'"
# The top-level modules of the roles extra's distributions (pyproject.toml), which the commands
# import and a job's install lacks.
ROLES_MODULES = frozenset({"confluent_kafka", "fastavro", "aiosmtplib", "alembic",
                           "prometheus_client", "aiosmtpd", "flufl", "uvloop"})
_OPTIONAL = frozenset({"uvloop"})  # installed with the extra on CPython outside Windows only


def missing_extra(exc: ModuleNotFoundError, argv: Sequence[str]) -> str | None:
    """The line to print when ``exc`` is a roles library missing, else None."""
    if (exc.name or "").partition(".")[0] not in ROLES_MODULES:
        return None
    command = next((arg for arg in argv if not arg.startswith("-")), None)
    who = f"postroom {command}" if command else "postroom"
    return f"{who} needs the roles extra: {ROLES_EXTRA}"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args == ["--version"]:  # postroom.cli's answer, which a job's install can give too
        from postroom import __version__

        print(f"postroom {__version__}")
        return 0
    # Asked before the command runs: its modules import the libraries when they need them, so a
    # command could otherwise get part of the way (`--help`, an argument refused) first.
    absent = next((name for name in sorted(ROLES_MODULES - _OPTIONAL)
                   if importlib.util.find_spec(name) is None), None)
    if absent is not None:
        print(missing_extra(ModuleNotFoundError(name=absent), args), file=sys.stderr)
        return EXIT_FAILURE
    try:
        from postroom.cli import main as cli_main

        return cli_main(args)
    except ModuleNotFoundError as exc:
        line = missing_extra(exc, args)
        if line is None:
            raise
        print(line, file=sys.stderr)
        return EXIT_FAILURE
