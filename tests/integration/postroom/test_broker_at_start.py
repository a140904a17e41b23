"""What each command says when Kafka is not there to use: a closed port, or topics never created.
The real CLI as a subprocess, its stderr counted line by line: one line naming the setting and
what was tried, a bounded wait, a clean non-zero exit; Ctrl-C during the wait, no traceback."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections.abc import Mapping

import pytest

from postroom.devkit.ports import free_ports
from postroom.devkit.processes import postroom_command
from postroom.devkit.scratch import scratch_env, unique_name
from postroom.devkit.wait import wait_until
from postroom.kafka import BROKER_WAIT_S
from postroom.settings import Settings
from support.commands import run_all as commands_run_all

pytestmark = pytest.mark.integration

# The broker wait, and what a command does beyond a refusal before any connection: a command
# that waited longer (or for ever) would take far more. The start of a Python process, which
# took 40 s on a loaded machine, is the refusal's too.
BOUNDED_S = BROKER_WAIT_S + 15.0
# How long run_all waits for a command before it kills it: far beyond BOUNDED_S on any machine.
GIVE_UP_S = 180.0
REFUSAL = "a refusal before any connection"
ROLES = ("relay", "sender", "recorder")
COMMANDS = {"check": ["check"], "relay": ["relay"], "sender": ["sender"],
            "recorder": ["recorder"], "topics create": ["topics", "create"],
            "dlq list": ["dlq", "list"], "lag": ["lag"],
            "purge": ["purge", "--older-than", "30d", "--dry-run"], "acls apply": ["acls", "apply"]}
# The line a command prints before it waits on the broker.
PROGRESS = ("creating topics with prefix ", "reading ", "applying ")
# How long a command may take to start and make its Kafka client on a loaded machine.
CLIENT_START_S = 60.0


def kafka_client_made(pid: int) -> bool:
    """Whether process ``pid`` runs librdkafka's threads (named ``rdk:...``): its imports are
    done and its client tries the bootstrap addresses."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    names = []
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/comm") as comm:
                names.append(comm.read())
        except OSError:
            continue  # the thread ended while we looked
    return any(name.startswith("rdk:") for name in names)


def run_all(commands: Mapping[str, list[str]], env: Mapping[str, str],
            ) -> tuple[dict[str, tuple[subprocess.CompletedProcess[str], float]], float]:
    """Run every command at once (each mostly waits), and beside them `postroom status` refused
    for a bad setting before it connects to anything; each command's result and its seconds,
    and the refusal's seconds."""
    argvs = {REFUSAL: ["status"], **commands}
    results = commands_run_all(
        [(argv, {**env, **({"POSTROOM_SMTP_PORT": "abc"} if name == REFUSAL else {})})
         for name, argv in argvs.items()], GIVE_UP_S)
    done = dict(zip(argvs, results, strict=True))
    refusal, refusal_s = done.pop(REFUSAL)
    assert refusal.returncode == 2, refusal.stderr
    return done, refusal_s


def said(proc: subprocess.CompletedProcess[str]) -> list[str]:
    """The lines a person reads on stderr, progress lines left out."""
    return [line for line in proc.stderr.splitlines() if not line.startswith(PROGRESS)]


@pytest.fixture
def closed_port_env(db_settings: Settings) -> dict[str, str]:
    """The stack's environment with a migrated schema of its own and two bootstrap addresses
    where nothing listens."""
    first, second = free_ports(2)
    return {**os.environ, **scratch_env(db_settings),
            "POSTROOM_KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{first},127.0.0.1:{second}"}


def test_a_closed_kafka_port_is_one_line_naming_the_setting_and_the_addresses_tried(
        closed_port_env: dict[str, str]) -> None:
    servers = closed_port_env["POSTROOM_KAFKA_BOOTSTRAP_SERVERS"]
    first, second = servers.split(",")
    done, refusal_s = run_all(COMMANDS, closed_port_env)
    for name, (proc, seconds) in done.items():
        shown = f"postroom {name} (exit {proc.returncode}, {seconds:.1f}s):\n{proc.stderr}"
        assert proc.returncode == 1, shown
        assert seconds < refusal_s + BOUNDED_S, shown
        assert "Traceback" not in proc.stderr and "%3|" not in proc.stderr, shown
        if name == "check":
            assert said(proc) == [], shown
            [line] = [line for line in proc.stdout.splitlines() if " kafka: " in line]
        else:
            [line] = said(proc)
            assert line.startswith(f"postroom {name.split()[0]}: error: "), shown
        assert f"at {servers} (POSTROOM_KAFKA_BOOTSTRAP_SERVERS) within {BROKER_WAIT_S:g}s" in line
        assert f"tried {first} (Connection refused), {second} (Connection refused)" in line


@pytest.mark.parametrize("argv", [["topics", "create"], ["lag"], ["relay"], ["sender"]],
                         ids=" ".join)
def test_ctrl_c_while_waiting_for_the_broker_stops_at_once_without_a_traceback(
        closed_port_env: dict[str, str], argv: list[str]) -> None:
    process = subprocess.Popen(postroom_command(*argv), env=closed_port_env, text=True,
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    # In the wait: the imports are done and the client tries its addresses (a fixed 3 s was not
    # always that far on a loaded machine).
    wait_until(lambda: kafka_client_made(process.pid) or process.poll() is not None,
               CLIENT_START_S, f"postroom {argv[0]} to make its Kafka client")
    assert process.poll() is None, process.communicate()[1]
    process.send_signal(signal.SIGINT)
    interrupted = time.monotonic()
    _, err = process.communicate(timeout=GIVE_UP_S)
    # Before the broker wait would have ended by itself (and said so, exit 1, not 130): 3 s was
    # short for a Python process's shutdown on a loaded machine.
    assert time.monotonic() - interrupted < BROKER_WAIT_S, err
    assert process.returncode == 130, err
    assert [line for line in err.splitlines() if not line.startswith(PROGRESS)] == [
        f"postroom {argv[0]}: interrupted"]


def test_a_role_started_before_topics_create_stops_naming_it(
        db_settings: Settings, stack_settings: Settings) -> None:
    prefix = f"{unique_name('b_notopics')}."  # no topic of it exists
    env = {**os.environ, **scratch_env(db_settings), "POSTROOM_TOPIC_PREFIX": prefix}
    done, refusal_s = run_all({role: [role] for role in ROLES}, env)
    for name, (proc, seconds) in done.items():
        shown = f"postroom {name} (exit {proc.returncode}, {seconds:.1f}s):\n{proc.stderr}"
        assert proc.returncode == 1, shown
        assert seconds < refusal_s + BOUNDED_S, shown
        [line] = said(proc)
        assert line == (
            f"postroom {name}: error: 9 of 9 topics missing on "
            f"{stack_settings.kafka_bootstrap_servers}: {prefix}email.high, {prefix}email.normal, "
            f"{prefix}email.low, {prefix}email.retry.1, {prefix}email.retry.2, "
            f"{prefix}email.retry.3, {prefix}email.retry.4, {prefix}email.dead, "
            f"{prefix}email.results; run `postroom topics create` (with the same "
            f"POSTROOM_TOPIC_PREFIX='{prefix}')"), shown


def test_a_role_client_whose_broker_is_gone_says_each_error_once_not_a_stream(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        capfd: pytest.CaptureFixture[str]) -> None:
    from postroom import kafka

    repeats = kafka.RepeatedLines()
    monkeypatch.setattr(kafka.config, "_repeats", repeats)
    monkeypatch.setattr(kafka.config, "_client_log", kafka.ClientLog(repeats))
    [port] = free_ports(1)
    producer = kafka.make_producer(Settings(kafka_bootstrap_servers=f"127.0.0.1:{port}"))
    producer.produce("t", b"v")
    deadline = time.monotonic() + 5.0
    with caplog.at_level(logging.DEBUG, logger="postroom"):
        while time.monotonic() < deadline:
            producer.poll(0.1)  # serves the client's errors and log lines, as a role does
    producer.purge()
    producer.flush(1)
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert 1 <= len(said) <= 3, said  # the transport error, its log line, all brokers down
    assert all("Connection refused" in line or "brokers are down" in line for line in said), said
    assert "%3|" not in capfd.readouterr().err
