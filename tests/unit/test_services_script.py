"""Pieces of scripts/services.sh run in bash on stubs (no JVM, no port): the node count a later
`down` reads is written before any node starts, so a first cluster `up` that dies part-way leaves
no JVM that `down` cannot see."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from postroom.devkit.wait import wait_until

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


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def test_a_new_shell_finds_the_stack_by_the_ports_it_was_started_with_and_down_stops_it(
        tmp_path: Path) -> None:
    """Issue 45 item 6: started with POSTROOM_DEV_* ports, a new shell's status called the
    registry stopped (it looked for the default port), and its `down` deleted the registry's
    pid file and left the JVM running. The state dir as `up` leaves it (its ports file) and a
    stand-in for the registry (a process running 'quarkus-run.jar' in the registry's folder,
    listening on its port) instead of the JVMs."""
    dev = tmp_path / "dev"
    registry = dev / "registry"
    registry.mkdir(parents=True)
    port = _free_port()
    (dev / "ports").write_text(
        f"POSTROOM_DEV_KAFKA_PORT={_free_port()}\n"
        f"POSTROOM_DEV_KAFKA_CONTROLLER_PORT={_free_port()}\n"
        f"POSTROOM_DEV_KAFKA_SECURE_PORT={_free_port()}\n"
        f"POSTROOM_DEV_PG_PORT={_free_port()}\nPOSTROOM_DEV_REGISTRY_PORT={port}\n")
    stand_in = subprocess.Popen(
        [sys.executable, "-c", "import http.server, sys; http.server.HTTPServer(('127.0.0.1', "
         "int(sys.argv[1])), http.server.BaseHTTPRequestHandler).serve_forever()", str(port),
         "-jar", "quarkus-run.jar"], cwd=registry)
    try:
        (registry / "registry.pid").write_text(f"{stand_in.pid}\n")
        wait_until(lambda: _answers(port), 30, "the stand-in registry to listen")
        # A new shell: only the state dir, none of the ports.
        new_shell = {k: v for k, v in os.environ.items() if not k.startswith("POSTROOM_DEV_")}
        new_shell["POSTROOM_DEV_DIR"] = str(dev)
        status = subprocess.run([str(SERVICES), "status"], env=new_shell, capture_output=True,
                                text=True, timeout=60, check=False)
        assert (f"services: registry: running (pid {stand_in.pid}, http://127.0.0.1:{port}/"
                "apis/ccompat/v7, in-memory storage)") in status.stdout.splitlines(), status
        assert status.returncode == 3  # Kafka and PostgreSQL do not run
        down = subprocess.run([str(SERVICES), "down"], env=new_shell, capture_output=True,
                              text=True, timeout=60, check=False)
        assert down.returncode == 0, down.stdout + down.stderr
        assert f"services: registry: stopping pid {stand_in.pid}" in down.stdout.splitlines()
        assert stand_in.wait(timeout=10) is not None  # stopped, not orphaned
    finally:
        if stand_in.poll() is None:
            stand_in.kill()
            stand_in.wait()


@pytest.mark.parametrize("target", ["services-cluster", "services-cluster-down", "cluster-test"])
def test_the_cluster_targets_move_to_the_ports_they_are_given(target: str) -> None:
    """Issue 45 item 6: the cluster's ports were fixed in the Makefile."""
    made = subprocess.run(["make", "-n", target, "CLUSTER_KAFKA_PORT=39192", "CLUSTER_PG_PORT=35532"],
                          cwd=SERVICES.parents[1], capture_output=True, text=True, timeout=60,
                          check=False)
    assert made.returncode == 0, made.stderr
    [line] = [line for line in made.stdout.splitlines() if "scripts/services.sh" in line]
    assert "POSTROOM_DEV_KAFKA_PORT=39192 " in line and "POSTROOM_DEV_PG_PORT=35532 " in line
    assert "POSTROOM_DEV_DIR=.dev-cluster " in line


def _jit(function: str, asked: str, *args: str,
         jit_file: Path = Path("/nonexistent")) -> subprocess.CompletedProcess[str]:
    """services.sh's ``function`` with POSTROOM_DEV_KAFKA_JIT=``asked``."""
    script = f"""
        set -euo pipefail
        KAFKA_JIT={asked}
        node_name() {{ echo kafka; }}
        warn() {{ printf 'services: %s\\n' "$*" >&2; }}
        JIT_FILE={jit_file}
        eval "$(sed -n '/^jit_options() {{$/,/^}}$/p; /^jit_check() {{$/,/^}}$/p;
                        /^remembered_jit() {{$/,/^}}$/p' "{SERVICES}")"
        {function} {" ".join(args)}
        """
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30,
                          check=False)


def test_the_quick_jit_stops_at_c1_and_the_full_one_adds_nothing() -> None:
    assert _jit("jit_options", "quick").stdout.split() == ["-XX:TieredStopAtLevel=1"]
    assert _jit("jit_options", "full").stdout.split() == []


@pytest.mark.parametrize(("running", "asked", "said"), [
    ("quick", "quick", ""), ("full", "full", ""),
    ("quick", "full", "runs with the quick JIT, not the full one asked for"),
    ("full", "quick", "runs with the full JIT, not the quick one asked for"),
])
def test_a_running_broker_started_with_other_compilers_is_said_so(
        running: str, asked: str, said: str) -> None:
    flags = ["-XX:TieredStopAtLevel=1"] if running == "quick" else ["-XX:+UseG1GC"]
    stand_in = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", *flags])
    try:
        done = _jit("jit_check", asked, str(stand_in.pid))
    finally:
        stand_in.kill()
        stand_in.wait()
    assert done.returncode == 0, done.stderr
    if said:
        assert said in done.stderr
        assert "make services-down" in done.stderr
    else:
        assert done.stderr == ""


def test_a_jit_setting_neither_quick_nor_full_is_refused(tmp_path: Path) -> None:
    env = {**os.environ, "POSTROOM_DEV_DIR": str(tmp_path), "POSTROOM_DEV_KAFKA_JIT": "fast"}
    done = subprocess.run(["bash", str(SERVICES), "status"], env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode != 0
    assert "POSTROOM_DEV_KAFKA_JIT=fast is not quick" in done.stderr


def test_a_broker_gone_before_its_command_line_is_read_is_not_compared() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    done = _jit("jit_check", "quick", str(gone.pid))
    assert (done.returncode, done.stderr) == (0, "")


@pytest.mark.parametrize(("text", "read"), [
    ("full\n", "full"), ("quick\n", "quick"), ("full\r\n", "full"), ("", "quick"),
    ("full quick\n", "full"), ("fast\n", "quick"), ("\n\nfull\n", "quick"), (None, "quick"),
])
def test_a_damaged_jit_file_reads_as_quick(tmp_path: Path, text: str | None, read: str) -> None:
    """Never a refusal: a `down` must stop the stack whatever the file holds."""
    jit_file = tmp_path / "kafka-jit"
    if text is not None:
        jit_file.write_text(text, newline="")
    done = _jit("remembered_jit", "unused", jit_file=jit_file)
    assert (done.returncode, done.stdout, done.stderr) == (0, read + "\n", "")
