"""The `postroom` command line as argparse reads it: commands, help, and arguments refused before
any setting is read or any service is touched."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from postroom.cli import build_parser, main
from postroom.settings import FIELDS

COMMANDS = ["db", "topics", "schemas", "acls", "enqueue", "relay", "sender", "recorder", "bounces",
            "web", "check",
            "lag", "dlq", "requeue", "report", "purge", "devsmtp", "status", "suppression"]
SUBCOMMANDS = [["db", "upgrade"], ["topics", "create"], ["schemas", "register"], ["acls"],
               ["enqueue"], ["relay"],
               ["sender"], ["recorder"], ["bounces"], ["web"], ["check"], ["lag"], ["dlq", "list"],
               ["dlq", "replay"],
               ["requeue"], ["report", "failures"], ["purge"], ["status"],
               ["suppression", "list"], ["suppression", "add"], ["suppression", "remove"]]
README = Path(__file__).resolve().parents[3] / "README.md"
ENQUEUE = ["enqueue", "--key", "k", "--to", "a@example.com", "--subject", "S", "--body", "b"]


def parse_exit(argv: list[str]) -> int | str | None:
    """The exit code argparse stops with for ``argv``; fails if it parses."""
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(argv)
    return exited.value.code


@pytest.fixture(autouse=True)
def _fixed_width(monkeypatch: pytest.MonkeyPatch) -> None:
    # argparse wraps help to the terminal's width; the tests read it at a known one.
    monkeypatch.setenv("COLUMNS", "100")


def test_help_lists_every_command_and_every_setting(capsys: pytest.CaptureFixture[str]) -> None:
    assert parse_exit(["--help"]) == 0
    out = capsys.readouterr().out
    listed = re.findall(r"^    (\w+)\s", out, flags=re.MULTILINE)
    assert listed == COMMANDS
    for name in [*FIELDS, "POSTROOM_SMTP_PASSWORD_FILE", "POSTROOM_KAFKA_CONFIG_FILE",
                 "POSTROOM_BOUNCE_SECRET_FILE"]:
        assert re.search(rf"^  {name}$", out, flags=re.MULTILINE), name
    assert parse_exit(["--version"]) == 0
    assert capsys.readouterr().out.startswith("postroom ")


@pytest.mark.parametrize("command", SUBCOMMANDS, ids=" ".join)
def test_every_command_has_help(capsys: pytest.CaptureFixture[str], command: list[str]) -> None:
    assert parse_exit([*command, "--help"]) == 0
    assert "usage:" in capsys.readouterr().out


def test_devsmtp_has_help_of_its_own(capsys: pytest.CaptureFixture[str]) -> None:
    # `postroom devsmtp` hands its arguments to the dev server's parser, settings unread.
    with pytest.raises(SystemExit) as exited:
        main(["devsmtp", "--help"])
    assert exited.value.code == 0
    assert "usage:" in capsys.readouterr().out


def test_no_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert parse_exit([]) == 2
    assert "required: COMMAND" in capsys.readouterr().err


def test_send_after_needs_a_timezone(capsys: pytest.CaptureFixture[str]) -> None:
    # Refused by the parser, so before the command could write anything.
    assert parse_exit([*ENQUEUE, "--send-after", "2026-10-02T07:00:00"]) == 2
    err = capsys.readouterr().err
    assert "--send-after: '2026-10-02T07:00:00' has no timezone" in err
    assert "2026-10-02T07:00:00+00:00" in err  # it says how to write it
    assert parse_exit([*ENQUEUE, "--send-after", "tomorrow"]) == 2
    assert "not an ISO 8601 time: 'tomorrow'" in capsys.readouterr().err
    args = build_parser().parse_args([*ENQUEUE, "--send-after", "2026-10-02T09:00:00+02:00"])
    assert args.send_after.isoformat() == "2026-10-02T09:00:00+02:00"


def test_a_signal_before_the_service_exists_stops_it_once_attached() -> None:
    import os
    import signal

    from postroom.cli.services import ShutdownSignals

    previous = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    try:
        signals = ShutdownSignals()
        os.kill(os.getpid(), signal.SIGTERM)   # while the service still connects
        stopped: list[str] = []
        signals.attach(lambda: stopped.append("now"))
        assert stopped == ["now"]
        assert signals.received == "SIGTERM"
        later = ShutdownSignals()
        later.attach(lambda: stopped.append("on signal"))
        assert stopped == ["now"]
        os.kill(os.getpid(), signal.SIGINT)
        assert stopped == ["now", "on signal"]
    finally:
        signal.signal(signal.SIGTERM, previous[0])
        signal.signal(signal.SIGINT, previous[1])


def _subparser(parser: argparse.ArgumentParser, path: list[str]) -> argparse.ArgumentParser:
    for name in path:
        [choices] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        parser = choices.choices[name]
    return parser


def _readme_synopses() -> list[str]:
    """What the first column of README's command table names: each `postroom ...` in it."""
    found = []
    for line in README.read_text(encoding="utf-8").splitlines():
        if line.startswith("| `postroom "):
            first = re.split(r"(?<!\\)\|", line)[1]
            found += [s.replace("\\|", "|") for s in re.findall(r"`postroom ([^`]*)`", first)]
    return found


@pytest.mark.parametrize("command", [*SUBCOMMANDS, ["devsmtp"]], ids=" ".join)
def test_readmes_command_table_names_every_option_of_every_command(command: list[str]) -> None:
    # The table and the parsers drifted apart (status --limit and devsmtp's flags were missing).
    from postroom.devkit.devsmtp_cli import build_parser as devsmtp_parser

    name = " ".join(command)
    synopsis = " ".join(s for s in _readme_synopses() if s == name or s.startswith(name + " "))
    assert synopsis, f"README's command table has no row for `postroom {name}`"
    parser = devsmtp_parser({}) if command == ["devsmtp"] else _subparser(build_parser(), command)
    for action in parser._actions:
        for option in action.option_strings:
            if option.startswith("--") and option != "--help":
                assert re.search(rf"{option}\b", synopsis), f"`postroom {name}`: {option}"
        if not action.option_strings and not isinstance(action, argparse._SubParsersAction):
            assert action.choices is None or any(c in synopsis for c in action.choices), name


@pytest.mark.parametrize("command", ["relay", "sender", "recorder"])
def test_the_roles_help_says_what_they_do(capsys: pytest.CaptureFixture[str],
                                          command: str) -> None:
    assert parse_exit([command, "--help"]) == 0
    out = capsys.readouterr().out
    description = out.split("\n\n")[1]
    assert len(description.split()) > 20, out
    assert "SIGTERM" in description


def test_status_rows_written_by_sql_stay_one_line_each() -> None:
    import datetime as dt

    from postroom.cli.status import _status_table

    when = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)
    rows = [{"message_key": "k\nFAKE", "recipient": "a@example.com\r\nb", "status": "sent",
             "attempts": 2, "created_at": when, "sent_at": when,
             "last_error": "451-4.3.0 first\r\n451 4.3.0 second"},
            {"message_key": "k", "recipient": "b@example.com", "status": "failed",
             "attempts": 1, "created_at": when, "sent_at": None, "last_error": None}]
    lines = _status_table(rows, with_key=True)
    assert len(lines) == 3
    assert lines[1].split("  ")[0] == "k FAKE"
    assert lines[1].endswith("(earlier attempt) 451-4.3.0 first 451 4.3.0 second")
    assert lines[2].endswith("  -")


def test_a_suppression_longer_than_a_century_is_a_usage_error(
        capsys: pytest.CaptureFixture[str]) -> None:
    # Its expiry would be past what a timestamp read back into Python holds.
    assert parse_exit(["suppression", "add", "a@example.com", "--expires", "3000000d"]) == 2
    assert "--expires: at most 100 years" in capsys.readouterr().err


def test_a_role_leaves_its_startup_objects_out_of_the_collectors_later_passes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Started, a role collects once and freezes what is left, so a full collection under load
    no longer walks the tens of thousands of objects its imports made, and runs young passes
    every YOUNG_PASS_EVERY containers; garbage of its start is collected first, not frozen, and
    what the running role makes is still collected, by the collector's own passes."""
    import gc
    import weakref

    import postroom.kafka
    import postroom.relay.db
    from postroom.cli import services
    from postroom.settings import Settings

    class Cycle:
        def __init__(self) -> None:
            self.me = self

    monkeypatch.setattr(postroom.relay.db, "check_schema_at_start", lambda engine: None)
    monkeypatch.setattr(postroom.kafka, "check_reachable", lambda settings: None)
    monkeypatch.setattr(postroom.kafka, "require_topics", lambda settings: None)
    settings = Settings(database_url="postgresql+psycopg://nobody@127.0.0.1:9/none")
    gc.collect()
    assert gc.get_freeze_count() == 0
    thresholds = gc.get_threshold()
    # No pass of the collector's own before the role's start: only its collect can free this.
    gc.set_threshold(10**9, *thresholds[1:])
    startup_garbage = Cycle()
    gone_at_start = weakref.ref(startup_garbage)
    del startup_garbage
    try:
        with services.service_start(settings):
            assert gone_at_start() is None
            assert gc.get_freeze_count() > 1_000  # this test process's modules, at least
            assert gc.get_threshold() == (services.YOUNG_PASS_EVERY, *thresholds[1:])
            assert gc.isenabled()
            later = Cycle()
            gone_later = weakref.ref(later)
            del later
            kept = [[] for _ in range(2 * services.YOUNG_PASS_EVERY)]  # new containers
            assert gone_later() is None  # a young pass ran, no explicit collect
            del kept
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)


def test_check_goes_on_past_a_database_error_that_is_not_a_lost_server(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A grant missing (a ProgrammingError) is one FAIL line, and the other checks still run."""
    import argparse

    import sqlalchemy as sa

    import postroom.relay.db
    import postroom.schemas.registry
    import postroom.sender.delivery
    import postroom.sender.smtp
    from postroom import kafka
    from postroom.cli.monitor import cmd_check
    from postroom.settings import Settings

    def no_grant(settings: Settings) -> str:
        raise sa.exc.ProgrammingError("SELECT 1", {},
                                      Exception("permission denied for table outbox"))

    monkeypatch.setattr(postroom.relay.db, "check_database", no_grant)
    for module, name in ((kafka, "check_kafka"), (kafka, "check_groups"),
                         (postroom.schemas.registry, "check_registry"), (postroom.sender.smtp, "check_smtp"),
                         (postroom.sender.delivery, "check_attachments")):
        monkeypatch.setattr(module, name, lambda *args: "fine")
    assert cmd_check(Settings(), argparse.Namespace(role=None)) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "FAIL  database: permission denied for table outbox"
    assert [line.split(":")[0] for line in out[1:]] == [
        "ok    kafka", "ok    groups", "ok    registry", "ok    smtp", "ok    attachments"]
