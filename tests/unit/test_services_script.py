"""Pieces of scripts/services.sh run in bash on stubs (no JVM, no port): the node count a later
`down` reads is written before any node starts, so a first cluster `up` that dies part-way leaves
no JVM that `down` cannot see."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

SERVICES = Path(__file__).resolve().parents[2] / "scripts" / "services.sh"


def kafka_up(tmp_path: Path, brokers: int, fail_at: int | None) -> subprocess.CompletedProcess[str]:
    """services.sh's kafka_up with its node functions stubbed; node number ``fail_at`` dies."""
    script = f"""
        set -euo pipefail
        BROKERS={brokers} BROKERS_FILE={tmp_path}/kafka-brokers started=0
        all_nodes() {{
            local n
            if [[ $BROKERS -eq 1 ]]; then echo "1 broker"; return; fi
            for ((n = 1; n <= BROKERS; n++)); do echo "$n controller"; done
            for ((n = 1; n <= BROKERS; n++)); do echo "$n broker"; done
        }}
        select_node() {{ NODE="$1 ${{2:-}}"; }}
        node_start() {{
            started=$((started + 1))
            echo "start $NODE, count file: $(cat "$BROKERS_FILE" 2>/dev/null || echo none)"
            [[ $started -ne {fail_at or 0} ]] || exit 7  # as die does
            NODE_PID=$started
        }}
        node_wait() {{ echo "wait $NODE"; }}
        eval "$(sed -n '/^kafka_up() {{$/,/^}}$/p' "{SERVICES}")"
        kafka_up
        """
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30,
                          check=False)


def test_a_cluster_up_that_dies_part_way_has_recorded_its_node_count(tmp_path: Path) -> None:
    done = kafka_up(tmp_path, 3, fail_at=2)
    assert done.returncode == 7, done.stderr
    assert done.stdout.splitlines() == ["start 1 controller, count file: 3",
                                        "start 2 controller, count file: 3"]
    assert (tmp_path / "kafka-brokers").read_text() == "3\n"


@pytest.mark.parametrize("before", [None, "1\n"])
def test_the_single_broker_starts_as_before(tmp_path: Path, before: str | None) -> None:
    if before is not None:
        (tmp_path / "kafka-brokers").write_text(before)
    done = kafka_up(tmp_path, 1, fail_at=None)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["start 1 broker, count file: 1", "wait 1 broker"]
    assert (tmp_path / "kafka-brokers").read_text() == "1\n"
