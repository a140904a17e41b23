"""The pure decision modules import no Kafka, SMTP or database library."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PURE_MODULES = [
    "postroom.sender.outcome", "postroom.sender.retry", "postroom.sender.priority",
    "postroom.sender.errors", "postroom.sender.routing", "postroom.sender.offsets",
    "postroom.sender.claims", "postroom.topics", "postroom.lagrules", "postroom.headers",
    "postroom.acls", "postroom.rules", "postroom.mime", "postroom.sender.admission",
    "postroom.sender.throttle", "postroom.sender.attempt", "postroom.sender.ports",
    "postroom.sender.attempt_state", "postroom.sender.ledger_calls",
    "postroom.replication",
]
FORBIDDEN = ["confluent_kafka", "aiosmtplib", "smtplib", "sqlalchemy", "psycopg"]

# Run in a fresh interpreter: this test process has imported whatever other tests needed.
_PROBE = """
import importlib, json, sys
importlib.import_module(sys.argv[1])
forbidden = sys.argv[2].split(",")
print(json.dumps(sorted(
    name for name in sys.modules
    if any(name == f or name.startswith(f + ".") for f in forbidden)
)))
"""


def imported_forbidden(module: str) -> list[str]:
    result = subprocess.run(
        [sys.executable, "-c", _PROBE, module, ",".join(FORBIDDEN)],
        capture_output=True, text=True, check=False, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    found: list[str] = json.loads(result.stdout)
    return found


@pytest.mark.parametrize("module", PURE_MODULES)
def test_pure_module_imports_no_io_library(module: str) -> None:
    assert imported_forbidden(module) == []


@pytest.mark.parametrize(("module", "expected"), [
    ("smtplib", "smtplib"),
    ("sqlalchemy", "sqlalchemy"),
])
def test_the_probe_sees_an_io_import(module: str, expected: str) -> None:
    """Guards the probe itself: a module that does import a forbidden library is caught."""
    assert expected in imported_forbidden(module)
