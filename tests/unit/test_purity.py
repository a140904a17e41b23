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
# One worker runs them all, so that one interpreter checks all (see _PROBE).
pytestmark = pytest.mark.xdist_group("purity")

# Run in a fresh interpreter: this test process has imported whatever other tests needed. One
# interpreter imports the modules in turn and lists, for each, the forbidden modules its import
# loaded; that is what the module imports alone as long as none was loaded before it (when one
# was, it is found whether or not it would be again, so the module gets an interpreter of its own).
_PROBE = """
import importlib, json, sys, traceback
forbidden = sys.argv[1].split(",")
def loaded():
    return {name for name in sys.modules
            if any(name == f or name.startswith(f + ".") for f in forbidden)}
found = {}
for module in sys.argv[2:]:
    if found and loaded():
        break
    try:
        importlib.import_module(module)
    except Exception:
        found[module] = ["(the import failed) " + traceback.format_exc()]
    else:
        found[module] = sorted(loaded())
print(json.dumps(found))
"""


def imported_forbidden(modules: list[str]) -> dict[str, list[str]]:
    """For each of ``modules``, the forbidden modules it imports, as a fresh interpreter sees."""
    found: dict[str, list[str]] = {}
    while len(found) < len(modules):
        result = subprocess.run(
            [sys.executable, "-c", _PROBE, ",".join(FORBIDDEN), *modules[len(found):]],
            capture_output=True, text=True, check=False, timeout=60,
        )
        assert result.returncode == 0, result.stderr
        found.update(json.loads(result.stdout))
    return found


@pytest.fixture(scope="module")
def pure_modules_imports() -> dict[str, list[str]]:
    return imported_forbidden(PURE_MODULES)


@pytest.mark.parametrize("module", PURE_MODULES)
def test_pure_module_imports_no_io_library(
        pure_modules_imports: dict[str, list[str]], module: str) -> None:
    assert pure_modules_imports[module] == []


@pytest.mark.parametrize(("module", "expected"), [
    ("smtplib", "smtplib"),
    ("sqlalchemy", "sqlalchemy"),
])
def test_the_probe_sees_an_io_import(module: str, expected: str) -> None:
    """Guards the probe itself: a module that does import a forbidden library is caught, and
    one checked after it in the same interpreter is not blamed for it."""
    found = imported_forbidden(["postroom.topics", module, "postroom.rules"])
    assert found["postroom.topics"] == [] and found["postroom.rules"] == []
    assert expected in found[module]
