"""scripts/services.sh's per-node commands, which the failover suite's faults go through: refused
where they cannot act (no service needed), and on the cluster itself (marker failover)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from chaos.failover import BROKERS
from chaos.harness import PROBE_TOPIC, SERVICES, Run
from chaos.mailserver import ChaosMailServer
from postroom.kafka import make_admin
from postroom.settings import Settings


def services(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SERVICES), *args], capture_output=True, text=True, check=False,
                          timeout=180, env=env)


def own_env(dev_dir: Path, brokers: str | None) -> dict[str, str]:
    """A state dir of its own, so nothing here can reach a running stack."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("POSTROOM_DEV_")}
    env["POSTROOM_DEV_DIR"] = str(dev_dir)
    if brokers is not None:
        env["POSTROOM_DEV_BROKERS"] = brokers
    return env


@pytest.mark.parametrize("command", ["kill-broker", "stop-broker", "start-broker",
                                     "kill-controller", "controller"])
def test_node_commands_need_a_cluster(tmp_path: Path, command: str) -> None:
    done = services(command, "1", env=own_env(tmp_path, None))
    assert done.returncode == 1, done
    assert "works on a cluster only" in done.stderr, done.stderr


@pytest.mark.parametrize("node", ["0", "4", "x", ""])
def test_a_node_outside_the_cluster_is_refused(tmp_path: Path, node: str) -> None:
    done = services("kill-broker", node, env=own_env(tmp_path, "3"))
    assert done.returncode == 1, done
    assert f"node '{node}' is not one of 1..3" in done.stderr, done.stderr


@pytest.mark.parametrize("brokers", ["0", "10", "three"])
def test_a_broker_count_out_of_range_is_refused(tmp_path: Path, brokers: str) -> None:
    done = services("status", env=own_env(tmp_path, brokers))
    assert done.returncode == 1, done
    assert "is not a node count from 1 to 9" in done.stderr, done.stderr


@pytest.mark.chaos
@pytest.mark.failover
@pytest.mark.integration
@pytest.mark.timeout(300)
def test_the_cluster_commands_act_on_the_cluster(stack_settings: Settings,
                                                 tmp_path: Path) -> None:
    """controller and leader name running nodes; a broker stopped cleanly gives up its
    leaderships and comes back; writes go on with one broker down."""
    if os.environ.get("POSTROOM_DEV_BROKERS") != str(BROKERS):
        pytest.fail("run on the cluster: . .dev-cluster/env (make services-cluster)")
    controller = services("controller")
    assert controller.returncode == 0, controller
    assert 1 <= int(controller.stdout) <= BROKERS
    with ChaosMailServer() as mail:
        run = Run(stack_settings, "cluster-commands", tmp_path, mail)
        run.ensure_probe_topic()  # one partition, three replicas
        assert run.write_refused() is None
        leader = int(services("leader", PROBE_TOPIC, "0").stdout)
        assert 1 <= leader <= BROKERS
        try:
            assert services("stop-broker", str(leader)).returncode == 0
            moved = int(services("leader", PROBE_TOPIC, "0").stdout)
            assert moved not in (leader, -1), moved
            assert run.write_refused() is None  # two replicas of three: writes go on
        finally:
            started = services("start-broker", str(leader))
        assert started.returncode == 0, started
        run.wait_in_sync()
        run.engine.dispose()
    assert len(make_admin(stack_settings).list_topics(timeout=30).brokers) == BROKERS
