"""`postroom schemas register` and `postroom check` against the local stack's Schema Registry, run as
an operator runs them."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import support.registry
from postroom.devkit.devsmtp import DevSmtpServer
from postroom.schemas.codec import load_schema
from postroom.settings import Settings
from support.commands import run_postroom

pytestmark = pytest.mark.e2e


@pytest.fixture
def env(settings: Settings) -> Iterator[dict[str, str]]:
    url = support.registry.registry_url()
    assert settings.database_schema
    yield {**os.environ, "POSTROOM_DATABASE_SCHEMA": settings.database_schema,
           "POSTROOM_TOPIC_PREFIX": settings.topic_prefix, "POSTROOM_SCHEMA_REGISTRY_URL": url}
    support.registry.delete_subjects(url, settings)


def postroom(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return run_postroom(*args, env=env, timeout_s=60)


def test_register_twice_then_check(env: dict[str, str]) -> None:
    prefix = env["POSTROOM_TOPIC_PREFIX"]
    # before registering, check names what to run
    with DevSmtpServer(port=0) as server:
        smtp = {"POSTROOM_SMTP_HOST": "127.0.0.1", "POSTROOM_SMTP_PORT": str(server.port)}
        before = postroom({**env, **smtp}, "check")
        first = postroom(env, "schemas", "register")
        second = postroom(env, "schemas", "register", "--compatibility", "BACKWARD")
        after = postroom({**env, **smtp}, "check")

    assert before.returncode == 1, before.stdout
    assert any(line.startswith("FAIL  registry: ") and "postroom schemas register" in line
               for line in before.stdout.splitlines()), before.stdout
    assert first.returncode == 0, first.stderr
    assert "with compatibility BACKWARD" in first.stderr
    lines = first.stdout.splitlines()
    assert len(lines) == 9
    assert all(line.startswith("new      ") for line in lines), lines
    assert f"{prefix}email.results-value email_result" in first.stdout
    assert second.returncode == 0, second.stderr
    again = [line.split() for line in second.stdout.splitlines()]
    assert [words[1:] for words in again] == [line.split()[1:] for line in lines]  # same ids
    assert {words[0] for words in again} == {"exists"}
    assert after.returncode == 0, after.stdout
    assert "ok    registry: " in after.stdout and "all 9 subjects" in after.stdout


def test_an_incompatible_contract_is_refused_with_the_registrys_message(
        env: dict[str, str], tmp_path: Path) -> None:
    assert postroom(env, "schemas", "register").returncode == 0
    requested = json.loads(load_schema("email_requested").text)
    requested["fields"].append({"name": f"required_{uuid.uuid4().hex[:6]}", "type": "string"})
    (tmp_path / "email_requested.avsc").write_text(json.dumps(requested))
    (tmp_path / "email_result.avsc").write_text(load_schema("email_result").text)

    refused = postroom(env, "schemas", "register", "--schema-dir", str(tmp_path))

    assert refused.returncode == 1
    error = refused.stderr.strip().splitlines()[-1]
    assert error.startswith("postroom schemas: error: the registry refused ")
    assert "Incompatible" in error and requested["fields"][-1]["name"] in error
    assert "Traceback" not in refused.stderr


def test_register_without_a_registry_is_a_configuration_error(env: dict[str, str]) -> None:
    proc = postroom({**env, "POSTROOM_SCHEMA_REGISTRY_URL": ""}, "schemas", "register")
    assert proc.returncode == 2
    assert "POSTROOM_SCHEMA_REGISTRY_URL: is not set" in proc.stderr
