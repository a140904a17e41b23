"""The bounce and suppression settings: return-path address, signing secrets (masked, rotation),
the intake's listen address, token age, suppression expiry and the soft-bounce limit."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest

from postroom import verp
from postroom.errors import ConfigError
from postroom.settings import BOUNCE_LOCAL_MAX_CHARS, Settings

P = "POSTROOM_"
KEY = "0123456789abcdef-secret"
OLD = "fedcba9876543210-older"


def test_defaults_leave_the_feature_off() -> None:
    settings = Settings()
    assert settings.bounce_address is None
    assert settings.bounce_secrets == ()
    assert settings.bounce_listen == ("127.0.0.1", 2526)
    assert settings.bounce_token_max_age_s == 60 * 86400
    assert settings.suppression_expiry_s == 30 * 86400
    assert settings.soft_bounce_limit == 0


@pytest.mark.parametrize(("name", "raw", "field", "expected"), [
    ("BOUNCE_SECRET", KEY, "bounce_secrets", (KEY.encode(),)),
    ("BOUNCE_SECRET", f" {KEY} , {OLD} ", "bounce_secrets", (KEY.encode(), OLD.encode())),
    ("BOUNCE_LISTEN", "0.0.0.0:25", "bounce_listen", ("0.0.0.0", 25)),  # noqa: S104
    ("BOUNCE_LISTEN", "[::1]:2526", "bounce_listen", ("::1", 2526)),
    ("BOUNCE_LISTEN", "mx.internal:2525", "bounce_listen", ("mx.internal", 2525)),
    ("BOUNCE_LISTEN", ":2600", "bounce_listen", ("0.0.0.0", 2600)),  # noqa: S104
    ("BOUNCE_TOKEN_MAX_AGE", "7d", "bounce_token_max_age_s", 7 * 86400.0),
    ("SUPPRESSION_EXPIRY", "90d", "suppression_expiry_s", 90 * 86400.0),
    ("SUPPRESSION_EXPIRY", "36500d", "suppression_expiry_s", 36500 * 86400.0),
    ("BOUNCE_TOKEN_MAX_AGE", "36500d", "bounce_token_max_age_s", 36500 * 86400.0),
    ("SOFT_BOUNCE_LIMIT", "5", "soft_bounce_limit", 5),
    ("SOFT_BOUNCE_LIMIT", "0", "soft_bounce_limit", 0),
])
def test_from_env_parses(name: str, raw: str, field: str, expected: Any) -> None:
    assert getattr(Settings.from_env({P + name: raw}), field) == expected


def test_an_address_with_its_secret() -> None:
    settings = Settings.from_env({P + "BOUNCE_ADDRESS": " bounces@bounce.example.com ",
                                  P + "BOUNCE_SECRET": KEY})
    assert settings.bounce_address == "bounces@bounce.example.com"
    assert settings.bounce_secrets == (KEY.encode(),)


def test_an_address_without_a_secret_is_refused_naming_both() -> None:
    with pytest.raises(ConfigError, match="POSTROOM_BOUNCE_SECRET") as caught:
        Settings.from_env({P + "BOUNCE_ADDRESS": "bounces@bounce.example.com"})
    assert caught.value.setting == P + "BOUNCE_ADDRESS"
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(("name", "raw", "problem"), [
    ("BOUNCE_ADDRESS", "Bounces <b@example.com>", "invalid local part"),
    ("BOUNCE_ADDRESS", "bounces", "local@domain"),
    ("BOUNCE_ADDRESS", "bouncés@example.com", "ASCII"),
    ("BOUNCE_ADDRESS", "b" * 29 + "@example.com", "at most 28"),
    ("BOUNCE_SECRET", "short", "shorter than 16 bytes"),
    ("BOUNCE_SECRET", f"{KEY},tiny", "secret 2 is shorter"),
    ("BOUNCE_SECRET", " , ", "no secret"),
    ("BOUNCE_LISTEN", "2526", "host:port"),
    ("BOUNCE_LISTEN", "host:99999", "TCP port"),
    ("BOUNCE_LISTEN", "a b:25", "host:port"),
    ("BOUNCE_TOKEN_MAX_AGE", "forever", "not a duration"),
    ("SUPPRESSION_EXPIRY", "0", "positive"),
    # A date computed from these would leave what a datetime holds (issue 24's review: the
    # recorder failed at the first bounce, postroom bounces at start).
    ("SUPPRESSION_EXPIRY", "3000000d", "at most 100 years"),
    ("SUPPRESSION_EXPIRY", "36501d", "at most 100 years"),
    ("BOUNCE_TOKEN_MAX_AGE", "2000000000d", "at most 100 years"),
    ("SOFT_BOUNCE_LIMIT", "-1", r"0 \(off\) or more"),
])
def test_malformed_values_are_refused_by_name(name: str, raw: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem) as caught:
        Settings.from_env({P + name: raw, P + "BOUNCE_SECRET": KEY} if name == "BOUNCE_ADDRESS"
                          else {P + name: raw})
    assert caught.value.setting == P + name


def test_a_short_secret_is_not_echoed() -> None:
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({P + "BOUNCE_SECRET": "hunter2"})
    assert "hunter2" not in str(caught.value)


def test_secrets_never_show(tmp_path: Path) -> None:
    settings = Settings.from_env({P + "BOUNCE_ADDRESS": "b@example.com",
                                  P + "BOUNCE_SECRET": f"{KEY},{OLD}"})
    for shown in (repr(settings), str(settings)):
        assert "0123456789" not in shown and "fedcba" not in shown
        assert "bounce_secrets=('********', '********')" in shown


def test_secrets_from_a_file_one_a_line_or_comma_separated(tmp_path: Path) -> None:
    path = tmp_path / "bounce.key"
    path.write_text(f"{KEY}\n{OLD},{KEY}x\n")
    settings = Settings.from_env({P + "BOUNCE_SECRET_FILE": str(path)})
    assert settings.bounce_secrets == (KEY.encode(), OLD.encode(), (KEY + "x").encode())


def test_a_secret_file_and_a_secret_are_not_both_taken(tmp_path: Path) -> None:
    path = tmp_path / "bounce.key"
    path.write_text(KEY)
    with pytest.raises(ConfigError, match="not both") as caught:
        Settings.from_env({P + "BOUNCE_SECRET_FILE": str(path), P + "BOUNCE_SECRET": OLD})
    assert caught.value.setting == P + "BOUNCE_SECRET_FILE"


def test_a_missing_secret_file_is_one_line_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="No such file") as caught:
        Settings.from_env({P + "BOUNCE_SECRET_FILE": str(tmp_path / "missing\nkey")})
    assert caught.value.setting == P + "BOUNCE_SECRET_FILE"
    assert "\n" not in str(caught.value)


def test_the_longest_bounce_address_leaves_room_for_the_longest_token() -> None:
    """settings.BOUNCE_LOCAL_MAX_CHARS against postroom.verp itself: the largest row id on the
    last day verp dates, under a 28-character local part, makes a return path verp accepts."""
    address = "b" * BOUNCE_LOCAL_MAX_CHARS + "@bounce.example.com"
    assert Settings.from_env({P + "BOUNCE_ADDRESS": address, P + "BOUNCE_SECRET": KEY})
    last_day = dt.datetime(6568, 8, 17, 12, tzinfo=dt.UTC)
    token = verp.make_token(verp.OUTBOX_ID_MAX, KEY.encode(), last_day)
    local = verp.return_path(address, token).rpartition("@")[0]
    assert len(local) == verp.LOCAL_PART_MAX_CHARS


def test_the_longest_token_age_is_one_the_intake_can_use() -> None:
    from postroom.bounces.service import bounce_config

    settings = Settings.from_env({P + "BOUNCE_ADDRESS": "bounces@bounce.example.com",
                                  P + "BOUNCE_SECRET": KEY, P + "BOUNCE_TOKEN_MAX_AGE": "36500d"})
    assert bounce_config(settings).max_age == dt.timedelta(days=36500)
