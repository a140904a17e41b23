"""The dev SMTP server's command line: flags, their environment variables, and bad values."""

from __future__ import annotations

import argparse

import pytest

from sender.devsmtp import parse_args, parse_defer


def test_defer_flag_syntax() -> None:
    assert parse_defer("ops@example.com:2") == ("ops@example.com", 2)
    for bad in ("ops@example.com", "ops@example.com:x", "ops@example.com:0", ":3"):
        with pytest.raises(argparse.ArgumentTypeError, match="ADDRESS:COUNT"):
            parse_defer(bad)


def test_flags_fall_back_to_environment_variables() -> None:
    env = {"POSTROOM_DEVSMTP_PORT": "2525", "POSTROOM_DEVSMTP_REJECT": "a@x.org, b@x.org",
           "POSTROOM_DEVSMTP_DEFER": "c@x.org:3", "POSTROOM_DEVSMTP_LATENCY": "50"}
    args = parse_args([], env)
    assert (args.port, args.reject, args.defer, args.latency) == (
        2525, ["a@x.org", "b@x.org"], [("c@x.org", 3)], 50)
    args = parse_args(["--port", "2626", "--reject", "z@x.org"], env)
    assert (args.port, args.reject) == (2626, ["z@x.org"])


def test_bad_defer_flag_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_args(["--defer", "ops@example.com"], {})
    assert exited.value.code == 2
    assert "ADDRESS:COUNT" in capsys.readouterr().err
