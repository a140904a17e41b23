"""The console under hostile input, each test a hole a review found (issue 48 item 7): an
outsider's oversized body, a cookie kept after sign-out, a reader's refused action left out of
the audit, a doubled proxy header, a formula in a CSV cell, fields that broke a page with 500."""

from __future__ import annotations

import re
from typing import Any

import pytest
from starlette.testclient import TestClient

from postroom.errors import ConfigError
from postroom.relay.report import render_csv
from postroom.settings import Settings
from postroom.web.app import SESSION_COOKIE, make_app
from postroom.web.middleware import CONTENT_SECURITY_POLICY, FORM_MAX_BYTES
from support.console import MemoryStore, outbox_row
from support.webclient import OPERATOR_TOKEN, PROXY, READER_TOKEN, client, csrf_of, settings, sign_in


def refusal(page: str) -> str:
    found = re.search(r'id="refusal">([^<]*)<', page)
    return found.group(1) if found else ""


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore(rows=[outbox_row(1), outbox_row(2, status="dead", attempts=5)])


# --- an outsider's body: read only up to FORM_MAX_BYTES, before any sign-in ---------------------
@pytest.mark.parametrize("chunked", [False, True])
def test_an_oversized_body_is_refused_before_it_is_read(store: MemoryStore, chunked: bool) -> None:
    web = client(store)
    body = b"token=" + b"x" * (FORM_MAX_BYTES + 1)
    sent: Any = body if not chunked else iter([body[:100], body[100:]])
    answer = web.post("/signin", content=sent,
                      headers={"content-type": "application/x-www-form-urlencoded"})
    assert answer.status_code == 413
    assert f"larger than {FORM_MAX_BYTES} bytes" in answer.text
    assert answer.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert store.audited == []


def test_a_form_starlette_refuses_is_a_400_not_a_500(store: MemoryStore) -> None:
    web = client(store)
    form = web.get("/signin")
    fields = [("csrf", csrf_of(form.text))] + [(f"f{n}", "x") for n in range(1001)]
    answer = web.post("/signin", data=dict(fields))
    assert answer.status_code == 400
    assert "Too many fields" in refusal(answer.text)


# --- sign-out ends the session, not just the browser's copy of it -------------------------------
def test_a_cookie_kept_from_before_sign_out_no_longer_signs_in(store: MemoryStore) -> None:
    app = make_app(settings(), store)
    web = TestClient(app, client=("127.0.0.1", 1), follow_redirects=False)
    sign_in(web, OPERATOR_TOKEN)
    kept = web.cookies[SESSION_COOKIE]
    thief = TestClient(app, client=("192.0.2.1", 1), follow_redirects=False)
    thief.cookies[SESSION_COOKIE] = kept
    assert thief.get("/search").status_code == 200  # a copied cookie works while signed in
    assert web.post("/signout", data={"csrf": csrf_of(web.get("/search").text)}).status_code == 303
    assert thief.get("/search").status_code == 303
    # ... while a session signed in since is unaffected
    sign_in(web, OPERATOR_TOKEN)
    assert web.get("/search").status_code == 200


# --- a refused action is audited too (docs/security.md promises it) ------------------------------
def test_a_readers_refused_action_is_audited(store: MemoryStore) -> None:
    web = client(store)
    sign_in(web, READER_TOKEN)
    token = csrf_of(web.get("/suppression").text)
    store.audited.clear()
    assert web.post("/suppression/add", data={"csrf": token,
                                              "address": "a@example.com"}).status_code == 403
    assert web.post("/redrive", data={"csrf": token, "kind": "requeue", "key": "report-2026-09",
                                      "confirm": "yes"}).status_code == 403
    assert [(a.action, a.target, a.who.who) for a in store.audited] == [
        ("refused: POST /suppression/add", "needs the operator role", "reader token"),
        ("refused: POST /redrive", "needs the operator role", "reader token")]
    assert not store.entries and not store.redriven


def test_a_signed_in_users_forged_post_is_audited(store: MemoryStore) -> None:
    web = client(store)
    sign_in(web, OPERATOR_TOKEN)
    store.audited.clear()
    answer = web.post("/suppression/add", data={"csrf": "forged", "address": "a@example.com"})
    assert answer.status_code == 403
    assert [(a.action, a.target, a.who.who) for a in store.audited] == [
        ("refused: POST /suppression/add", "CSRF token missing or wrong", "operator token")]


# --- the trusted proxy's header ------------------------------------------------------------------
PROXIED = {"POSTROOM_WEB_TRUSTED_PROXIES": "10.0.0.0/24",
           "POSTROOM_WEB_OPERATORS": "ops@example.com"}


def test_two_proxy_headers_sign_no_one_in(store: MemoryStore) -> None:
    """A proxy that appends its header after the client's would otherwise let the client's
    (the first) win."""
    web = client(store, PROXY, **PROXIED)
    answer = web.get("/search", headers=[("X-Forwarded-Email", "ops@example.com"),
                                         ("x-forwarded-email", "support@example.com")])
    assert answer.status_code == 303


def test_a_proxy_seen_as_an_ipv4_mapped_ipv6_peer_is_trusted(store: MemoryStore) -> None:
    """A console listening on `[::]` sees IPv4 peers as ::ffff:a.b.c.d."""
    web = client(store, "::ffff:10.0.0.5", **PROXIED)
    answer = web.get("/search", headers={"X-Forwarded-Email": "ops@example.com"})
    assert answer.status_code == 200 and "ops@example.com (operator)" in answer.text
    outsider = client(store, "::ffff:10.9.9.9", **PROXIED)
    assert outsider.get("/search", headers={"X-Forwarded-Email": "ops@example.com"}
                        ).status_code == 303


@pytest.mark.parametrize("networks", ["0.0.0.0/0", "10.0.0.5,::/0", "::ffff:0.0.0.0/96"])
def test_trusting_every_address_is_a_configuration_error(networks: str) -> None:
    with pytest.raises(ConfigError, match=r"POSTROOM_WEB_TRUSTED_PROXIES: .*every address"):
        Settings.from_env({"POSTROOM_WEB_TRUSTED_PROXIES": networks})


# --- CSV cells a spreadsheet would run --------------------------------------------------------
@pytest.mark.parametrize("hostile", ["=HYPERLINK(\"http://evil.example\",\"x\")", "+1+cmd|' /C calc'!A0",
                                     "-2+3", "@SUM(1)", "\tx", "\rx"])
def test_a_csv_cell_never_starts_a_formula(hostile: str) -> None:
    import datetime as dt

    from postroom.relay.report import Failure

    text = render_csv([Failure(1, "a@example.com", hostile, f"{hostile}|a@example.com", hostile,
                               "failed", 3, hostile, dt.datetime(2026, 9, 30, tzinfo=dt.UTC))])
    import csv
    import io

    row = list(csv.reader(io.StringIO(text)))[1]
    assert row[1] == row[3] == row[6] == "'" + hostile
    assert row[2] == f"'{hostile}|a@example.com"
    assert row[0] == "a@example.com" and row[5] == "3"


# --- fields that gave a 500 (or a 503 blaming the database) -----------------------------------
@pytest.mark.parametrize("path, says", [
    ("/audit?before=%C2%B2", "before: not a page of the audit"),
    ("/audit?before=99999999999999999999", "before: not a page of the audit"),
    ("/search?from=0001-01-01T00:00%2B14:00", "from: out of range"),
    ("/search?until=9999-12-31T23:59-14:00", "until: out of range"),
    ("/search?after=1_99999999999999999999", "not a page of this search"),
    ("/search?after=-99999999999999999_1", "not a page of this search"),
    ("/email/99999999999999999999", "no outbox row"),
])
def test_a_malformed_field_is_a_400_or_404_with_one_line(store: MemoryStore, path: str,
                                                         says: str) -> None:
    web = client(store)
    sign_in(web, READER_TOKEN)
    answer = web.get(path)
    assert answer.status_code in (400, 404), (path, answer.status_code, refusal(answer.text))
    assert says in refusal(answer.text)


# --- a report run's page is bounded; its CSV has every failure -----------------------------------
def test_a_report_page_shows_its_first_failures_and_counts_the_rest() -> None:
    from postroom.web.pages import REPORT_FAILURES_SHOWN

    many = REPORT_FAILURES_SHOWN + 7
    store = MemoryStore(rows=[outbox_row(n, status="failed", last_error="550 no")
                              for n in range(1, many + 1)])
    web = client(store)
    sign_in(web, READER_TOKEN)
    page = web.get("/report", params={"key": "report-2026-09"}).text
    assert len(re.findall(r'href="/email/\d+"', page)) == REPORT_FAILURES_SHOWN
    assert f"the first {REPORT_FAILURES_SHOWN} of {many} shown" in page
    csv_lines = web.get("/report.csv", params={"key": "report-2026-09"}).text.splitlines()
    assert len(csv_lines) == many + 1


# --- the suppression page asks the store for one page, not the whole list -----------------------
class CountingStore(MemoryStore):
    handed_out = 0

    def suppressed(self, *args: Any, **kwargs: Any) -> Any:
        entries = super().suppressed(*args, **kwargs)
        self.handed_out += len(entries)
        return entries


def test_the_suppression_page_reads_one_page_of_the_list() -> None:
    import datetime as dt

    from postroom.relay.suppression import Entry, Source
    from postroom.web.pages import SUPPRESSION_SHOWN_MAX
    from support.console import NOW

    many = SUPPRESSION_SHOWN_MAX + 100
    store = CountingStore()
    for n in range(many):
        address = f"user{n:04d}@example.com"
        store.entries[address] = Entry(address, "hard bounce" if n % 2 else "asked", Source.BOUNCE,
                                       NOW, NOW + dt.timedelta(days=30))
    web = client(store)
    sign_in(web, READER_TOKEN)
    page = web.get("/suppression").text
    assert store.handed_out <= SUPPRESSION_SHOWN_MAX + 1
    assert len(re.findall(r'aria-label="Remove ', page)) == SUPPRESSION_SHOWN_MAX
    assert f"the first {SUPPRESSION_SHOWN_MAX} shown" in page
    store.handed_out = 0
    found = web.get("/suppression", params={"q": "USER0042@"}).text
    assert re.findall(r'aria-label="Remove ([^"]+)"', found) == ["user0042@example.com"]
    assert web.get("/suppression", params={"q": "Asked"}).text.count('aria-label="Remove ') \
        == many // 2


# --- the Host header: a page an attacker's name points at the console (DNS rebinding) ----------
def test_a_host_not_listed_in_web_hosts_is_refused(store: MemoryStore) -> None:
    web = client(store, PROXY, POSTROOM_WEB_HOSTS="console.example.com,localhost,[::1]",
                 **PROXIED)
    who = {"X-Forwarded-Email": "ops@example.com"}
    rebound = web.get("/search", headers={**who, "Host": "evil.example:8480"})
    assert rebound.status_code == 400
    assert rebound.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    for host in ("console.example.com", "Console.Example.com:443", "localhost:8480",
                 "[::1]:8480"):
        assert web.get("/search", headers={**who, "Host": host}).status_code == 200, host


def test_a_loopback_proxy_needs_web_hosts() -> None:
    """Trusting 127.0.0.1 trusts every browser on the host too, through a name rebound to it."""
    env = {"POSTROOM_WEB_TRUSTED_PROXIES": "127.0.0.1", "POSTROOM_WEB_OPERATORS": "o@example.com"}
    with pytest.raises(ConfigError, match=r"POSTROOM_WEB_HOSTS: .*loopback"):
        make_app(Settings.from_env(env), MemoryStore())
    make_app(Settings.from_env({**env, "POSTROOM_WEB_HOSTS": "console.example.com"}), MemoryStore())


def test_an_operators_refused_action_is_audited_with_why(store: MemoryStore) -> None:
    web = client(store)
    sign_in(web, OPERATOR_TOKEN)
    token = csrf_of(web.get("/suppression").text)
    store.audited.clear()
    assert web.post("/suppression/add", data={"csrf": token,
                                              "address": "not an address"}).status_code == 400
    assert web.post("/suppression/remove", data={"csrf": token,
                                                 "address": "never@example.com"}).status_code == 400
    assert web.post("/redrive", data={"csrf": token, "kind": "replay", "key": "0@999",
                                      "confirm": "yes"}).status_code == 404
    assert [(a.action, a.who.who) for a in store.audited] == [
        ("refused: POST /suppression/add", "operator token"),
        ("refused: POST /suppression/remove", "operator token"),
        ("refused: POST /redrive", "operator token")]
    assert "not of the form local@domain" in store.audited[0].target
    assert "0@999" in store.audited[2].target


# --- guessing tokens: a peer's refused sign-ins are throttled (and so are their audit rows) ------
def test_refused_sign_ins_are_throttled_per_peer(store: MemoryStore) -> None:
    from postroom.web.auth import SIGNIN_REFUSALS_MAX

    app = make_app(settings(), store)
    web = TestClient(app, client=("192.0.2.9", 1), follow_redirects=False)
    for _ in range(SIGNIN_REFUSALS_MAX):
        assert sign_in(web, "guess-guess-guess-guess").status_code == 401
    answer = sign_in(web, OPERATOR_TOKEN)
    assert answer.status_code == 429
    assert "too many refused sign-ins from 192.0.2.9" in answer.text
    assert [a.action for a in store.audited] == ["sign-in refused"] * SIGNIN_REFUSALS_MAX
    other = TestClient(app, client=("192.0.2.10", 1), follow_redirects=False)
    assert sign_in(other, OPERATOR_TOKEN).status_code == 303


def test_the_csv_export_is_streamed_not_built_whole(store: MemoryStore) -> None:
    """A run of a million failures would otherwise be held in memory whole, for any reader."""
    from postroom.relay.report import Failure

    store.rows[:] = [outbox_row(n, status="failed", last_error="=550 no") for n in range(1, 2500)]
    web = client(store)
    sign_in(web, READER_TOKEN)
    with web.stream("GET", "/report.csv", params={"key": "report-2026-09"}) as answer:
        assert answer.status_code == 200
        assert "content-length" not in answer.headers  # sent as it is read
        assert answer.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
        text = "".join(answer.iter_text())
    failures = [Failure(r["id"], r["recipient"], r["message_key"], r["idempotency_key"],
                        r["subject"], r["status"], r["attempts"], r["last_error"],
                        r["updated_at"]) for r in store.rows]
    assert text == render_csv(failures)


class CsvDownStore(MemoryStore):
    def failure_batches(self, message_key: str) -> Any:
        import sqlalchemy as sa

        raise sa.exc.OperationalError("SELECT", {}, Exception("connection refused"))
        yield []  # a generator, as the database store's


def test_a_csv_export_the_database_cannot_start_is_a_503_page() -> None:
    web = TestClient(make_app(settings(), CsvDownStore()), client=("127.0.0.1", 1),
                     follow_redirects=False)
    sign_in(web, READER_TOKEN)
    answer = web.get("/report.csv", params={"key": "k"})
    assert answer.status_code == 503
    assert "the database does not answer: connection refused" in refusal(answer.text)
