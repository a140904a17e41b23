"""`postroom web` as support and operators use it, driven in headless chromium (Debian's chromium
and chromium-driver: scripts/browser.sh installs them): sign-in refused and accepted, search by
any spelling of an address, one email's timeline, a suppression added and removed, an action
refused to a reader, a forged POST refused, a dead letter replayed after its confirmation, the
glance page refreshed without a reload, and keyboard use and labels on every page.

The console runs as a subprocess against the local stack's database, in a schema and under a
topic prefix of this module's own. With POSTROOM_WEB_SCREENSHOTS=<dir> (docs/img for README's
pictures) the search and the timeline are saved there as PNG.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from confluent_kafka import Producer
from selenium import webdriver
from selenium.common.exceptions import TimeoutException, WebDriverException
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait

from postroom.devkit.ports import free_port
from postroom.devkit.processes import Started, stop_process
from postroom.devkit.scratch import scratch, scratch_env
from postroom.headers import DLQ_CLASS_HEADER, DLQ_REASON_HEADER, DLQ_TOPIC_HEADER, ERROR_HEADER
from postroom.relay.db import make_engine, upgrade
from postroom.relay.outbox import enqueue
from postroom.schemas.codec import EmailRequested
from postroom.schemas.framing import SCHEMALESS
from postroom.settings import Settings
from postroom.topics import dead_letter_topic, priority_topic
from support.commands import run_postroom, start_postroom

# One worker runs the module: one console process and one chromium for all its tests (each worker
# would start its own module fixtures).
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.xdist_group("browser")]

OPERATOR_TOKEN = "operator-browser-token-0123456789"  # noqa: S105 - the test's own
READER_TOKEN = "reader-browser-token-0123456789"  # noqa: S105 - the test's own
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACE_URL = "https://traces.example.com/trace/{trace_id}"
WAIT_S = 20.0
START_WAIT_S = 60.0
REPORT_KEY = "report-2026-09"
DEAD = "dead.customer@example.com"
HOSTILE_SUBJECT = "September <script>alert(1)</script> report"


@dataclasses.dataclass(frozen=True)
class Console:
    url: str
    settings: Settings
    engine: sa.Engine
    ids: dict[str, int]  # recipient -> outbox id


def _seed(engine: sa.Engine) -> dict[str, int]:
    """One report run of five recipients in the states a month leaves, and a newer email."""
    states = {"anna@example.com": ("sent", None), "ben@example.com": ("sent", None),
              DEAD: ("dead", "550 5.1.1 <dead.customer@example.com>: no such user"),
              "late@example.com": ("retrying", "451 4.7.1 greylisted, try later"),
              "gone@example.com": ("bounced", "5.1.1 the mailbox is gone (DSN)")}
    with engine.begin() as conn:
        enqueue(conn, key=REPORT_KEY, subject=HOSTILE_SUBJECT, body="b", recipients=list(states))
        enqueue(conn, key="invoice-123", subject="Invoice 123", body="b",
                recipients=["Carla.Customer@Example.com"])
        for recipient, (state, error) in states.items():
            conn.execute(sa.text("""
                UPDATE outbox SET status = :s, last_error = :e, published_at = now(),
                    attempts = CASE WHEN :s = 'dead' THEN 5 ELSE 1 END,
                    sent_at = CASE WHEN :s IN ('sent', 'bounced') THEN now() END,
                    next_attempt_at = CASE WHEN :s = 'retrying' THEN now() + interval '5 minutes' END,
                    updated_at = now(), traceparent = :t
                WHERE recipient = :r"""), {"s": state, "e": error, "r": recipient,
                                           "t": f"00-{TRACE_ID}-00f067aa0ba902b7-01"})
        conn.execute(sa.text("DELETE FROM outbox_queue"))  # no relay runs here
        return {r: i for i, r in conn.execute(sa.text("SELECT id, recipient FROM outbox"))}


def _dead_letter(settings: Settings, outbox_id: int) -> None:
    """The dead letter the sender wrote for DEAD's email after its last attempt."""
    source = priority_topic(settings.topic_prefix, "normal")
    event = EmailRequested(
        idempotency_key=f"{REPORT_KEY}|{DEAD}", message_key=REPORT_KEY, outbox_id=outbox_id,
        recipient=DEAD, sender="reports@example.com", subject="September report", body="b",
        attachments=(), priority="normal", created_at=dt.datetime.now(dt.UTC))
    value, headers = SCHEMALESS.frame(source, event)
    producer = Producer(settings.kafka_client_config())
    producer.produce(dead_letter_topic(settings.topic_prefix),
                     key=event.idempotency_key.encode(), value=value,
                     headers=[*headers, (ERROR_HEADER, b"attempt=5 550 5.1.1 no such user"),
                              (DLQ_CLASS_HEADER, b"permanent"),
                              (DLQ_REASON_HEADER, b"550 5.1.1 no such user"),
                              (DLQ_TOPIC_HEADER, source.encode())])
    assert producer.flush(10) == 0


def _wait_until_serving(url: str, process: Started, log: Path) -> None:
    deadline = time.monotonic() + START_WAIT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"postroom web exited {process.returncode}: {log.read_text()}")
        try:
            if httpx.get(url + "signin", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)  # polling a condition: the server answers
    pytest.fail(f"postroom web did not answer within {START_WAIT_S:.0f}s: {log.read_text()}")


@pytest.fixture(scope="module")
def console(stack_settings: Settings, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[Console]:
    folder = tmp_path_factory.mktemp("web")
    (folder / "operator").write_text(OPERATOR_TOKEN + "\n")
    (folder / "reader").write_text(READER_TOKEN + "\n")
    with scratch(stack_settings, "web") as settings:
        engine = make_engine(settings)
        upgrade(engine, settings.database_schema)
        ids = _seed(engine)
        _dead_letter(settings, ids[DEAD])
        port = free_port()
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("POSTROOM_WEB_")},
               **scratch_env(settings), "POSTROOM_WEB_LISTEN": f"127.0.0.1:{port}",
               "POSTROOM_WEB_OPERATOR_TOKEN_FILE": str(folder / "operator"),
               "POSTROOM_WEB_READER_TOKEN_FILE": str(folder / "reader"),
               "POSTROOM_WEB_TRACE_URL": TRACE_URL}
        log = folder / "web.log"
        process = start_postroom("web", env=env, log=log)
        url = f"http://127.0.0.1:{port}/"
        try:
            _wait_until_serving(url, process, log)
            yield Console(url, settings, engine, ids)
        finally:
            stop_process(process, timeout_s=10)
            engine.dispose()


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver is None:
        pytest.fail("chromium and chromedriver are not installed: run scripts/browser.sh")
    options = Options()
    options.binary_location = chromium
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                     "--window-size=1280,900", "--disable-gpu"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    made = webdriver.Chrome(service=Service(driver), options=options)
    try:
        yield made
    finally:
        made.quit()


@pytest.fixture
def web(browser: WebDriver, console: Console) -> WebDriver:
    """The browser signed out: no cookie left from the test before."""
    browser.get(console.url + "signin")
    browser.delete_all_cookies()
    return browser


def wait_for(driver: WebDriver, css: str) -> str:
    """The text of the first element matching ``css``, once there is one."""
    try:
        WebDriverWait(driver, WAIT_S).until(lambda d: d.find_elements(By.CSS_SELECTOR, css))
    except TimeoutException:
        pytest.fail(f"no {css} on {driver.current_url} within {WAIT_S:.0f}s; the page says: "
                    f"{driver.find_element(By.TAG_NAME, 'body').text[:2000]}")
    return str(driver.find_element(By.CSS_SELECTOR, css).text)


def sign_in(driver: WebDriver, console: Console, token: str, page: str = "search") -> None:
    """Sign in with the keyboard alone: the token field has the focus, Enter submits."""
    driver.get(console.url + page)
    WebDriverWait(driver, WAIT_S).until(lambda d: "/signin" in d.current_url)
    focused = driver.switch_to.active_element
    assert focused.get_attribute("id") == "token"
    focused.send_keys(token, Keys.ENTER)
    WebDriverWait(driver, WAIT_S).until(lambda d: "/signin" not in d.current_url)


def screenshot(driver: WebDriver, name: str) -> None:
    folder = os.environ.get("POSTROOM_WEB_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(Path(folder) / f"console-{name}.png"))


def audit_rows(console: Console) -> list[tuple[str, str, str, list[int]]]:
    with console.engine.connect() as conn:
        return [(r.who, r.action, r.target, list(r.row_ids)) for r in conn.execute(
            sa.text("SELECT who, action, target, row_ids FROM console_audit ORDER BY id"))]


def test_the_console_refuses_to_start_without_a_way_to_sign_in(console: Console) -> None:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("POSTROOM_WEB_")},
           **scratch_env(console.settings), "POSTROOM_WEB_LISTEN": f"127.0.0.1:{free_port()}"}
    proc = run_postroom("web", env=env, timeout_s=60)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "postroom web: configuration error: POSTROOM_WEB_OPERATOR_TOKEN_FILE: postroom web "
        "needs a way to sign in: a token (POSTROOM_WEB_OPERATOR_TOKEN_FILE, "
        "POSTROOM_WEB_READER_TOKEN_FILE) or a single-sign-on proxy "
        "(POSTROOM_WEB_TRUSTED_PROXIES)"]


def test_a_wrong_token_is_refused(web: WebDriver, console: Console) -> None:
    web.get(console.url + "search")
    WebDriverWait(web, WAIT_S).until(lambda d: "/signin" in d.current_url)
    web.switch_to.active_element.send_keys("wrong-token-but-long-enough", Keys.ENTER)
    assert wait_for(web, "#refusal") == "sign-in refused: that token is not valid"
    web.get(console.url + "search")
    WebDriverWait(web, WAIT_S).until(lambda d: "/signin" in d.current_url)  # still signed out
    assert ("anonymous (127.0.0.1)", "sign-in refused", "-", []) in audit_rows(console)


def test_search_by_any_spelling_then_one_emails_timeline(web: WebDriver, console: Console) -> None:
    sign_in(web, console, READER_TOKEN)
    assert wait_for(web, "#who") == "reader token (reader)"
    field = web.find_element(By.ID, "recipient")
    field.send_keys("CARLA.customer@example.COM", Keys.ENTER)
    wait_for(web, "#results")
    links = web.find_elements(By.CSS_SELECTOR, "#results tbody a[href^='/email/']")
    assert [a.text for a in links] == ["Carla.Customer@Example.com"]

    web.get(console.url + f"search?key={REPORT_KEY}")
    wait_for(web, "#results")
    rows = web.find_elements(By.CSS_SELECTOR, "#results tbody tr")
    assert len(rows) == 5
    assert HOSTILE_SUBJECT in rows[0].text  # shown as text: escaped, never run (no alert)
    screenshot(web, "search")

    web.find_element(By.LINK_TEXT, DEAD).click()
    timeline = wait_for(web, "#timeline")
    assert wait_for(web, "#state") == "dead"
    events = [li.text for li in web.find_elements(By.CSS_SELECTOR, "#timeline li")]
    whats = [e.split(" UTC ", 1)[-1] for e in events]
    assert [w.split()[0] for w in whats] == ["enqueued", "published", "attempts", "attempt",
                                             "dead-lettered"]
    assert "550 5.1.1 <dead.customer@example.com>: no such user" in timeline
    trace = web.find_element(By.CSS_SELECTOR, "#trace a")
    assert trace.text == TRACE_ID
    assert trace.get_attribute("href") == TRACE_URL.replace("{trace_id}", TRACE_ID)
    screenshot(web, "timeline")

    web.get(console.url + f"email/{console.ids['late@example.com']}")
    assert "waiting in retry tier 1 (300s)" in wait_for(web, "#timeline")


def test_a_report_run_with_its_csv(web: WebDriver, console: Console) -> None:
    sign_in(web, console, READER_TOKEN, f"report?key={REPORT_KEY}")
    counts = wait_for(web, "#counts")
    assert "dead 1" in counts and "sent 2" in counts and "retrying 1" in counts
    failures = web.find_element(By.ID, "failures").text
    assert DEAD in failures and "gone@example.com" in failures
    href = web.find_element(By.ID, "csv").get_attribute("href")
    cookies = {c["name"]: c["value"] for c in web.get_cookies()}
    csv = httpx.get(str(href), cookies=cookies, timeout=10)
    assert csv.headers["content-type"].startswith("text/csv")
    lines = csv.text.splitlines()
    assert lines[0].startswith("recipient,message_key")
    assert sorted(line.split(",")[0] for line in lines[1:]) == [DEAD, "gone@example.com"]


def test_a_reader_is_refused_an_action(web: WebDriver, console: Console) -> None:
    sign_in(web, console, READER_TOKEN, "suppression")
    web.find_element(By.ID, "address").send_keys("reader.tried@example.com")
    web.find_element(By.ID, "reason").send_keys("no right", Keys.ENTER)
    assert "this needs the operator role" in wait_for(web, "#refusal")
    assert suppressed(console, "reader.tried@example.com") == 0


def suppressed(console: Console, address: str) -> int:
    with console.engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT count(*) FROM suppression WHERE address = :a"),
                                {"a": address}).scalar_one())


def test_an_operator_adds_and_removes_a_suppression(web: WebDriver, console: Console) -> None:
    sign_in(web, console, OPERATOR_TOKEN, "suppression")
    web.find_element(By.ID, "address").send_keys("Moved.Away@Example.com")
    web.find_element(By.ID, "reason").send_keys("asked by phone <b>now</b>")
    web.find_element(By.ID, "expires").send_keys("90d", Keys.ENTER)
    assert wait_for(web, "#done").startswith("suppressed moved.away@example.com until ")
    web.get(console.url + "suppression?q=moved")
    table = wait_for(web, "#entries")
    assert "moved.away@example.com operator" in table and "asked by phone <b>now</b>" in table
    with console.engine.connect() as conn:
        days = conn.execute(sa.text("SELECT extract(epoch FROM expires_at - created_at) / 86400 "
                                    "FROM suppression WHERE address = 'moved.away@example.com'")
                            ).scalar_one()
    assert round(days) == 90
    web.find_element(By.CSS_SELECTOR, "button[aria-label='Remove moved.away@example.com']").click()
    assert wait_for(web, "#done") == "removed moved.away@example.com from the suppression list"
    assert suppressed(console, "moved.away@example.com") == 0
    actions = [(who, action, target) for who, action, target, _ in audit_rows(console)]
    assert actions[-2:] == [("operator token", "suppression add", "moved.away@example.com"),
                            ("operator token", "suppression remove", "moved.away@example.com")]
    web.get(console.url + "audit")
    assert "suppression remove" in wait_for(web, "#audit")


def test_a_forged_post_is_refused(web: WebDriver, console: Console) -> None:
    sign_in(web, console, OPERATOR_TOKEN, "suppression")
    wait_for(web, "#suppress-form")
    # The operator's own browser, signed in, submits the form with a token another site made up.
    web.execute_script(
        "document.querySelector('#suppress-form input[name=csrf]').value = 'forged-by-evil'")
    web.find_element(By.ID, "address").send_keys("forged@example.com", Keys.ENTER)
    assert "CSRF token is missing or wrong" in wait_for(web, "#refusal")
    web.get(console.url + "suppression")
    wait_for(web, "#suppress-form")
    web.execute_script("document.querySelector('#suppress-form input[name=csrf]').remove()")
    web.find_element(By.ID, "address").send_keys("forged@example.com", Keys.ENTER)
    assert "CSRF token is missing or wrong" in wait_for(web, "#refusal")
    assert suppressed(console, "forged@example.com") == 0
    assert not [row for row in audit_rows(console) if row[2] == "forged@example.com"]


def test_a_dead_letter_is_replayed_after_its_confirmation(web: WebDriver,
                                                          console: Console) -> None:
    sign_in(web, console, OPERATOR_TOKEN, "dlq")
    letters = wait_for(web, "#letters")
    assert f"{REPORT_KEY}|{DEAD}" in letters and "dead (replayable)" in letters
    web.find_element(By.LINK_TEXT, f"{REPORT_KEY}|{DEAD}").click()
    assert wait_for(web, "#letter-history") == "attempt=5 550 5.1.1 no such user"
    assert web.find_element(By.ID, "row-state").text == "dead"
    web.find_element(By.ID, "replay").click()
    assert DEAD in wait_for(web, "#plan")
    box = web.find_element(By.ID, "confirm")
    web.find_element(By.CSS_SELECTOR, "form.action button").click()  # not confirmed yet
    assert "/redrive" in web.current_url and not box.is_selected()  # the browser held it back
    box.send_keys(Keys.SPACE)  # ticked with the keyboard
    assert box.is_selected()
    web.find_element(By.CSS_SELECTOR, "form.action button").click()
    assert wait_for(web, "#done").startswith("replayed 1 row(s)")
    with console.engine.connect() as conn:
        status = conn.execute(sa.text("SELECT status FROM outbox WHERE id = :i"),
                              {"i": console.ids[DEAD]}).scalar_one()
    assert status == "pending"
    [replayed] = [row for row in audit_rows(console) if row[1] == "replay"]
    assert replayed[0] == "operator token" and replayed[2].startswith("dead letter ")
    assert replayed[3] == [console.ids[DEAD]]


def test_the_glance_page_refreshes_without_a_reload(web: WebDriver, console: Console) -> None:
    sign_in(web, console, READER_TOKEN, "glance")
    WebDriverWait(web, WAIT_S).until(
        lambda d: d.find_element(By.ID, "glance-at").text.startswith("as of "))
    first = web.find_element(By.ID, "glance-at").text
    web.execute_script("window.postroomMarker = 'same page'")
    WebDriverWait(web, WAIT_S).until(lambda d: d.find_element(By.ID, "glance-at").text != first)
    assert web.execute_script("return window.postroomMarker") == "same page"
    groups = web.find_element(By.CSS_SELECTOR, "#lag tbody").text
    assert console.settings.sender_group in groups and console.settings.recorder_group in groups
    assert web.find_elements(By.CSS_SELECTOR, "#chart-enqueued svg rect")
    errors = [entry for entry in _console_log(web) if "Content Security Policy" in entry]
    assert errors == []


def test_the_glance_page_says_when_its_session_has_gone_idle(web: WebDriver,
                                                             console: Console) -> None:
    """Its refreshes do not keep the session alive: once the session is idle past the limit
    (eight hours ago, as the database has it), the page says so instead of its figures."""
    sign_in(web, console, READER_TOKEN, "glance")
    WebDriverWait(web, WAIT_S).until(
        lambda d: d.find_element(By.ID, "glance-at").text.startswith("as of "))
    with console.engine.begin() as conn:
        conn.execute(sa.text("UPDATE console_session SET seen_at = now() - interval '9 hours'"))
    WebDriverWait(web, WAIT_S).until(lambda d: d.find_element(By.ID, "glance-at").text
                                     == "signed out: reload the page to sign in again")
    web.refresh()
    WebDriverWait(web, WAIT_S).until(lambda d: "/signin" in d.current_url)


def _console_log(driver: WebDriver) -> list[str]:
    try:
        return [str(entry.get("message", "")) for entry in driver.get_log("browser")]
    except WebDriverException:
        return []


LABELLED = """
return Array.from(document.querySelectorAll('input:not([type=hidden]), select, textarea'))
  .filter(el => el.labels.length === 0 && !el.getAttribute('aria-label'))
  .map(el => el.name || el.id);
"""


@pytest.mark.parametrize("page", ["search", f"report?key={REPORT_KEY}", "suppression", "dlq",
                                  "audit", "glance", f"redrive?kind=requeue&key={REPORT_KEY}"])
def test_every_field_has_a_label_and_tab_follows_the_page(web: WebDriver, console: Console,
                                                          page: str) -> None:
    sign_in(web, console, OPERATOR_TOKEN, page)
    web.get(console.url + page)  # loaded afresh: nothing has the focus yet
    wait_for(web, "main h1")
    assert web.execute_script(LABELLED) == []
    focusable = web.execute_script("""
        const all = 'a[href], button, input:not([type=hidden]), select, textarea';
        return Array.from(document.querySelectorAll(all))
          .filter(el => !el.disabled && el.getClientRects().length > 0)""")
    reached: list[WebElement] = []
    for _ in range(3 * len(focusable)):  # a date field takes a Tab per part (day, month, ...)
        web.switch_to.active_element.send_keys(Keys.TAB)
        if not reached or web.switch_to.active_element != reached[-1]:
            reached.append(web.switch_to.active_element)
        if reached[-1] == focusable[-1]:
            break
    assert reached[0].get_attribute("textContent") == "Skip to content"
    assert [el.id for el in reached] == [el.id for el in focusable]  # the order the page reads
    reached[0].send_keys(Keys.ENTER)  # the skip link takes the focus to the content
    assert web.switch_to.active_element.get_attribute("id") == "main"
