"""The local stack script, scripts/services.sh, run as a developer runs it.

Two tests check the stack the suite runs on; the third starts and stops a second, separate stack
(own state dir and ports) so that stopping it cannot pull the services from other tests. That
one starts three JVMs' worth of services twice (about 45 s of CPU, a tenth of the suite's):
`make test-stack` runs it, make test does not.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

import pytest

from postroom.devkit.ports import free_ports, listening
from support.stack import REPO, dev_dir

SERVICES = REPO / "scripts" / "services.sh"
HOST = "127.0.0.1"

# One pytest-xdist worker runs these one after another (make test's --dist loadgroup): a second
# stack's start and stop is the heaviest thing the suite does, and the other tests run beside it.
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("stack-processes")]


def run_services(command: str, env: dict[str, str] | None = None) -> str:
    """Run ``services.sh COMMAND``; fail the test with its output unless it exits 0."""
    result = subprocess.run(
        [str(SERVICES), command], env=env, cwd=REPO, stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=110, check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"services.sh {command} exited {result.returncode}:\n{output}"
    return output


def processes() -> dict[int, tuple[str, str]]:
    """Every live process: pid -> (start time in clock ticks, command line).

    Zombies are left out: they have exited and wait only for init to reap them.
    """
    found: dict[int, tuple[str, str]] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # exited while we looked
        if fields[0] == "Z":
            continue
        # the start time tells a process from a later one that reuses its pid
        found[int(proc.name)] = (fields[19], cmdline)
    return found


def parent_of(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def stack_processes(markers: list[str], roots: list[int]) -> dict[int, tuple[str, str]]:
    """Processes whose command line names one of ``markers``, or that descend from ``roots``.

    PostgreSQL's workers show only "postgres: checkpointer" and the like, hence the descent.
    """
    everything = processes()
    ours: dict[int, tuple[str, str]] = {}
    for pid, (started, cmdline) in everything.items():
        ancestor: int | None = pid
        while ancestor and ancestor not in roots:
            ancestor = parent_of(ancestor)
        if ancestor or any(marker in cmdline for marker in markers):
            ours[pid] = (started, cmdline)
    return ours


def listening_addresses(pid: int) -> list[str]:
    """The local addresses of every TCP socket ``pid`` listens on (from ``ss``)."""
    result = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True, check=True,
                            timeout=10)
    return [line.split()[3] for line in result.stdout.splitlines() if f"pid={pid}," in line]


def test_up_twice_reports_already_running() -> None:
    kafka_port = int(os.environ.get("POSTROOM_DEV_KAFKA_PORT", "19092"))
    pg_port = int(os.environ.get("POSTROOM_DEV_PG_PORT", "15432"))
    registry_port = int(os.environ.get("POSTROOM_DEV_REGISTRY_PORT", "18081"))

    output = run_services("up")

    assert "kafka: already running" in output, output
    assert "postgres: already running" in output, output
    assert "registry: already running" in output, output
    assert listening(kafka_port), f"Kafka does not answer on {HOST}:{kafka_port}"
    assert listening(pg_port), f"PostgreSQL does not answer on {HOST}:{pg_port}"
    assert listening(registry_port), f"the registry does not answer on {HOST}:{registry_port}"


def test_registry_listens_on_loopback_only() -> None:
    pid = int((dev_dir() / "registry" / "registry.pid").read_text())
    addresses = listening_addresses(pid)
    # its API and Quarkus's management interface, which binds 0.0.0.0:9000 unless told
    assert len(addresses) >= 2, addresses
    assert all(a.rpartition(":")[0] in (HOST, "[::ffff:127.0.0.1]") for a in addresses), addresses


@pytest.mark.slow
@pytest.mark.lifecycle
@pytest.mark.timeout(300)  # three services started twice on a loaded 2-CPU machine
def test_down_leaves_no_process(tmp_path: Path) -> None:
    dev_dir = tmp_path / "dev"
    kafka_port, controller_port, pg_port, secure_port, registry_port = free_ports(5)
    env = {k: v for k, v in os.environ.items() if not k.startswith("POSTROOM_DEV_")}
    env |= {
        "POSTROOM_DEV_DIR": str(dev_dir),
        "POSTROOM_DEV_KAFKA_PORT": str(kafka_port),
        "POSTROOM_DEV_KAFKA_CONTROLLER_PORT": str(controller_port),
        "POSTROOM_DEV_PG_PORT": str(pg_port),
        "POSTROOM_DEV_KAFKA_SECURE_PORT": str(secure_port),
        "POSTROOM_DEV_REGISTRY_PORT": str(registry_port),
    }
    markers = [str(dev_dir)]
    roots: list[int] = []
    try:
        output = run_services("up", env)
        assert listening(kafka_port)
        assert listening(pg_port)
        assert listening(secure_port)
        assert "the ACLs of postroom-" in output, output
        assert f"{HOST}:{kafka_port}" in (dev_dir / "env").read_text()
        for role in ("relay", "sender", "recorder", "admin"):
            role_env = (dev_dir / "secure" / f"{role}.env").read_text()
            assert f"POSTROOM_KAFKA_BOOTSTRAP_SERVERS={HOST}:{secure_port}" in role_env
            assert "sasl.password" not in role_env  # it is in the file the env file names
            assert (dev_dir / "secure" / f"{role}.properties").stat().st_mode & 0o077 == 0
        assert listening(registry_port)
        assert f"{HOST}:{registry_port}/apis/ccompat/v7" in (dev_dir / "env").read_text()

        # PostgreSQL runs outside the state dir (see services.sh); dev/pg links to it.
        pg_root = os.path.realpath(dev_dir / "pg")
        kafka_pid = int((dev_dir / "kafka" / "kafka.pid").read_text())
        postmaster_pid = int((Path(pg_root) / "data" / "postmaster.pid").read_text().split()[0])
        registry_pid = int((dev_dir / "registry" / "registry.pid").read_text())
        markers.append(pg_root)
        roots += [kafka_pid, postmaster_pid, registry_pid]
        before = stack_processes(markers, roots)
        # the scan must see the stack while it runs, or its empty answer below proves nothing
        assert kafka_pid in before
        assert postmaster_pid in before
        assert registry_pid in before
        assert len(before) > 3, before

        run_services("down", env)

        after = stack_processes(markers, roots)
        survivors = {pid: cmd for pid, (started, cmd) in processes().items()
                     if before.get(pid, ("", ""))[0] == started}
        assert after == {}, f"processes of the stopped stack remain: {after}"
        assert survivors == {}, f"processes of the stopped stack remain: {survivors}"
        for port in (kafka_port, controller_port, pg_port, secure_port, registry_port):
            assert not listening(port), f"port {port} still answers after down"

        # A machine that went down with the stack leaves the broker's pid file behind, naming a
        # dead process: the next up must start a broker, not take the old pid for a failed one.
        dead = subprocess.Popen(["true"])
        dead.wait()
        (dev_dir / "kafka" / "kafka.pid").write_text(f"{dead.pid}\n")
        output = run_services("up", env)
        assert "kafka: ready" in output, output
        # certificates and ACLs are made once per data dir; the SCRAM users, which a restarted
        # broker was seen to lose, are set again, so the roles' credentials still work
        assert "the ACLs of postroom-" not in output, output
        assert "making a throwaway CA" not in output, output
        assert listening(kafka_port)
        assert listening(secure_port)
        admin = subprocess.run(
            ["bash", "-c", f". {dev_dir / 'env'} && . {dev_dir / 'secure' / 'admin.env'} && "
                           f"{REPO / '.venv' / 'bin' / 'postroom'} check --role admin"],
            capture_output=True, text=True, timeout=120, check=False)
        # The admin authenticated and was answered: this stack has no topics yet, so that is
        # its verdict on them, not a refused credential.
        kafka = [line for line in admin.stdout.splitlines() if "kafka:" in line]
        assert kafka and "9 of 9 topics not usable by the admin" in kafka[0], admin.stdout
        assert "refused the credentials" not in admin.stdout, admin.stdout
        run_services("down", env)
        assert not listening(kafka_port)
    finally:
        subprocess.run([str(SERVICES), "clean"], env=env, cwd=REPO, stdin=subprocess.DEVNULL,
                       capture_output=True, timeout=110, check=False)
        # When down failed, leave no broker or cluster behind for the rest of the run.
        for pid in stack_processes(markers, roots):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
