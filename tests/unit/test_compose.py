"""docker-compose.yml, Dockerfile and .dockerignore keep their promises (see docs/docker.md).

Read, not run: the compose file with PyYAML (anchors and all), the Dockerfile and .dockerignore as
lines. `make compose-test` (scripts/compose-test.sh) runs them; its stand-ins are checked here too.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from postroom.settings import FIELDS, Settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
COMPOSE_TEST = ROOT / "scripts" / "compose-test.sh"
STANDINS = ROOT / "dev" / "compose"
POSTROOM_SERVICES = ("init", "relay", "sender", "recorder")
LONG_RUNNING = ("relay", "sender", "recorder")


def _lines(path: Path) -> list[str]:
    """Non-blank lines of a Dockerfile or .dockerignore, comments removed."""
    lines = (re.sub(r"(^|\s+)#.*$", "", raw).rstrip() for raw in path.read_text().splitlines())
    return [line for line in lines if line.strip()]


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    document = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(document, dict)
    return document


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return dict(compose["services"])


@pytest.fixture(scope="module")
def postroom_env(compose: dict[str, Any]) -> dict[str, str]:
    """The settings every postroom container gets, from the ``&postroom-env`` mapping."""
    env = compose["x-postroom-env"]
    # Quoted in the file where YAML would read a number or a boolean: the container gets text.
    assert all(isinstance(value, str) for value in env.values()), env
    return dict(env)


def test_every_service_postroom_needs_is_there(services: dict[str, dict[str, Any]]) -> None:
    assert {"postgres", "kafka", "registry", "mailpit", *POSTROOM_SERVICES} <= services.keys()


def test_kafka_is_the_official_image_in_kraft_mode(services: dict[str, dict[str, Any]]) -> None:
    kafka = services["kafka"]
    env = kafka["environment"]
    assert kafka["image"].startswith("apache/kafka:")
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert env["KAFKA_CONTROLLER_LISTENER_NAMES"] == "CONTROLLER"
    assert env["CLUSTER_ID"], "the image formats KRaft storage with CLUSTER_ID"
    assert "-Xmx512m" in env["KAFKA_HEAP_OPTS"]


def test_kafka_never_creates_topics_by_itself(services: dict[str, dict[str, Any]]) -> None:
    # The string "false", as the image's environment needs it (unquoted YAML would be a bool).
    assert services["kafka"]["environment"]["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"


def test_the_registry_is_apicurio_with_its_heap_capped(
        services: dict[str, dict[str, Any]]) -> None:
    registry = services["registry"]
    assert registry["image"].startswith("apicurio/apicurio-registry:3.")
    assert "-Xmx256m" in registry["environment"]["JAVA_OPTS_APPEND"]
    assert "/apis/ccompat/v7" in " ".join(registry["healthcheck"]["test"])


@pytest.mark.parametrize("name", ["postgres", "kafka", "registry", "mailpit"])
def test_backing_services_have_healthchecks(services: dict[str, dict[str, Any]], name: str) -> None:
    assert services[name]["healthcheck"]["test"]


def test_init_migrates_and_creates_topics_once_backing_services_are_healthy(
        services: dict[str, dict[str, Any]]) -> None:
    init = services["init"]
    runs = " ".join([*init.get("entrypoint", []), *init.get("command", [])])
    assert "postroom db upgrade" in runs
    assert "postroom topics create" in runs
    assert "postroom schemas register" in runs
    assert init.get("restart", "no") == "no", "a one-shot must not be restarted"
    for backing in ("postgres", "kafka", "registry"):
        assert init["depends_on"][backing]["condition"] == "service_healthy"


@pytest.mark.parametrize("name", LONG_RUNNING)
def test_long_running_services_wait_for_init(services: dict[str, dict[str, Any]], name: str) -> None:
    service = services[name]
    assert service["depends_on"]["init"]["condition"] == "service_completed_successfully"
    assert service["command"] == [name]
    assert service["restart"] == "unless-stopped"


@pytest.mark.parametrize("name", [*POSTROOM_SERVICES, "cli"])
def test_postroom_services_run_the_image_and_share_settings(
        compose: dict[str, Any], services: dict[str, dict[str, Any]], name: str) -> None:
    service = services[name]
    assert service["image"] == "postroom:local"
    # Built by init (everything waits for it) and by cli (run on its own); a build section on
    # every service built the same image once per service under the classic builder.
    assert service.get("build") == ("." if name in ("init", "cli") else None)
    # The alias *postroom-env, not a copy: PyYAML builds an aliased mapping once.
    assert service["environment"] is compose["x-postroom-env"]


def test_docker_compose_pull_never_asks_a_registry_for_postroom_local(
        services: dict[str, dict[str, Any]]) -> None:
    # A service naming postroom:local without a build section made `docker compose pull` fail
    # (pull access denied); one with build is skipped by pull as buildable.
    local = {name: s for name, s in services.items() if s["image"] == "postroom:local"}
    assert local.keys() == {*POSTROOM_SERVICES, "cli"}
    for name, service in local.items():
        assert "build" in service or service.get("pull_policy") == "never", name


def test_sender_scales(services: dict[str, dict[str, Any]]) -> None:
    # A fixed container name or host port would make `--scale sender=3` fail.
    assert "container_name" not in services["sender"]
    assert "ports" not in services["sender"]


def test_no_service_has_a_fixed_container_name(services: dict[str, dict[str, Any]]) -> None:
    assert [name for name, service in services.items() if "container_name" in service] == []


def test_cli_runs_postroom_on_demand(services: dict[str, dict[str, Any]]) -> None:
    cli = services["cli"]
    assert "entrypoint" not in cli, "the image's ENTRYPOINT is postroom"
    assert cli["profiles"] == ["tools"], "`docker compose up` must not start it"


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


def test_settings_point_at_services_in_the_file(services: dict[str, dict[str, Any]],
                                                postroom_env: dict[str, str]) -> None:
    database = urlsplit(postroom_env["POSTROOM_DATABASE_URL"])
    assert database.hostname in services
    kafka_host, _, kafka_port = postroom_env["POSTROOM_KAFKA_BOOTSTRAP_SERVERS"].partition(":")
    assert kafka_host in services
    advertised = services["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"]
    assert f"//{kafka_host}:{kafka_port}" in advertised
    assert postroom_env["POSTROOM_SMTP_HOST"] in services
    registry = urlsplit(postroom_env["POSTROOM_SCHEMA_REGISTRY_URL"])
    assert registry.hostname in services
    assert f":{registry.port}" in " ".join(services["registry"]["ports"])
    assert registry.path == "/apis/ccompat/v7"


def test_attachments_root_is_mounted_where_the_settings_say(
        services: dict[str, dict[str, Any]], postroom_env: dict[str, str]) -> None:
    root = postroom_env["POSTROOM_ATTACHMENTS_ROOT"]
    for name in ("sender", "cli"):
        mounts = services[name]["volumes"]
        assert any(mount.split(":")[1] == root for mount in mounts), name
    assert f"mkdir {root}" in (ROOT / "Dockerfile").read_text()


def test_dockerfile_installs_postroom_as_a_non_root_user() -> None:
    lines = _lines(ROOT / "Dockerfile")
    instructions = [line.split(None, 1) for line in lines if re.match(r"[A-Z]+\s", line)]
    assert ["FROM", "python:3.11-slim"] in instructions
    # the roles' libraries: a plain `pip install .` is a job's enqueue client only
    assert any(word == "RUN" and "pip install '.[roles,otel,web]'" in rest for word, rest in instructions)
    users = [rest.strip() for word, rest in instructions if word == "USER"]
    assert users and users[-1] not in ("root", "0")
    assert instructions[-2:] == [["ENTRYPOINT", '["postroom"]'], ["CMD", '["--help"]']]


def test_dockerignore_lets_in_only_what_pip_install_needs() -> None:
    # An allow-list: a deny-list let in every new state folder (.dev-cluster's live broker logs).
    lines = _lines(ROOT / ".dockerignore")
    assert lines[0] == "*"
    allowed = {line[1:] for line in lines if line.startswith("!")}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = {pattern.rstrip("*")
                for pattern in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    # the role folders postroom/ links to (postroom/relay -> ../relay) come in with it
    linked = {path.resolve().name for path in (ROOT / "postroom").iterdir() if path.is_symlink()}
    assert allowed == {"pyproject.toml", project["project"]["readme"], *packages, *linked}
    assert all((ROOT / name).exists() for name in allowed)


def test_host_ports_are_on_loopback_and_movable(services: dict[str, dict[str, Any]]) -> None:
    # make compose-test moves them (HOST_PORT_*) off the ports a user's own stack may hold.
    published = {name: service["ports"] for name, service in services.items() if "ports" in service}
    assert published.keys() == {"postgres", "kafka", "registry", "mailpit"}
    for name, ports in published.items():
        for port in ports:
            assert re.fullmatch(r"127\.0\.0\.1:\$\{HOST_PORT_[A-Z]+:-\d+\}:\d+", port), (name, port)


def test_kafka_advertises_the_host_port_it_publishes(services: dict[str, dict[str, Any]]) -> None:
    # A client on the host is sent back to the advertised address: it must be the published port.
    kafka = services["kafka"]
    (mapping,) = kafka["ports"]
    host_port, container_port = re.fullmatch(r"127\.0\.0\.1:(\$\{[^}]+\}):(\d+)", mapping).groups()
    env = kafka["environment"]
    assert f"EXTERNAL://localhost:{host_port}" in env["KAFKA_ADVERTISED_LISTENERS"]
    assert f"EXTERNAL://:{container_port}" in env["KAFKA_LISTENERS"]


def _standin_names() -> set[str]:
    return set(re.findall(r"^\s*build_image (\S+) ", COMPOSE_TEST.read_text(), re.MULTILINE))


def test_every_image_not_built_here_has_a_stand_in(services: dict[str, dict[str, Any]]) -> None:
    built = {service["image"] for service in services.values() if "build" in service}
    pulled = {service["image"] for service in services.values()} - built
    (base,) = [line.split()[1] for line in _lines(ROOT / "Dockerfile") if line.startswith("FROM ")]
    standins = _standin_names()
    for image in (*pulled, base):
        # Unqualified names resolve to docker.io, library/ for official images, as Docker does.
        qualified = image if "/" in image else f"library/{image}"
        assert f"docker.io/{qualified}" in standins, image


@pytest.mark.parametrize("folder", sorted(p.name for p in STANDINS.iterdir() if p.is_dir()))
def test_each_stand_in_folder_is_built(folder: str) -> None:
    assert (STANDINS / folder / "Containerfile").is_file()
    assert f'"$STANDINS/{folder}"' in COMPOSE_TEST.read_text()


def test_the_test_override_changes_only_mailpits_recipients() -> None:
    # What make compose-test proves is docker-compose.yml: its override may not reshape the stack.
    override = yaml.safe_load((STANDINS / "test.override.yml").read_text())
    assert override == {"services": {"mailpit": {"environment": {
        "MP_SMTP_ALLOWED_RECIPIENTS": override["services"]["mailpit"]["environment"][
            "MP_SMTP_ALLOWED_RECIPIENTS"]}}}}


def _bash(script: str, tmp_path: Path, path: str | None = None) -> subprocess.CompletedProcess[str]:
    """``script`` in bash after sourcing scripts/compose-test.sh (which then only defines)."""
    env = {**os.environ, "POSTROOM_COMPOSE_DIR": str(tmp_path / "work")}
    if path is not None:
        env["PATH"] = f"{path}:{env['PATH']}"
    return subprocess.run(["bash", "-c", f'. "$1"\n{script}', "unit", str(COMPOSE_TEST)], env=env,
                          capture_output=True, text=True, timeout=30, check=False)


def test_teardown_runs_to_its_end_when_its_processes_are_gone(tmp_path: Path) -> None:
    # Ctrl-C kills the health loop (and podman) first: teardown's kills then find nothing, and
    # under set -e a failed `[[ ... ]] && kill` ended the trap before compose stop and down.
    done = _bash(f"""
        mkdir -p "$WORK"
        REPO={tmp_path}
        ATTACH_DIR={tmp_path}/attachments/compose-test
        compose() {{ echo "compose $1" >>"$WORK/calls"; }}
        podman() {{ :; }}
        sleep 0 & gone=$!
        wait "$gone"
        HEALTH_PID=$gone PODMAN_SERVICE_PID=$gone STACK_UP=1
        trap teardown EXIT
        """, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "passed in" in done.stdout
    calls = (tmp_path / "work" / "calls").read_text().split("\n")
    assert {"compose stop", "compose down"} <= set(calls), calls


def test_podmans_service_runs_outside_the_terminals_process_group(tmp_path: Path) -> None:
    # A Ctrl-C reaches the foreground process group; teardown still needs podman's API after it.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / "podman"
    stub.write_text(f"""#!{sys.executable}
import os, socket, sys, time
path = sys.argv[-1].removeprefix("unix://")
server = socket.socket(socket.AF_UNIX)
server.bind(path)
with open(os.path.join(os.path.dirname(path), "stub"), "w") as out:
    out.write(f"{{os.getpid()}} {{os.getsid(0)}} {{os.getpgrp()}}")
time.sleep(30)
""")
    stub.chmod(0o755)
    done = _bash("""
        mkdir -p "$WORK"
        curl() { return 0; }
        start_podman_service
        echo "$PODMAN_SERVICE_PID"
        """, tmp_path, path=str(bin_dir))
    assert done.returncode == 0, done.stderr
    pid, sid, pgrp = map(int, (tmp_path / "work" / "stub").read_text().split())
    try:
        assert int(done.stdout.split()[-1]) == pid  # teardown kills podman itself
        assert sid != os.getsid(0) and pgrp != os.getpgrp()
    finally:
        os.kill(pid, signal.SIGTERM)


COMPOSE_TEST = Path(__file__).resolve().parents[2] / "scripts" / "compose-test.sh"


@pytest.mark.parametrize("words", [
    ["docker", "compose", "run", "--rm", "cli", "enqueue", "--to", "a@example.com", "--to",
     "b@example.com", "--subject", "Sales report — September 2026"],
    ["--body", "it's\ntwo lines", "--attach", "/attachments/compose-test/x y.xlsx", "$HOME", ""],
])
def test_the_enqueue_compose_test_says_is_a_line_that_runs_as_said(words: list[str]) -> None:
    """Issue 45 item 12: it printed `enqueue --to a@ b@ c@ d@`, which is no valid command. The
    line is now made from the words it runs (shell_words), quoted for a shell."""
    import shlex

    function = re.search(r"^shell_words\(\) \{$.*?^\}$", COMPOSE_TEST.read_text(),
                         re.MULTILINE | re.DOTALL)
    assert function is not None
    said = subprocess.run(["bash", "-c", f'{function[0]}\nshell_words "$@"', "_", *words],
                          capture_output=True, text=True, timeout=30, check=True).stdout
    assert shlex.split(said) == words
    script = COMPOSE_TEST.read_text()
    assert '$(shell_words docker compose run --rm cli "${enqueue[@]}")' in script
    assert 'compose run --rm -T cli "${enqueue[@]}"' in script
