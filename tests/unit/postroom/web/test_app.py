"""The console's security through Starlette's TestClient over an in-memory store: sign-in, roles,
CSRF on every POST, escaping, headers, and the audit of each action."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import pytest
from starlette.routing import Route
from starlette.testclient import TestClient

from postroom.errors import ConfigError
from postroom.settings import Settings
from postroom.web.app import Console, make_app
from postroom.web.middleware import CONTENT_SECURITY_POLICY
from support.console import NOW, MemoryStore, outbox_row
from support.webclient import OPERATOR_TOKEN, PROXY, READER_TOKEN, client, csrf_of, settings, sign_in


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore(rows=[outbox_row(1), outbox_row(2, status="dead", attempts=5,
                                                       last_error="550 5.1.1 no such user")])


def test_refuses_to_start_without_a_way_to_sign_in() -> None:
    with pytest.raises(ConfigError, match="needs a way to sign in"):
        make_app(Settings.from_env({}), MemoryStore())


def test_refuses_a_reader_token_equal_to_the_operators() -> None:
    with pytest.raises(ConfigError, match="operator's token"):
        make_app(Settings.from_env({"POSTROOM_WEB_OPERATOR_TOKEN": OPERATOR_TOKEN,
                                    "POSTROOM_WEB_READER_TOKEN": OPERATOR_TOKEN}), MemoryStore())


def test_a_short_token_is_a_configuration_error() -> None:
    with pytest.raises(ConfigError, match="POSTROOM_WEB_OPERATOR_TOKEN: a token needs"):
        Settings.from_env({"POSTROOM_WEB_OPERATOR_TOKEN": "short"})


def test_pages_need_a_sign_in(store: MemoryStore) -> None:
    web = client(store)
    for path in ("/search", "/email/1", "/report?key=report-2026-09", "/suppression", "/dlq",
                 "/glance", "/audit", "/report.csv?key=report-2026-09"):
        answer = web.get(path)
        assert answer.status_code == 303, path
        assert answer.headers["location"].startswith("/signin?next=")
    assert web.get("/glance.json").status_code == 401


def test_a_wrong_token_is_refused_and_audited(store: MemoryStore) -> None:
    web = client(store)
    answer = sign_in(web, "not-the-token-at-all-xyz")
    assert answer.status_code == 401
    assert "sign-in refused" in answer.text
    assert [a.action for a in store.audited] == ["sign-in refused"]
    assert web.get("/search").status_code == 303


def test_a_token_signs_in_with_its_role_and_a_new_csrf_token(store: MemoryStore) -> None:
    web = client(store)
    before = csrf_of(web.get("/signin").text)
    answer = sign_in(web, READER_TOKEN)
    assert answer.status_code == 303
    page = web.get("/search")
    assert page.status_code == 200
    assert "reader token (reader)" in page.text
    assert csrf_of(page.text) != before  # the session is new: nothing from before carries over
    assert [(a.action, a.who.who) for a in store.audited] == [("sign in", "reader token")]


def test_sign_in_never_redirects_off_the_site(store: MemoryStore) -> None:
    for target in ("//evil.example/x", "https://evil.example/", "/\\evil.example"):
        web = client(store)
        form = web.get("/signin")
        answer = web.post("/signin", data={"csrf": csrf_of(form.text), "token": READER_TOKEN,
                                           "next": target})
        assert answer.headers["location"] == "/search", target


def post_routes() -> list[str]:
    console = Console(settings(), MemoryStore())
    return sorted({r.path for r in console.routes()
                   if isinstance(r, Route) and "POST" in (r.methods or ())})


def test_every_post_route_is_listed() -> None:
    assert post_routes() == ["/redrive", "/signin", "/signout", "/suppression/add",
                             "/suppression/remove"]


@pytest.mark.parametrize("path", post_routes())
@pytest.mark.parametrize("csrf", [None, "", "forged-token"])
def test_every_post_without_the_sessions_csrf_token_is_refused(store: MemoryStore, path: str,
                                                               csrf: str | None) -> None:
    store.entries.clear()
    web = client(store)
    sign_in(web, OPERATOR_TOKEN)
    store.audited.clear()
    data = {"address": "victim@example.com", "reason": "x", "kind": "requeue",
            "key": "report-2026-09", "confirm": "yes", "token": OPERATOR_TOKEN}
    if csrf is not None:
        data["csrf"] = csrf
    answer = web.post(path, data=data)
    assert answer.status_code == 403
    assert "CSRF token is missing or wrong" in answer.text
    assert not store.entries and not store.redriven
    # the only audit line is the refusal (sign-in and sign-out check their token themselves)
    assert [a.action for a in store.audited] == (
        [f"refused: POST {path}"] if path not in ("/signin", "/signout") else [])
    assert web.get("/search").status_code == 200  # still signed in: the forgery changed nothing


def test_a_reader_cannot_act(store: MemoryStore) -> None:
    web = client(store)
    sign_in(web, READER_TOKEN)
    page = web.get("/suppression")
    answer = web.post("/suppression/add", data={"csrf": csrf_of(page.text),
                                                "address": "a@example.com"})
    assert answer.status_code == 403
    assert "needs the operator role" in answer.text
    assert not store.entries
    answer = web.post("/redrive", data={"csrf": csrf_of(page.text), "kind": "requeue",
                                        "key": "report-2026-09", "confirm": "yes"})
    assert answer.status_code == 403
    assert not store.redriven


def test_an_operator_suppresses_and_removes_each_audited(store: MemoryStore) -> None:
    web = client(store)
    sign_in(web, OPERATOR_TOKEN)
    token = csrf_of(web.get("/suppression").text)
    added = web.post("/suppression/add", data={"csrf": token, "address": "Who@Example.com",
                                               "reason": "asked by phone", "expires": "90d"})
    assert added.status_code == 200, added.text
    assert "suppressed who@example.com until" in added.text
    assert "who@example.com" in store.entries
    removed = web.post("/suppression/remove", data={"csrf": token, "address": "who@example.com"})
    assert "removed who@example.com" in removed.text
    assert not store.entries
    actions = [(a.action, a.target, a.who.who) for a in store.audited[1:]]
    assert actions == [("suppression add", "who@example.com", "operator token"),
                       ("suppression remove", "who@example.com", "operator token")]
    audit = web.get("/audit").text
    assert "suppression add" in audit and "suppression remove" in audit


@pytest.mark.parametrize("fields, message", [
    ({"address": "not an address"}, "not of the form local@domain"),
    ({"address": ""}, "address: required"),
    ({"address": "a@example.com", "expires": "soon"}, "expires: "),
    ({"address": "a@example.com", "reason": "x" * 501}, "reason: longer than 500"),
])
def test_a_bad_suppression_form_says_why_in_one_line(store: MemoryStore, fields: dict[str, str],
                                                     message: str) -> None:
    web = client(store)
    sign_in(web, OPERATOR_TOKEN)
    answer = web.post("/suppression/add",
                      data={"csrf": csrf_of(web.get("/suppression").text), **fields})
    assert answer.status_code == 400
    assert message in answer.text
    assert not store.entries


def test_a_requeue_needs_its_confirmation(store: MemoryStore) -> None:
    web = client(store)
    sign_in(web, OPERATOR_TOKEN)
    confirm = web.get("/redrive?kind=requeue&key=report-2026-09")
    assert "a2@example.com" in confirm.text
    data = {"csrf": csrf_of(confirm.text), "kind": "requeue", "key": "report-2026-09"}
    assert web.post("/redrive", data=data).status_code == 400
    assert not store.redriven
    done = web.post("/redrive", data={**data, "confirm": "yes"})
    assert "requeued 1 row(s)" in done.text
    assert store.redriven == [2]
    assert store.audited[-1].action == "requeue" and store.audited[-1].row_ids == (2,)


HOSTILE = '<script>alert("x")</script><img src=x onerror=alert(1)>'


def test_job_and_server_text_is_escaped(store: MemoryStore) -> None:
    store.rows.append(outbox_row(3, subject=HOSTILE, message_key=HOSTILE, status="failed",
                                 last_error=HOSTILE))
    web = client(store)
    sign_in(web, READER_TOKEN)
    pages = [web.get("/search").text, web.get("/email/3").text,
             web.get("/report", params={"key": HOSTILE}).text]
    for page in pages:
        assert "<script>alert" not in page and "<img src=x" not in page
        assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in page


def test_every_response_carries_the_security_headers(store: MemoryStore) -> None:
    web = client(store)
    answers = [web.get("/signin"), web.get("/search"), web.get("/static/console.js"),
               web.get("/email/999"), web.post("/signin", data={})]
    sign_in(web, READER_TOKEN)
    answers += [web.get("/search"), web.get("/email/999"), web.get("/glance.json")]
    for answer in answers:
        assert answer.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
        assert answer.headers["x-frame-options"] == "DENY"
        assert answer.headers["x-content-type-options"] == "nosniff"
    assert "'unsafe-inline'" not in CONTENT_SECURITY_POLICY
    assert "script-src 'self'" in CONTENT_SECURITY_POLICY


def test_no_page_holds_inline_script_or_style(store: MemoryStore) -> None:
    web = client(store)
    sign_in(web, OPERATOR_TOKEN)
    for path in ("/search", "/email/2", "/report?key=report-2026-09", "/suppression", "/glance",
                 "/audit", "/redrive?kind=requeue&key=report-2026-09"):
        page = web.get(path).text
        assert not re.search(r"<script(?![^>]*\bsrc=)", page), path
        assert "<style" not in page and " style=" not in page and " on" + "click" not in page


def test_the_session_cookie_is_http_only_and_same_site_strict(store: MemoryStore) -> None:
    web = client(store, POSTROOM_WEB_SECURE_COOKIE="true")
    answer = sign_in(web, READER_TOKEN)
    cookie = answer.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie and "secure" in cookie


def test_a_trusted_proxys_header_signs_in(store: MemoryStore) -> None:
    env = {"POSTROOM_WEB_TRUSTED_PROXIES": "10.0.0.0/24",
           "POSTROOM_WEB_OPERATORS": "Ops@Example.com"}
    web = client(store, PROXY, **env)
    reader = web.get("/search", headers={"X-Forwarded-Email": "support@example.com"})
    assert reader.status_code == 200 and "support@example.com (reader)" in reader.text
    operator = web.get("/search", headers={"X-Forwarded-Email": "ops@example.com"})
    assert "ops@example.com (operator)" in operator.text


@pytest.mark.parametrize("peer, header", [
    ("10.9.9.9", "ops@example.com"),          # not from the proxy
    ("testclient", "ops@example.com"),        # not an address at all
    (PROXY, "ops@example.com, x@example.com"),  # not one plain address
    (PROXY, ""),
])
def test_the_header_from_anyone_else_is_ignored(store: MemoryStore, peer: str,
                                                header: str) -> None:
    web = client(store, peer, POSTROOM_WEB_TRUSTED_PROXIES="10.0.0.0/24",
                 POSTROOM_WEB_OPERATORS="ops@example.com")
    assert web.get("/search", headers={"X-Forwarded-Email": header}).status_code == 303


def test_the_report_exports_its_failures_as_csv(store: MemoryStore) -> None:
    web = client(store)
    sign_in(web, READER_TOKEN)
    answer = web.get("/report.csv", params={"key": "report-2026-09"})
    assert answer.headers["content-type"].startswith("text/csv")
    lines = answer.text.splitlines()
    assert lines[0].startswith("recipient,message_key,idempotency_key")
    assert lines[1].startswith("a2@example.com,report-2026-09,") and "550 5.1.1" in lines[1]
    assert len(lines) == 2


def test_search_pages_by_keyset(store: MemoryStore) -> None:
    store.rows[:] = [outbox_row(n) for n in range(1, 121)]
    web = client(store)
    sign_in(web, READER_TOKEN)
    seen: list[str] = []
    page = web.get("/search?key=report-2026-09")
    while True:
        seen += re.findall(r'href="/email/(\d+)"', page.text)
        found = re.search(r'href="([^"]+)" id="next-page"', page.text)
        if not found:
            break
        page = web.get(found.group(1).replace("&amp;", "&"))
    assert [int(n) for n in seen] == list(range(1, 121))  # newest first, each row once


def test_a_search_by_state_goes_on_where_its_bounded_walk_stopped(store: MemoryStore) -> None:
    """A state few rows are in: each page looks through scan_rows rows at most, says so, and
    links to the older ones; followed, the pages show every match once, newest first."""
    store.rows[:] = [outbox_row(n, status="dead" if n % 7 == 0 else "sent")
                     for n in range(1, 301)]
    store.scan_rows = 40
    web = client(store)
    sign_in(web, READER_TOKEN)
    seen: list[str] = []
    said: list[bool] = []
    page = web.get("/search?state=dead")
    while True:
        seen += re.findall(r'href="/email/(\d+)"', page.text)
        said.append('id="searched"' in page.text)
        found = re.search(r'href="([^"]+)" id="search-older"', page.text)
        if not found:
            break
        assert "among the emails enqueued from " in page.text
        page = web.get(found.group(1).replace("&amp;", "&"))
    assert [int(n) for n in seen] == list(range(7, 301, 7))
    assert said == [True] * 7 + [False]  # 300 rows, 40 a page; the last page walks to the end
    assert "Nothing matches among" in web.get("/search?state=retrying").text


def test_a_bad_filter_says_why(store: MemoryStore) -> None:
    web = client(store)
    sign_in(web, READER_TOKEN)
    assert "state: one of" in web.get("/search?state=lost").text
    assert "from: not a date" in web.get("/search?from=yesterday").text
    assert "not a page of this search" in web.get("/search?after=x_y").text


class FailingStore(MemoryStore):
    def search(self, wanted: Any, limit: int) -> Any:
        raise RuntimeError("a bug with a <tag> in it")

    def report_run(self, message_key: str, limit: int | None = None) -> Any:
        import sqlalchemy as sa

        raise sa.exc.OperationalError("SELECT", {}, Exception("connection refused\nmore"))


def test_a_failure_is_a_page_with_the_security_headers(caplog: pytest.LogCaptureFixture) -> None:
    web = TestClient(make_app(settings(), FailingStore()), client=("127.0.0.1", 50000),
                     follow_redirects=False)
    sign_in(web, READER_TOKEN)
    with caplog.at_level("ERROR", logger="postroom.web.app"):
        failed = web.get("/search")
    assert failed.status_code == 500
    assert "internal error (postroom web logged it)" in failed.text
    assert "<tag>" not in failed.text
    assert failed.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert "console request GET /search failed" in caplog.text
    down = web.get("/report?key=k")
    assert down.status_code == 503
    assert "the database does not answer: connection refused" in down.text
    assert down.headers["content-security-policy"] == CONTENT_SECURITY_POLICY


def letter(partition: int, offset: int, minute: int, row_status: str | None = "dead") -> Any:
    from postroom.relay.dlq_pages import LetterHistory
    from postroom.relay.redrive import DeadLetter

    key = f"report-2026-09|a{offset}@example.com"
    return LetterHistory(DeadLetter(
        partition, offset, key, NOW + dt.timedelta(minutes=minute), "permanent",
        "550 <b>no</b>", "postroom.email.normal", 2, f"a{offset}@example.com",
        "report-2026-09", "S", row_status), ("attempt=1 451 later", "attempt=2 550 <b>no</b>"))


def test_dead_letters_page_newest_first_and_open_one(store: MemoryStore) -> None:
    store.letters = [letter(p, o, minute=o * 2 + p) for p in (0, 1) for o in range(40)]
    web = client(store)
    sign_in(web, READER_TOKEN)
    seen: list[str] = []
    page = web.get("/dlq")
    while True:
        seen += re.findall(r'href="/dlq/letter\?at=(\d+%40\d+)"', page.text)
        found = re.search(r'href="([^"]+)" rel="next"', page.text)
        if not found:
            break
        page = web.get(found.group(1).replace("&amp;", "&"))
    expected = sorted(((o * 2 + p, f"{p}%40{o}") for p in (0, 1) for o in range(40)),
                      reverse=True)
    assert seen == [at for _, at in expected]
    opened = web.get("/dlq/letter?at=1%4017")
    assert "attempt=2 550 &lt;b&gt;no&lt;/b&gt;" in opened.text
    assert web.get("/dlq/letter?at=1%4099").status_code == 404
    assert "a dead letter&#39;s place is partition@offset" in web.get("/dlq/letter?at=x").text


def test_a_dead_letter_is_replayed_after_its_confirmation(store: MemoryStore) -> None:
    store.rows.append(outbox_row(7, idempotency_key="report-2026-09|a7@example.com",
                                 status="dead"))
    store.letters = [letter(0, 7, minute=1)]
    web = client(store)
    sign_in(web, OPERATOR_TOKEN)
    confirm = web.get("/redrive?kind=replay&key=0%407")
    assert "replay the dead letter at 0@7" in confirm.text and "a7@example.com" in confirm.text
    done = web.post("/redrive", data={"csrf": csrf_of(confirm.text), "kind": "replay",
                                      "key": "0@7", "confirm": "yes"})
    assert "replayed 1 row(s)" in done.text
    assert store.redriven == [7]
    assert (store.audited[-1].action, store.audited[-1].target) == ("replay", "dead letter 0@7")


class AuditDownStore(MemoryStore):
    def record(self, action: Any) -> None:
        import sqlalchemy as sa

        raise sa.exc.OperationalError("INSERT", {}, Exception("the server closed the connection"))


def test_a_sign_in_the_audit_cannot_record_is_a_page_not_a_crash() -> None:
    web = TestClient(make_app(settings(), AuditDownStore()), client=("127.0.0.1", 50000),
                     follow_redirects=False)
    answer = sign_in(web, READER_TOKEN)
    assert answer.status_code == 503
    assert "the database does not answer: the server closed the connection" in answer.text
    assert answer.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert web.get("/search").status_code == 303  # not signed in: the audit has no line of it
