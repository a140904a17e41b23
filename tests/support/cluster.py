"""The three-broker stack of scripts/services.sh (POSTROOM_DEV_BROKERS=3) for the cluster tests:
its brokers stopped and started by the script, the secured listener's role env files."""

from __future__ import annotations

import dataclasses
import subprocess
import time
from pathlib import Path

import pytest

from postroom.kafka import make_admin
from postroom.settings import Settings
from support.stack import dev_dir

REPO = Path(__file__).resolve().parents[2]
SERVICES = REPO / "scripts" / "services.sh"
BROKERS = 3
BACK_IN_SYNC_S = 90.0


def services(*args: str) -> str:
    """scripts/services.sh ARGS on the stack the env names (POSTROOM_DEV_DIR and ports)."""
    done = subprocess.run([str(SERVICES), *args], capture_output=True, text=True, timeout=180,
                          check=False)
    if done.returncode != 0:
        pytest.fail(f"scripts/services.sh {' '.join(args)} failed: {done.stdout}{done.stderr}")
    return done.stdout


@dataclasses.dataclass
class Brokers:
    """Stops and starts the stack's brokers; remembers which to start again."""

    settings: Settings
    down: set[int] = dataclasses.field(default_factory=set)

    def stop(self, node: int) -> None:
        self.down.add(node)
        services("stop-broker", str(node))

    def kill(self, node: int) -> None:
        self.down.add(node)
        services("kill-broker", str(node))

    def start(self, node: int) -> None:
        services("start-broker", str(node))
        self.down.discard(node)

    def leader(self, topic: str, partition: int = 0) -> int:
        return int(services("leader", topic, str(partition)).split()[-1])

    def restore(self) -> None:
        for node in sorted(self.down):
            self.start(node)
        admin = make_admin(self.settings)
        deadline = time.monotonic() + BACK_IN_SYNC_S
        while time.monotonic() < deadline:
            metadata = admin.list_topics(timeout=10)
            if len(metadata.brokers) == BROKERS and all(
                    len(p.isrs) == len(p.replicas) for t in metadata.topics.values()
                    for p in t.partitions.values()):
                return
            time.sleep(1)
        pytest.fail(f"the cluster's partitions are not back in sync {BACK_IN_SYNC_S:g}s after "
                    "its brokers were started again")



def role_env(role: str) -> dict[str, str]:
    """The POSTROOM_* variables <dev dir>/secure/<role>.env sets (scripts/services.sh up)."""
    path = dev_dir() / "secure" / f"{role}.env"
    if not path.is_file():
        pytest.fail(f"{path} is missing: run `make services-cluster`")
    out = subprocess.run(["bash", "-c", '. "$1" && env -0', "_", str(path)], env={},
                         capture_output=True, check=True).stdout.decode()
    pairs = (item.partition("=") for item in out.split("\0") if item)
    return {k: v for k, _, v in pairs if k.startswith("POSTROOM_")}
