"""Who a request is: tokens, the trusted proxy's header, the roles, the CSRF comparison."""

from __future__ import annotations

import pytest

from postroom.errors import ConfigError
from postroom.settings import Settings
from postroom.web import auth
from postroom.web.auth import Role

TOKENS = {"POSTROOM_WEB_OPERATOR_TOKEN": "o" * 20, "POSTROOM_WEB_READER_TOKEN": "r" * 20}


@pytest.mark.parametrize("given, expected", [
    ("o" * 20, ("operator token", Role.OPERATOR)), ("r" * 20, ("reader token", Role.READER)),
    ("o" * 19, None), ("", None), ("o" * 20 + " ", None)])
def test_tokens(given: str, expected: tuple[str, Role] | None) -> None:
    who = auth.by_token(given, Settings.from_env(TOKENS))
    assert (None if who is None else (who.who, who.role)) == expected


@pytest.mark.parametrize("peer, trusted", [
    ("10.1.2.3", True), ("10.2.0.1", False), ("::1", True), ("fe80::1", False),
    ("testclient", False), (None, False), ("", False), ("::ffff:10.1.2.3", True),
    ("::ffff:10.2.0.1", False)])
def test_trusted_peers(peer: str | None, trusted: bool) -> None:
    assert auth.is_trusted(peer, ("10.1.0.0/16", "::1/128")) is trusted


@pytest.mark.parametrize("header, expected", [
    ("Ops@Example.com", ("ops@example.com", Role.OPERATOR)),
    ("support@example.com", ("support@example.com", Role.READER)),
    ("a@example.com, ops@example.com", None), ("<ops@example.com>", None),
    ("no-at-sign", None), ("ops@example.com\r\nx", None), ("x" * 300 + "@example.com", None),
    (None, None), (["support@example.com", "ops@example.com"], None),
    (["ops@example.com", "ops@example.com"], None)])
def test_the_proxy_header(header: str | list[str] | None,
                          expected: tuple[str, Role] | None) -> None:
    settings = Settings.from_env({"POSTROOM_WEB_TRUSTED_PROXIES": "10.0.0.5",
                                  "POSTROOM_WEB_OPERATORS": "ops@example.com"})
    values = [] if header is None else [header] if isinstance(header, str) else header
    who = auth.by_proxy("10.0.0.5", values, settings)
    assert (None if who is None else (who.who, who.role)) == expected
    assert auth.by_proxy("10.0.0.6", values, settings) is None


@pytest.mark.parametrize("env, message", [
    ({}, "needs a way to sign in"),
    ({"POSTROOM_WEB_OPERATOR_TOKEN": "o" * 20, "POSTROOM_WEB_READER_TOKEN": "o" * 20},
     "is the operator's token"),
    ({"POSTROOM_WEB_OPERATOR_TOKEN": "o" * 20, "POSTROOM_WEB_OPERATORS": "a@example.com"},
     "needs POSTROOM_WEB_TRUSTED_PROXIES")])
def test_sign_in_settings_that_cannot_start(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        auth.check_configured(Settings.from_env(env))


@pytest.mark.parametrize("name, value, message", [
    ("POSTROOM_WEB_TRUSTED_PROXIES", "10.0.0.300", "not an IP address or network"),
    ("POSTROOM_WEB_TRUSTED_PROXIES", " , ", "expected addresses"),
    ("POSTROOM_WEB_OPERATORS", "not-an-address", "not of the form local@domain"),
    ("POSTROOM_WEB_TRACE_URL", "https://t.example/trace", "with {trace_id} in it"),
    ("POSTROOM_WEB_TRACE_URL", "javascript:{trace_id}", "with {trace_id} in it"),
    ("POSTROOM_WEB_TRACE_URL", "https://t.example/{trace_id}/{span}", "only {trace_id}"),
    ("POSTROOM_WEB_OPERATOR_TOKEN", "with a blank in it 0123", "no blank"),
    ("POSTROOM_WEB_LISTEN", "localhost", "expected host:port")])
def test_malformed_settings_are_refused_by_name(name: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=f"{name}: .*{message}"):
        Settings.from_env({name: value})


def test_a_token_never_shows() -> None:
    shown = repr(Settings.from_env(TOKENS))
    assert "o" * 20 not in shown and "r" * 20 not in shown


@pytest.mark.parametrize("expected, posted, matches", [
    ("abc", "abc", True), ("abc", "abd", False), ("abc", "", False), (None, "abc", False),
    ("", "", False), ("abc", None, False), ("abc", ["abc"], False)])
def test_csrf_comparison(expected: str | None, posted: object, matches: bool) -> None:
    assert auth.csrf_matches(expected, posted) is matches


def test_roles() -> None:
    assert Role.OPERATOR.may(Role.READER) and Role.OPERATOR.may(Role.OPERATOR)
    assert Role.READER.may(Role.READER) and not Role.READER.may(Role.OPERATOR)


def test_the_sign_in_throttle_refuses_a_peer_after_its_refusals_until_the_window_passes() -> None:
    now = [1000.0]
    throttle = auth.SignInThrottle(max_refusals=3, window_s=60.0, clock=lambda: now[0])
    for _ in range(3):
        assert not throttle.blocked("10.0.0.9")
        throttle.refused("10.0.0.9")
    assert throttle.blocked("10.0.0.9")
    assert not throttle.blocked("10.0.0.8")  # per peer
    now[0] += 59.0
    assert throttle.blocked("10.0.0.9")
    now[0] += 2.0
    assert not throttle.blocked("10.0.0.9")
    assert len(throttle) == 0  # nothing kept of a peer whose refusals are all past


@pytest.mark.parametrize("role, mac_token, holds", [
    (Role.OPERATOR, "o" * 20, True), (Role.READER, "r" * 20, True),
    (Role.OPERATOR, "r" * 20, False),  # a reader's session row rewritten to the operator role
    (Role.READER, "old-reader-token-0123", False),  # the token changed since
])
def test_a_session_holds_only_under_the_token_its_role_has_now(
        role: Role, mac_token: str, holds: bool) -> None:
    given = Settings.from_env(TOKENS)
    assert auth.session_holds("sid", role, auth.session_mac("sid", mac_token), given) is holds
    assert not auth.session_holds("sid", role, "mac-\u00e9", given)  # never a 500 on a row
    assert not auth.session_holds("other-sid", role, auth.session_mac("sid", mac_token), given)
