"""The host ports of postroom's local stacks never meet: the dev stack (scripts/services.sh's
defaults), the three-broker cluster (the Makefile's CLUSTER_ENV), docker-compose.yml's defaults
and make compose-test's (scripts/compose-test.sh), so any two of them run side by side.

Read, not run: the ports are taken from the files as written.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NODE_PORT_STRIDE = 10  # scripts/services.sh: node N's ports are node 1's + 10 x (N - 1)
CLUSTER_NODES = 3
EPHEMERAL_FROM = 32768  # Linux's default ip_local_port_range starts here


def _services_defaults() -> dict[str, int]:
    text = (ROOT / "scripts" / "services.sh").read_text()
    found = {name: int(port) for name, port in re.findall(
        r"^(KAFKA_PORT|CONTROLLER_PORT|PG_PORT|REGISTRY_PORT)=\$\{\1:-(\d+)\}$",
        text, re.MULTILINE)}
    assert found.keys() == {"KAFKA_PORT", "CONTROLLER_PORT", "PG_PORT", "REGISTRY_PORT"}
    assert "SECURE_PORT=$((10#$KAFKA_PORT + 2))" in text  # the secure listener's default
    return found


def dev_stack_ports() -> set[int]:
    found = _services_defaults()
    return {*found.values(), found["KAFKA_PORT"] + 2}


def cluster_ports() -> set[int]:
    ports = {name: int(port) for name, port in re.findall(
        r"^CLUSTER_(\w+)_PORT \?= (\d+)$", (ROOT / "Makefile").read_text(), re.MULTILINE)}
    assert ports.keys() == {"KAFKA", "KAFKA_CONTROLLER", "KAFKA_SECURE", "PG", "REGISTRY"}
    nodes = {ports[name] + NODE_PORT_STRIDE * n for n in range(CLUSTER_NODES)
             for name in ("KAFKA", "KAFKA_CONTROLLER", "KAFKA_SECURE")}
    return nodes | {ports["PG"], ports["REGISTRY"]}


def compose_ports() -> set[int]:
    text = (ROOT / "docker-compose.yml").read_text()
    return {int(port) for port in re.findall(r"\$\{HOST_PORT_[A-Z]+:-(\d+)\}", text)}


def compose_test_ports() -> set[int]:
    (default,) = re.findall(r'POSTROOM_COMPOSE_PORTS:-([\d ]+)\}',
                            (ROOT / "scripts" / "compose-test.sh").read_text())
    return {int(port) for port in default.split()}


STACKS = {"dev stack": dev_stack_ports, "cluster": cluster_ports,
          "docker-compose.yml": compose_ports, "compose-test": compose_test_ports}


def test_each_stack_names_its_ports() -> None:
    assert len(dev_stack_ports()) == 5
    assert len(cluster_ports()) == 3 * CLUSTER_NODES + 2
    assert len(compose_ports()) == 4
    assert len(compose_test_ports()) == 4


@pytest.mark.parametrize(("one", "other"), [
    (a, b) for i, a in enumerate(STACKS) for b in list(STACKS)[i + 1:]])
def test_no_two_stacks_share_a_port(one: str, other: str) -> None:
    assert STACKS[one]() & STACKS[other]() == set()


@pytest.mark.parametrize("stack", STACKS)
def test_every_port_is_below_the_ephemeral_range(stack: str) -> None:
    # A port the kernel hands out to outgoing connections may be taken by one when the stack starts.
    assert {port for port in STACKS[stack]() if port >= EPHEMERAL_FROM} == set()


def test_readmes_pipeline_by_hand_runs_its_smtp_server_apart_from_the_compose_files_ports() -> None:
    """Issue 45 item 12: README's by-hand devsmtp listened on 8025, Mailpit's published port in
    docker-compose.yml: the two could not run side by side."""
    from postroom.devkit.devsmtp import DEFAULT_PORT

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## The pipeline by hand\n", 1)[1].split("\n## ", 1)[0]
    ports = {int(p) for p in re.findall(r"(?:--port |SMTP_PORT=)(\d+)", section)}
    assert ports == {DEFAULT_PORT}  # the server's and the sender's, devsmtp's default
    assert DEFAULT_PORT not in compose_ports() | dev_stack_ports() | cluster_ports()
