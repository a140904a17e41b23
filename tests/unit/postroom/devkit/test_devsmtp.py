"""The dev SMTP server's command line (flags, their environment variables, and bad values) and how
it reads a message's Message-ID."""

from __future__ import annotations

import argparse
import email.message
import email.policy

import pytest

from postroom.devkit.devsmtp_cli import parse_args, parse_defer
from postroom.devkit.devsmtp_handler import message_id_of


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
    assert int(parse_args([], {"POSTROOM_DEVSMTP_THROTTLE_EVERY": "10"}).throttle_every) == 10
    assert int(parse_args(["--throttle-every", "4"], {}).throttle_every) == 4


def test_a_negative_throttle_every_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_args(["--throttle-every", "-1"], {})
    assert exited.value.code == 2
    assert "--throttle-every must not be negative" in capsys.readouterr().err


def test_bad_defer_flag_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_args(["--defer", "ops@example.com"], {})
    assert exited.value.code == 2
    assert "ADDRESS:COUNT" in capsys.readouterr().err


@pytest.mark.parametrize(("raw", "expected"), [
    (b"Subject: x\r\nMessage-ID: <a@b>\r\n\r\nbody", "<a@b>"),
    (b"message-id:<a@b>\n\nbody", "<a@b>"),
    (b"Message-Id : \r\n <folded@b>\r\nTo: x\r\n\r\n", "<folded@b>"),
    (b"Subject: x\r\n\r\nMessage-ID: <in-the-body@b>\r\n", None),
    (b"X-Message-ID: <other@b>\r\n\r\n", None),
    (b"Message-ID-Copy: <other@b>\r\n\r\n", None),
    (b"Message-ID: \r\n\r\n", None),
    (b"Message-ID: <only-headers@b>", "<only-headers@b>"),
])
def test_the_message_id_is_read_from_the_header_block(raw: bytes, expected: str | None) -> None:
    assert message_id_of(raw) == expected


def test_the_message_id_is_what_the_email_package_reads() -> None:
    message = email.message.EmailMessage(policy=email.policy.SMTP)
    message["Subject"] = "Umsätze " * 20  # long and encoded: folded before the Message-ID
    message["Message-ID"] = "<20260930.0123456789abcdef.sales-report-september@reports.example.com>"
    message.set_content("Hallo")
    raw = message.as_bytes()
    parsed = email.message_from_bytes(raw, policy=email.policy.default)
    assert message_id_of(raw) == str(parsed["Message-ID"]).strip()


@pytest.mark.parametrize("port", ["-1", "65536", "99999"])
def test_a_port_out_of_range_is_a_usage_error_not_a_traceback(
        port: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_args(["--port", port], {})
    assert exited.value.code == 2
    assert f"--port must be from 0 (any free port) to 65535, got {port}" in capsys.readouterr().err
