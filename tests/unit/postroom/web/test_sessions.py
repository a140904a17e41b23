"""The console's sessions: the key that signs their cookies (POSTROOM_WEB_SESSION_KEY_FILE, shared
by replicas and kept over a restart, or one made at each start), the store that knows which are
signed in, and the idle limit, which the glance page's background refreshes do not hold off."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from starlette.testclient import TestClient

from postroom.errors import ConfigError
from postroom.settings import Settings
from postroom.settings_declare import SETTING_FILE_MAX_BYTES
from postroom.web.app import SESSION_COOKIE, SESSION_LIFETIME_S, SESSION_MAX_AGE_S, make_app
from postroom.web.auth import Role
from postroom.web.middleware import CONTENT_SECURITY_POLICY
from support.console import MemoryStore
from support.webclient import OPERATOR_TOKEN, READER_TOKEN, csrf_of, settings, sign_in

KEY = "k" * 40
OTHER_KEY = "q" * 40


class Clock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


def key_file(tmp_path: Path, key: str, name: str = "session-key") -> str:
    path = tmp_path / name
    path.write_text(key + "\n")
    return str(path)


def console(store: MemoryStore, **env: str) -> TestClient:
    """One instance of the console (a replica, or the one after a restart) over ``store``: the
    database every instance shares."""
    return TestClient(make_app(settings(**env), store), client=("127.0.0.1", 1),
                      follow_redirects=False)


# --- the key -------------------------------------------------------------------------------------
def test_the_key_file_is_read_without_its_line_break_and_never_shown(tmp_path: Path) -> None:
    given = Settings.from_env({"POSTROOM_WEB_SESSION_KEY_FILE": key_file(tmp_path, KEY)})
    assert given.web_session_key is not None and given.web_session_key.reveal() == KEY
    assert KEY not in repr(given)


@pytest.mark.parametrize("content, problem", [
    (None, "No such file or directory"),
    ("", "a session key needs at least 32 characters"),
    ("\n", "a session key needs at least 32 characters"),
    ("short-key\n", "a session key needs at least 32 characters"),
    ("a key with blanks in it, long enough to pass", "and no blank"),
    (b"\xff" * 40, "not UTF-8 text"),
    ("directory", "Is a directory"),
])
def test_a_missing_empty_or_unreadable_key_file_is_one_line_naming_it(
        tmp_path: Path, content: str | bytes | None, problem: str) -> None:
    path = tmp_path / "session-key"
    if content == "directory":
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match=problem) as caught:
        Settings.from_env({"POSTROOM_WEB_SESSION_KEY_FILE": str(path)})
    assert caught.value.setting == "POSTROOM_WEB_SESSION_KEY_FILE"
    assert str(caught.value).startswith("POSTROOM_WEB_SESSION_KEY_FILE: ")
    assert "\n" not in str(caught.value)


# --- replicas and restarts -----------------------------------------------------------------------
def test_a_session_signed_in_on_one_replica_is_signed_in_on_another_with_the_same_key(
        tmp_path: Path) -> None:
    store = MemoryStore()
    first = console(store, POSTROOM_WEB_SESSION_KEY_FILE=key_file(tmp_path, KEY))
    sign_in(first, READER_TOKEN)
    # Another replica, or this one restarted: its own copy of the same key.
    second = console(store, POSTROOM_WEB_SESSION_KEY_FILE=key_file(tmp_path, KEY, "copy"))
    second.cookies[SESSION_COOKIE] = first.cookies[SESSION_COOKIE]
    page = second.get("/search")
    assert page.status_code == 200 and "reader token (reader)" in page.text
    # Signed out on the second, the session ends on the first too.
    assert second.post("/signout", data={"csrf": csrf_of(page.text)}).status_code == 303
    assert first.get("/search").status_code == 303


def test_a_cookie_signed_with_another_key_is_not_signed_in(tmp_path: Path) -> None:
    store = MemoryStore()
    first = console(store, POSTROOM_WEB_SESSION_KEY_FILE=key_file(tmp_path, KEY))
    sign_in(first, READER_TOKEN)
    assert first.get("/search").status_code == 200
    other = console(store, POSTROOM_WEB_SESSION_KEY_FILE=key_file(tmp_path, OTHER_KEY, "other"))
    other.cookies[SESSION_COOKIE] = first.cookies[SESSION_COOKIE]
    assert other.get("/search").status_code == 303


def test_without_a_key_each_start_makes_its_own_and_says_so(
        caplog: pytest.LogCaptureFixture) -> None:
    store = MemoryStore()
    with caplog.at_level("INFO", logger="postroom.web.app"):
        first = console(store)
    said = [r.getMessage() for r in caplog.records if "SESSION_KEY_FILE" in r.getMessage()]
    assert len(said) == 1 and "a restart signs everyone out" in said[0]
    sign_in(first, READER_TOKEN)
    restarted = console(store)
    restarted.cookies[SESSION_COOKIE] = first.cookies[SESSION_COOKIE]
    assert restarted.get("/search").status_code == 303
    assert first.get("/search").status_code == 200


def test_signing_in_again_ends_the_session_before() -> None:
    store = MemoryStore()
    app = make_app(settings(), store)
    web = TestClient(app, client=("127.0.0.1", 1), follow_redirects=False)
    copy = TestClient(app, client=("127.0.0.1", 1), follow_redirects=False)
    sign_in(web, READER_TOKEN)
    copy.cookies[SESSION_COOKIE] = web.cookies[SESSION_COOKIE]
    page = copy.get("/search")
    assert page.status_code == 200  # the copy works while its session lives
    again = web.post("/signin", data={"csrf": csrf_of(page.text), "token": READER_TOKEN})
    assert again.status_code == 303 and web.get("/search").status_code == 200
    assert len(store.sessions) == 1
    assert copy.get("/search").status_code == 303


# --- the idle limit ------------------------------------------------------------------------------
def test_a_session_not_used_for_eight_hours_is_signed_out() -> None:
    clock = Clock()
    store = MemoryStore(clock=clock)
    web = console(store)
    sign_in(web, READER_TOKEN)
    clock.now_s += SESSION_LIFETIME_S - SESSION_MAX_AGE_S
    assert web.get("/search").status_code == 200  # used: the eight hours start again
    clock.now_s += SESSION_MAX_AGE_S - 1  # (within the lifetime)
    assert web.get("/search").status_code == 200
    clock.now_s += SESSION_MAX_AGE_S
    assert web.get("/search").status_code == 303
    fresh = console(store)  # within its lifetime, only idle
    sign_in(fresh, READER_TOKEN)
    clock.now_s += SESSION_MAX_AGE_S
    assert fresh.get("/search").status_code == 303


def test_the_glance_pages_refreshes_do_not_keep_an_idle_session_signed_in() -> None:
    """A tab left open on the glance page asks /glance.json every few seconds: that is not
    someone using the console, so the session still ends eight hours after the last page."""
    clock = Clock()
    store = MemoryStore(clock=clock)
    web = console(store)
    sign_in(web, READER_TOKEN)
    assert web.get("/glance").status_code == 200
    refreshes_s = range(300, int(SESSION_MAX_AGE_S), 300)  # one every 5 minutes (fewer calls)
    start = clock.now_s
    for at in refreshes_s:
        clock.now_s = start + at
        assert web.get("/glance.json").status_code == 200, at
    clock.now_s = start + SESSION_MAX_AGE_S
    assert web.get("/glance.json").status_code == 401
    assert web.get("/glance").status_code == 303


# --- holes a hostile review of the sessions found --------------------------------------------------
@pytest.mark.parametrize("key", [
    "k" * 40 + "\udcff",  # a byte not in UTF-8 in the variable (os.environ's surrogateescape)
    "k" * 20 + "\u200b" + "k" * 20,  # a zero-width space pasted with it
    "k" * 40 + "\x7f",
], ids=["not UTF-8", "zero-width space", "DEL"])
def test_a_key_with_a_character_that_is_not_printable_is_refused_at_start(key: str) -> None:
    """Such a key was taken, and every page then failed with 500 (the cookie signer encodes the
    key as UTF-8 at the first request)."""
    with pytest.raises(ConfigError, match=r"POSTROOM_WEB_SESSION_KEY: .*printable") as caught:
        Settings.from_env({"POSTROOM_WEB_SESSION_KEY": key})
    assert key not in str(caught.value)


def test_a_key_file_not_in_utf8_is_refused_without_showing_any_of_its_bytes(
        tmp_path: Path) -> None:
    """UnicodeDecodeError's text names the byte it stopped at (\\xe9 here): a byte of the key."""
    path = tmp_path / "session-key"
    path.write_bytes(b"k" * 20 + b"\xe9" + b"k" * 20)
    with pytest.raises(ConfigError, match="not UTF-8 text") as caught:
        Settings.from_env({"POSTROOM_WEB_SESSION_KEY_FILE": str(path)})
    assert "e9" not in str(caught.value).lower()


@pytest.mark.parametrize("name", ["/dev/zero", "large"])
def test_a_key_file_larger_than_a_setting_is_refused_without_reading_it_whole(
        tmp_path: Path, name: str) -> None:
    """/dev/zero named by mistake was read until memory ran out; a file of a megabyte of key
    characters was taken as the key."""
    path = tmp_path / name if name == "large" else Path(name)
    if name == "large":
        path.write_text("k" * (SETTING_FILE_MAX_BYTES + 1))
    with pytest.raises(ConfigError, match="larger than 1024 KiB"):
        Settings.from_env({"POSTROOM_WEB_SESSION_KEY_FILE": str(path)})


def test_a_token_with_a_character_that_is_not_printable_is_refused_at_start() -> None:
    with pytest.raises(ConfigError, match=r"POSTROOM_WEB_READER_TOKEN: .*printable"):
        Settings.from_env({"POSTROOM_WEB_READER_TOKEN": "r" * 20 + "\udcff"})


def test_a_session_ends_twelve_hours_after_its_sign_in_however_much_it_is_used() -> None:
    """The idle limit alone let a session used every hour (or a copied cookie used so) live for
    ever: the absolute limit is counted from the sign-in."""
    clock = Clock()
    store = MemoryStore(clock=clock)
    web = console(store)
    sign_in(web, READER_TOKEN)
    for _ in range(11):
        clock.now_s += 3600
        assert web.get("/search").status_code == 200
    clock.now_s += 3600
    assert web.get("/search").status_code == 303


@pytest.mark.parametrize("after", [
    {"POSTROOM_WEB_OPERATOR_TOKEN": "a-new-operator-token-0123456789",
     "POSTROOM_WEB_READER_TOKEN": READER_TOKEN},
    {"POSTROOM_WEB_READER_TOKEN": READER_TOKEN},
], ids=["operator token changed", "operator token removed"])
def test_a_token_changed_or_removed_signs_out_the_sessions_it_signed_in(
        tmp_path: Path, after: dict[str, str]) -> None:
    """The sessions outlive a restart now: a leaked operator token replaced (or removed) and the
    console restarted must not leave its holder signed in as an operator. A session signed in
    with the reader token, which did not change, goes on."""
    store = MemoryStore()
    key = key_file(tmp_path, KEY)
    operator = console(store, POSTROOM_WEB_SESSION_KEY_FILE=key)
    reader = console(store, POSTROOM_WEB_SESSION_KEY_FILE=key)
    sign_in(operator, OPERATOR_TOKEN)
    sign_in(reader, READER_TOKEN)
    assert operator.get("/search").status_code == 200
    restarted = make_app(Settings.from_env({**after, "POSTROOM_WEB_SESSION_KEY_FILE": key}), store)
    for before, signed_in in ((operator, False), (reader, True)):
        web = TestClient(restarted, client=("127.0.0.1", 1), follow_redirects=False)
        web.cookies[SESSION_COOKIE] = before.cookies[SESSION_COOKIE]
        assert (web.get("/search").status_code == 200) is signed_in


def test_signing_out_is_audited_with_who_signed_out_and_from_where() -> None:
    store = MemoryStore()
    app = make_app(settings(), store)
    web = TestClient(app, client=("127.0.0.1", 1), follow_redirects=False)
    copy = TestClient(app, client=("10.0.0.9", 1), follow_redirects=False)
    sign_in(web, OPERATOR_TOKEN)
    copy.cookies[SESSION_COOKIE] = web.cookies[SESSION_COOKIE]
    page = web.get("/search")
    assert web.post("/signout", data={"csrf": csrf_of(page.text)}).status_code == 303
    last = store.audited[-1]
    assert (last.who.who, last.who.role, last.action, last.target) == (
        "operator token", Role.OPERATOR, "sign out", "127.0.0.1")
    # A copy of the cookie signs out a session that has ended: nothing to audit, it names no one.
    assert copy.post("/signout", data={"csrf": csrf_of(page.text)}).status_code == 303
    assert store.audited[-1] is last


class PoolTimeoutStore(MemoryStore):
    def session(self, *args: Any, **kwargs: Any) -> Any:
        raise sa.exc.TimeoutError("QueuePool limit of size 5 overflow 10 reached, connection "
                                  "timed out, timeout 30.00\n(Background on this error at: x)")


def test_a_database_too_slow_to_lend_a_connection_is_a_503_page_not_a_500() -> None:
    """A database that answers slowly holds every pooled connection: the next request's session
    lookup waits for the pool's 30 s and gets SQLAlchemy's TimeoutError, which is no DBAPIError
    (it gave Starlette's bare 500, the traceback logged)."""
    web = TestClient(make_app(settings(), PoolTimeoutStore()), client=("127.0.0.1", 1),
                     follow_redirects=False)
    sign_in(web, READER_TOKEN)
    answer = web.get("/search")
    assert answer.status_code == 503
    assert "the database does not answer: QueuePool limit of size 5" in answer.text
    assert "Background on this error" not in answer.text
    assert answer.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
