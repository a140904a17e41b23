"""docker-compose.yml, Dockerfile and .dockerignore keep their promises (see docs/docker.md).

No Docker engine runs where these tests run, so the files are read as indented text, not run.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from postroom.settings import FIELDS, Settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
POSTROOM_SERVICES = ("init", "relay", "sender", "recorder")
LONG_RUNNING = ("relay", "sender", "recorder")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _clean(text: str) -> list[str]:
    """Non-blank lines with comments removed (no value in our files holds ' #')."""
    lines = (re.sub(r"(^|\s+)#.*$", "", raw).rstrip() for raw in text.splitlines())
    return [line for line in lines if line.strip()]


def _unquote(value: str) -> str:
    return value[1:-1] if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"" else value


def _keys(lines: list[str]) -> list[str]:
    """The keys at the top indentation of a block."""
    top = min(_indent(line) for line in lines)
    return [line.strip().split(":", 1)[0] for line in lines
            if _indent(line) == top and not line.strip().startswith("-")]


def _block(lines: list[str], key: str) -> list[str]:
    """The lines nested under ``key:`` at the top indentation of ``lines``; KeyError if absent."""
    top = min(_indent(line) for line in lines)
    for i, line in enumerate(lines):
        if _indent(line) == top and re.fullmatch(rf"\s*{re.escape(key)}:.*", line):
            body: list[str] = []
            for following in lines[i + 1:]:
                if _indent(following) <= top:
                    break
                body.append(following)
            if not body:
                raise KeyError(f"{key} has an inline value, not a block")
            return body
    raise KeyError(key)


def _value(lines: list[str], key: str) -> str | None:
    """The inline value of ``key: value`` at the top indentation, unquoted; None if absent."""
    top = min(_indent(line) for line in lines)
    for line in lines:
        match = re.fullmatch(rf"\s*{re.escape(key)}:\s*(.*)", line)
        if match and _indent(line) == top:
            return _unquote(match.group(1).strip())
    return None


@pytest.fixture(scope="module")
def compose() -> list[str]:
    return _clean(COMPOSE.read_text())


@pytest.fixture(scope="module")
def services(compose: list[str]) -> dict[str, list[str]]:
    block = _block(compose, "services")
    return {name: _block(block, name) for name in _keys(block)}


@pytest.fixture(scope="module")
def postroom_env(compose: list[str]) -> dict[str, str]:
    """The settings every postroom container gets, from the ``&postroom-env`` mapping."""
    block = _block(compose, "x-postroom-env")
    return {key: _value(block, key) or "" for key in _keys(block)}


def _env(service: list[str]) -> dict[str, str]:
    block = _block(service, "environment")
    return {key: _value(block, key) or "" for key in _keys(block)}


def test_every_service_postroom_needs_is_there(services: dict[str, list[str]]) -> None:
    assert {"postgres", "kafka", "registry", "mailpit", *POSTROOM_SERVICES} <= services.keys()


def test_kafka_is_the_official_image_in_kraft_mode(services: dict[str, list[str]]) -> None:
    kafka = services["kafka"]
    env = _env(kafka)
    assert (_value(kafka, "image") or "").startswith("apache/kafka:")
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert env["KAFKA_CONTROLLER_LISTENER_NAMES"] == "CONTROLLER"
    assert env["CLUSTER_ID"], "the image formats KRaft storage with CLUSTER_ID"
    assert "-Xmx512m" in env["KAFKA_HEAP_OPTS"]


def test_kafka_never_creates_topics_by_itself(services: dict[str, list[str]]) -> None:
    line = next(line for line in _block(services["kafka"], "environment")
                if line.strip().startswith("KAFKA_AUTO_CREATE_TOPICS_ENABLE:"))
    assert line.split(":", 1)[1].strip() == '"false"'


def test_the_registry_is_apicurio_with_its_heap_capped(services: dict[str, list[str]]) -> None:
    registry = services["registry"]
    assert (_value(registry, "image") or "").startswith("apicurio/apicurio-registry:3.")
    assert "-Xmx256m" in _env(registry)["JAVA_OPTS_APPEND"]
    assert "/apis/ccompat/v7" in (_value(_block(registry, "healthcheck"), "test") or "")


@pytest.mark.parametrize("name", ["postgres", "kafka", "registry", "mailpit"])
def test_backing_services_have_healthchecks(services: dict[str, list[str]], name: str) -> None:
    assert _value(_block(services[name], "healthcheck"), "test")


def test_init_migrates_and_creates_topics_once_backing_services_are_healthy(
        services: dict[str, list[str]]) -> None:
    init = services["init"]
    runs = " ".join([_value(init, "entrypoint") or "", _value(init, "command") or ""])
    assert "postroom db upgrade" in runs
    assert "postroom topics create" in runs
    assert "postroom schemas register" in runs
    assert _value(init, "restart") in (None, "no"), "a one-shot must not be restarted"
    depends = _block(init, "depends_on")
    for backing in ("postgres", "kafka", "registry"):
        assert _value(_block(depends, backing), "condition") == "service_healthy"


@pytest.mark.parametrize("name", LONG_RUNNING)
def test_long_running_services_wait_for_init(services: dict[str, list[str]], name: str) -> None:
    service = services[name]
    init = _block(_block(service, "depends_on"), "init")
    assert _value(init, "condition") == "service_completed_successfully"
    assert _value(service, "command") == f'["{name}"]'
    assert _value(service, "restart") == "unless-stopped"


@pytest.mark.parametrize("name", [*POSTROOM_SERVICES, "cli"])
def test_postroom_services_build_the_image_and_share_settings(
        services: dict[str, list[str]], name: str) -> None:
    service = services[name]
    assert _value(service, "build") == "."
    assert _value(service, "image") == "postroom:local"
    assert _value(service, "environment") == "*postroom-env"


def test_sender_scales(services: dict[str, list[str]]) -> None:
    # A fixed container name or host port would make `--scale sender=3` fail.
    assert "container_name" not in _keys(services["sender"])
    assert "ports" not in _keys(services["sender"])


def test_no_service_has_a_fixed_container_name(compose: list[str]) -> None:
    assert not any(line.strip().startswith("container_name:") for line in compose)


def test_cli_runs_postroom_on_demand(services: dict[str, list[str]]) -> None:
    cli = services["cli"]
    assert "entrypoint" not in _keys(cli), "the image's ENTRYPOINT is postroom"
    assert _value(cli, "profiles") == '["tools"]', "`docker compose up` must not start it"


def test_every_postroom_variable_is_a_setting() -> None:
    used = set(re.findall(r"\bPOSTROOM_[A-Z0-9_]+", COMPOSE.read_text()))
    assert used
    assert used <= FIELDS.keys(), f"not in postroom/settings.py: {sorted(used - FIELDS.keys())}"


def test_every_postroom_value_parses(postroom_env: dict[str, str]) -> None:
    path_fields = {f.name for f in dataclasses.fields(Settings) if "Path" in str(f.type)}
    for name, value in postroom_env.items():
        field, parse = FIELDS[name]
        if field in path_fields:
            # Their parsers check the path exists, which it does only inside the image.
            assert value.startswith("/"), name
        else:
            parse(value)


def test_settings_point_at_services_in_the_file(services: dict[str, list[str]],
                                                postroom_env: dict[str, str]) -> None:
    database = urlsplit(postroom_env["POSTROOM_DATABASE_URL"])
    assert database.hostname in services
    kafka_host, _, kafka_port = postroom_env["POSTROOM_KAFKA_BOOTSTRAP_SERVERS"].partition(":")
    assert kafka_host in services
    assert f"//{kafka_host}:{kafka_port}" in _env(services["kafka"])["KAFKA_ADVERTISED_LISTENERS"]
    assert postroom_env["POSTROOM_SMTP_HOST"] in services
    registry = urlsplit(postroom_env["POSTROOM_SCHEMA_REGISTRY_URL"])
    assert registry.hostname in services
    assert f":{registry.port}" in " ".join(_block(services["registry"], "ports"))
    assert registry.path == "/apis/ccompat/v7"


def test_attachments_root_is_mounted_where_the_settings_say(
        services: dict[str, list[str]], postroom_env: dict[str, str]) -> None:
    root = postroom_env["POSTROOM_ATTACHMENTS_ROOT"]
    for name in ("sender", "cli"):
        mounts = [_unquote(line.strip().removeprefix("- "))
                  for line in _block(services[name], "volumes")]
        assert any(mount.split(":")[1] == root for mount in mounts), name
    assert f"mkdir {root}" in (ROOT / "Dockerfile").read_text()


def test_dockerfile_installs_postroom_as_a_non_root_user() -> None:
    lines = _clean((ROOT / "Dockerfile").read_text())
    instructions = [line.split(None, 1) for line in lines if re.match(r"[A-Z]+\s", line)]
    assert ["FROM", "python:3.11-slim"] in instructions
    assert any(word == "RUN" and "pip install ." in rest for word, rest in instructions)
    users = [rest.strip() for word, rest in instructions if word == "USER"]
    assert users and users[-1] not in ("root", "0")
    assert instructions[-2:] == [["ENTRYPOINT", '["postroom"]'], ["CMD", '["--help"]']]


def test_dockerignore_keeps_local_state_out_of_the_build() -> None:
    ignored = set(_clean((ROOT / ".dockerignore").read_text()))
    assert {".venv", ".dev", ".cache", ".git"} <= ignored
