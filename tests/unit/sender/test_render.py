"""postroom.sender.render and postroom.sender.template: an email filled into its report's template
is byte for byte the email the email package builds in full; the template's cut, its cache and
which recipients may take it."""

from __future__ import annotations

import asyncio
import datetime as dt
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from postroom.errors import UnsafeHeaderError
from postroom.schemas.codec import EmailRequested
from postroom.sender import render
from postroom.sender.delivery import Delivery
from postroom.sender.message import build_message
from postroom.sender.outcome import Failure, Stage
from postroom.sender.render import Built, TemplateCache, Templated, plain_lines, serialise
from postroom.sender.template import Template, TemplateError
from support.fuzz import examples

NOW = dt.datetime(2026, 10, 2, 7, 0, 5, 734512, tzinfo=dt.UTC)  # the Date line drops the fraction
FLAGS = [(utf8, eight_bit) for utf8 in (False, True) for eight_bit in (True, False)]
_BOUNDARY = re.compile(rb"={15}\d+==")


def event(**changes: Any) -> EmailRequested:
    values: dict[str, Any] = {
        "idempotency_key": "sales-report-2026-09|finance@example.com",
        "message_key": "sales-report-2026-09",
        "outbox_id": 1,
        "recipient": "finance@example.com",
        "sender": "Reports <reports@example.com>",
        "subject": "Sales report — September 2026",
        "body": "The September sales report.\nGrüße\n.a line with a dot\n",
        "attachments": (),
        "priority": "normal",
        "created_at": NOW,
    }
    values.update(changes)
    return EmailRequested(**values)


def full_build(e: EmailRequested, utf8: bool, eight_bit: bool) -> bytes:
    message = build_message(e, attachments_root=None, now=NOW)
    return _BOUNDARY.sub(b"BOUNDARY", serialise(message, utf8=utf8, eight_bit=eight_bit))


def templated(e: EmailRequested, utf8: bool, eight_bit: bool,
              cache: TemplateCache | None = None) -> bytes:
    lines = plain_lines(e, NOW)
    assert lines is not None
    content = Templated(e, lines, TemplateCache() if cache is None else cache).serialise(utf8=utf8,
                                                                     eight_bit=eight_bit)
    return _BOUNDARY.sub(b"BOUNDARY", content)


CASES = {
    "plain": event(),
    "ascii body": event(body="hello\n", subject="Report"),
    "html": event(html="<p>Grüße, <b>September</b></p>"),
    "long folded subject": event(subject="Quarterly sales — " * 12),
    "subject with an encoded-word lookalike": event(subject="=?utf-8?q?not_one?= really"),
    "bare sender": event(sender="reports@example.com"),
    "sender with an IDNA domain": event(sender="Berichte <berichte@bücher.example>"),
    "sender with a non-ASCII name": event(sender="Résumé Team <team@example.com>"),
    "long recipient": event(recipient="a." * 30 + "b@example.com"),
    "empty body": event(body=""),
    "long body lines": event(body=("x" * 990 + "\n") * 3),
    "a body line that looks like a header": event(body="To: someone@else.example\n"),
    # emails of their own: the subject, the body or both are holes of the template
    "own subject and 7bit body": event(subject="Invoice 1042 for September", body="Dear Ann,\n"),
    "own subject, quoted-printable body": event(subject="Invoice 7", body="x" * 90 + "=\n"),
    "own subject, base64 body": event(subject="Rechnung 7", body="Grüße aus Köln " * 30),
    "own subject, 8bit body kept in the template": event(subject="Invoice 8"),
    "own subject with specials": event(subject='Re: (draft) "Q3" <x@y> [a\\b] 100%; ok?'),
    "own subject at the longest one line holds": event(subject="s" * 69),
    "subject one longer, kept in the template": event(subject="s" * 70),
    "subject with two spaces, kept": event(subject="Invoice  7"),
    "subject with an equals sign, kept": event(subject="a=b"),
    "own body with CRLF, CR and tabs": event(subject="Report", body="a\r\nb\rc\td \n\n"),
    "own body starting lines with From and dots": event(subject="R", body="From me\n.\n..x\n"),
    "own body without a last line break": event(subject="R", body="no end"),
    "own body with control characters": event(subject="R", body="a\x00b\x0bc\x0cd\x1b\n"),
    "own subject with HTML": event(subject="Invoice 9", html="<p>Grüße</p>"),
    "own subject, body and HTML": event(subject="Invoice 11", body="Dear Ann,\n",
                                        html="<p>Dear Ann</p>"),
    "own HTML in long lines": event(subject="Invoice 12", body="x" * 100,
                                    html="<p>" + "y" * 100 + "</p>\n"),
    "own HTML, non-ASCII in long lines": event(subject="R", body="Hallo " * 20,
                                               html="<p>Grüße aus Köln</p>" * 8),
    "own HTML without a last line break": event(subject="R", body="", html="<b>x</b>"),
}


@pytest.mark.parametrize(("utf8", "eight_bit"), FLAGS)
@pytest.mark.parametrize("name", CASES)
def test_templated_bytes_equal_the_full_build(name: str, utf8: bool, eight_bit: bool) -> None:
    e = CASES[name]
    assert templated(e, utf8, eight_bit) == full_build(e, utf8, eight_bit)


_ATOM = st.text("abcxyzABC019_+-", min_size=1, max_size=12)


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(local=st.lists(_ATOM, min_size=1, max_size=3).map(".".join),
       domain=st.lists(st.text("abz09-", min_size=1, max_size=10).filter(
           lambda label: not label.startswith("-") and not label.endswith("-")),
           min_size=1, max_size=3).map(lambda labels: ".".join([*labels, "example"])),
       subject=st.text(st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp")),
                       min_size=1, max_size=120).filter(str.strip),
       body=st.text(max_size=300).map(lambda text: text.replace("\r", "")),
       key=st.text(min_size=1, max_size=40),
       flags=st.sampled_from(FLAGS))
def test_every_plain_recipient_gets_the_bytes_of_a_full_build(
        local: str, domain: str, subject: str, body: str, key: str,
        flags: tuple[bool, bool]) -> None:
    e = event(recipient=f"{local}@{domain}", subject=subject, body=body, idempotency_key=key)
    # Too long for one line: built in full, as the next test shows.
    assume(plain_lines(e, NOW) is not None)
    _assert_templated_is_the_full_build(e, flags)


def _assert_templated_is_the_full_build(e: EmailRequested, flags: tuple[bool, bool],
                                        *caches: TemplateCache) -> None:
    """A fresh template (and one from each of ``caches``) gives ``e`` a full build's bytes, or
    refuses it as the full build does."""
    try:
        expected = full_build(e, *flags)
    except ValueError:
        with pytest.raises(ValueError):
            templated(e, *flags)
        return
    assert templated(e, *flags) == expected
    for cache in caches:
        assert templated(e, *flags, cache) == expected


_ASCII_TEXT = st.text(st.characters(min_codepoint=0, max_codepoint=127), max_size=400)


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(subject=st.text(st.characters(min_codepoint=32, max_codepoint=126), min_size=1,
                       max_size=80).filter(str.strip),
       body=st.one_of(_ASCII_TEXT, st.text(max_size=400),
                      st.lists(st.text("ab =.\tü", max_size=120), max_size=6).map("\n".join)),
       html=st.one_of(st.none(), st.just("<p>hi</p>"), _ASCII_TEXT, st.text(max_size=300)),
       flags=st.sampled_from(FLAGS))
def test_every_email_of_its_own_gets_the_bytes_of_a_full_build(
        subject: str, body: str, html: str | None, flags: tuple[bool, bool]) -> None:
    """Subjects and bodies of their own (an invoice run): those that go into holes of the
    template come out as the email package writes them, whether the template was made for this
    email or, from one cache every example shares, for an earlier one."""
    e = event(recipient="ann@example.com", subject=subject, body=body, html=html)
    lines = plain_lines(e, NOW)
    assert lines is not None
    assume(lines.own is not None)
    _assert_templated_is_the_full_build(e, flags, _SHARED_CACHE)


_SHARED_CACHE = TemplateCache()  # across the examples of the test above


def test_a_body_holding_the_templates_boundary_is_built_in_full() -> None:
    """The email package picks a boundary no body holds; a template's is fixed, so an email
    whose body holds it is built in full instead (and gets a boundary of its own)."""
    cache = TemplateCache()
    first = event(subject="Invoice 1", body="Dear Ann,\n", html="<p>Dear Ann</p>")
    templated(first, False, True, cache)
    lines = plain_lines(first, NOW)
    assert lines is not None
    template = cache.get(first, utf8=False, eight_bit=True, own=lines.own)
    assert template.boundary is not None
    tricky = event(subject="Invoice 2",
                   body=f"Dear Bob,\n--{template.boundary.decode()}\nnot a part\n",
                   html="<p>Dear Bob</p>")
    tricky_lines = plain_lines(tricky, NOW)
    assert tricky_lines is not None
    assert cache.get(tricky, utf8=False, eight_bit=True, own=tricky_lines.own) is template
    assert tricky_lines.fill(template) is None
    content = Templated(tricky, tricky_lines, cache).serialise(utf8=False, eight_bit=True)
    assert template.boundary not in content.split(b"\r\n\r\n", 1)[0]  # another boundary
    assert _BOUNDARY.sub(b"BOUNDARY", content) == full_build(tricky, False, True)


@pytest.mark.parametrize(("changes", "subject_hole", "body_hole"), [
    ({"subject": "Invoice 7", "body": "hi\n"}, True, True),
    ({"subject": "Invoice 7"}, True, False),  # Grüße in short lines: 8bit
    ({"subject": "Rechnung für Ann", "body": "hi\n"}, False, True),
    ({"subject": "Invoice 7", "body": "hi\n", "html": "<p>hi</p>"}, True, True),
    ({"subject": "Invoice 7", "body": "hi\n", "html": "<p>Grüße</p>"}, True, False),  # 8bit
    ({"subject": "Grüße"}, False, False),
    ({"subject": "a=b", "body": "hi\n"}, False, True),  # an encoded-word lookalike could start
    ({"subject": "Invoice 7", "body": "hi\n" * (render.ENCODED_BODY_MAX_CHARS // 3 + 1)},
     True, False),  # a long body stays in its template, encoded once
])
def test_what_goes_into_holes(changes: dict[str, Any], subject_hole: bool,
                              body_hole: bool) -> None:
    own = render.own_of(event(**changes))
    if not (subject_hole or body_hole):
        assert own is None
        return
    assert own is not None
    assert (own.subject is not None, bool(own.bodies)) == (subject_hole, body_hole)
    if subject_hole:
        assert own.subject == b"Subject: " + changes["subject"].encode()


@pytest.mark.parametrize("recipient", [
    "o'brien@example.com",          # atext the email package may quote
    "a=?utf-8?q?x?=@example.com",   # an encoded-word lookalike
    "jürgen@example.com",           # SMTPUTF8
    "finance@bücher.example",       # IDNA
    "x" * 64 + "@" + "y" * 10 + ".example",  # too long for one unfolded line
    "a..b@example.com",
    ".a@example.com",
])
def test_other_recipients_are_built_in_full(recipient: str) -> None:
    assert plain_lines(event(recipient=recipient), NOW) is None


def test_a_long_message_id_domain_is_built_in_full() -> None:
    assert plain_lines(event(sender="r@" + "d" * 60 + ".example"), NOW) is None


def test_a_naive_time_is_refused() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        plain_lines(event(), NOW.replace(tzinfo=None))


def test_the_message_id_is_the_one_a_full_build_gives() -> None:
    e = event()
    lines = plain_lines(e, NOW)
    assert lines is not None
    assert Templated(e, lines, TemplateCache()).message_id == Built(
        build_message(e, attachments_root=None, now=NOW)).message_id


def test_an_encoded_line_break_in_the_subject_is_refused_by_the_template() -> None:
    with pytest.raises(UnsafeHeaderError):
        TemplateCache().get(event(subject="=?utf-8?q?Hi=0D=0ABcc:_all@example.com?="),
                            utf8=False, eight_bit=True)


CONTENT = b"From: a@example.com\r\nTo: b@example.com\r\nSubject: s\r\nDate: d\r\nMessage-ID: <m>\r\n"


@pytest.mark.parametrize(("content", "problem"), [
    (CONTENT + b"\r\nbody", None),
    (CONTENT, "no end of the header block"),
    (CONTENT.replace(b"To: b@example.com\r\n", b"To: b@example.com,\r\n c@example.com\r\n")
     + b"\r\n", "folded"),
    (CONTENT + b"To: c@example.com\r\n\r\n", "2 lines start with b'To: '"),
    (CONTENT.replace(b"Date: d\r\n", b"") + b"\r\n", "0 lines start with b'Date: '"),
    (b"Date: d\r\nTo: b@example.com\r\nMessage-ID: <m>\r\n\r\n", "out of order"),
])
def test_the_cut_needs_one_unfolded_line_of_each(content: bytes, problem: str | None) -> None:
    if problem is None:
        template = Template.cut(content)
        assert template.fill(b"To: x@y", b"Date: D", b"Message-ID: <M>") == (
            b"From: a@example.com\r\nTo: x@y\r\nSubject: s\r\nDate: D\r\nMessage-ID: <M>\r\n\r\nbody")
        return
    with pytest.raises(TemplateError, match=re.escape(problem)):
        Template.cut(content)


def test_a_cut_with_the_subject_and_the_body_as_holes() -> None:
    template = Template.cut(CONTENT + b"\r\nold body\r\n",
                            (b"To: ", b"Subject: ", b"Date: ", b"Message-ID: "),
                            bodies=(b"old body\r\n",))
    assert template.fill(b"To: x@y", b"Subject: S", b"Date: D", b"Message-ID: <M>",
                         bodies=(b"new\r\n",)) == (
        b"From: a@example.com\r\nTo: x@y\r\nSubject: S\r\nDate: D\r\nMessage-ID: <M>\r\n"
        b"\r\nnew\r\n")
    with pytest.raises(ValueError, match="takes 4 lines and 1 bodies, not 3 and 0"):
        template.fill(b"To: x@y", b"Date: D", b"Message-ID: <M>")
    with pytest.raises(TemplateError, match="a body is not where its part begins"):
        Template.cut(CONTENT + b"\r\nold body\r\n", bodies=(b"other\r\n",))
    with pytest.raises(TemplateError, match="To, Subject, Date, Message-ID are out of order"):
        Template.cut(CONTENT.replace(b"Subject: s\r\n", b"") + b"Subject: s\r\n\r\n",
                     (b"To: ", b"Subject: ", b"Date: ", b"Message-ID: "))


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> list[EmailRequested]:
    """The events the template cache built a template for (its misses), in turn."""
    built: list[EmailRequested] = []
    build = render.build_template

    def counted(e: EmailRequested, **flags: bool) -> Template:  # flags and holes
        built.append(e)
        return build(e, **flags)

    monkeypatch.setattr(render, "build_template", counted)
    return built


def test_the_cache_builds_once_per_report_and_flags(builds: list[EmailRequested]) -> None:
    cache = TemplateCache()
    for n in range(5):
        templated(event(recipient=f"user{n}@example.com"), False, True, cache)
    templated(event(), False, False, cache)
    assert (len(builds), len(cache)) == (2, 2)  # four of the six were found


def test_emails_of_their_own_share_one_template_per_sender_encoding_and_flags(
        builds: list[EmailRequested]) -> None:
    """An invoice run (a subject and a body per recipient) builds a template per body
    encoding, not one per email."""
    cache = TemplateCache()
    for n in range(5):
        templated(event(recipient=f"c{n}@example.com", subject=f"Invoice {n}",
                        body=f"Dear customer {n},\nyour invoice is attached.\n"), False, True,
                  cache)
    templated(event(subject="Invoice 9", body="y" * 100 + "\n"), False, True, cache)  # q-p
    templated(event(subject="Invoice 9", body="hi\n", sender="other@example.com"), False, True,
              cache)
    assert (len(builds), len(cache)) == (3, 3)


def test_the_cache_keeps_to_its_budget_least_recent_out(builds: list[EmailRequested]) -> None:
    measure = TemplateCache()
    measure.get(event(subject="Report 0"), utf8=False, eight_bit=True)
    one = measure.size  # every "Report n" costs the same
    cache = TemplateCache(max_bytes=one * 8 + one // 2)
    subjects = [f"Report {n}" for n in range(9)]
    for subject in subjects:
        cache.get(event(subject=subject), utf8=False, eight_bit=True)
    assert (len(cache), cache.size) == (8, one * 8)
    cache.get(event(subject=subjects[8]), utf8=False, eight_bit=True)
    assert [e.subject for e in builds] == ["Report 0", *subjects]  # the last one was found
    cache.get(event(subject=subjects[0]), utf8=False, eight_bit=True)  # dropped first: rebuilt
    assert [e.subject for e in builds[-2:]] == subjects[8:] + subjects[:1]


def test_a_template_over_its_share_of_the_cache_is_not_kept(builds: list[EmailRequested]) -> None:
    cache = TemplateCache(max_bytes=8 * 1024)
    big = event(body="x" * 2000)
    for _ in range(2):
        cache.get(big, utf8=False, eight_bit=True)
    assert (len(cache), len(builds)) == (0, 2)


@pytest.mark.parametrize(("changes", "kind"), [
    ({}, Templated),
    ({"html": "<p>hi</p>"}, Templated),
    ({"recipient": "o'brien@example.com"}, Built),
    ({"attachments": ("report.csv",)}, Built),
    ({"inline": ("logo.png",)}, Built),
])
def test_the_delivery_templates_only_plain_emails_without_files(
        tmp_path: Path, changes: dict[str, Any], kind: type) -> None:
    for name in ("report.csv", "logo.png"):
        (tmp_path / name).write_bytes(b"a,b\n")
    delivery = Delivery("reports@example.com", tmp_path, 30.0)
    e = event(**({"html": "<p><img src='cid:logo.png'></p>"} if "inline" in changes else {}),
              **changes)
    payload = asyncio.run(delivery._payload(e, NOW))
    assert type(payload) is kind
    assert payload.message_id == Built(build_message(
        e, attachments_root=tmp_path, now=NOW)).message_id


class AcceptsThenHangs:
    """A slot whose server says 250 and whose send then does not return before the deadline."""

    async def send(self, message: Any, sender: str, recipient: str,
                   on_accepted: Any = None) -> Any:
        on_accepted(250, "2.0.0 queued as 7")
        await asyncio.sleep(30)


class HangsBeforeTheReply:
    async def send(self, message: Any, sender: str, recipient: str,
                   on_accepted: Any = None) -> Any:
        await asyncio.sleep(30)


def test_a_250_read_as_the_deadline_passes_is_the_reply() -> None:
    delivery = Delivery("reports@example.com", None, deadline_s=0.1)
    told: list[str] = []
    reply, message_id = asyncio.run(delivery.send(event(), AcceptsThenHangs(),  # type: ignore[arg-type]
                                                  NOW, told.append))
    assert (reply.stage, reply.code, reply.text) == (Stage.DATA, 250, "2.0.0 queued as 7")
    assert told == [message_id] and message_id.startswith("<")


def test_a_send_with_no_reply_by_the_deadline_times_out() -> None:
    delivery = Delivery("reports@example.com", None, deadline_s=0.1)
    told: list[str] = []
    reply, _ = asyncio.run(delivery.send(event(), HangsBeforeTheReply(),  # type: ignore[arg-type]
                                         NOW, told.append))
    assert (reply.stage, reply.failure, told) == (Stage.LOCAL, Failure.TIMEOUT, [])


def test_an_email_whose_template_cannot_be_cut_is_built_in_full(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A template that cannot be cut for a server's variant costs a full build, not the email:
    at the delivery's check and at the send."""
    def uncuttable(content: bytes, *args: Any, **kwargs: Any) -> Template:
        raise TemplateError("a body is not where its part begins")

    e = event(subject="Invoice 3", body="Dear Ann,\n")
    delivery = Delivery("reports@example.com", None, 30.0)
    monkeypatch.setattr(Template, "cut", uncuttable)
    payload = asyncio.run(delivery._payload(e, NOW))
    assert type(payload) is Built
    lines = plain_lines(e, NOW)
    assert lines is not None
    content = Templated(e, lines, TemplateCache()).serialise(utf8=True, eight_bit=False)
    assert _BOUNDARY.sub(b"BOUNDARY", content) == full_build(e, True, False)


def test_a_body_too_big_to_keep_encoded_is_encoded_once_and_is_no_hole(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A report's body whose encoding would overrun its share of the budget is remembered as no
    hole (it stays in its template), not encoded again for every recipient; a small one is kept
    encoded; the budget holds."""
    encoded: list[str] = []
    real = render._encoded

    def counted(body: str) -> tuple[bytes, str] | None:
        encoded.append(body)
        return real(body)

    monkeypatch.setattr(render, "_encoded", counted)
    bodies = render.EncodedBodies(max_bytes=8 * 1024)  # a share of 1 KiB
    small, big = "x" * 100 + "\n", "漢" * 200  # 4 bytes a character held, base64: over 1 KiB
    for _ in range(3):
        assert bodies.get(big) is None
        kept = bodies.get(small)
        assert kept is not None and kept[1] == "quoted-printable"
    assert encoded == [big, small]
    for n in range(40):  # fill past the budget: least recently used out first
        bodies.get(f"body {n}\n" * 40)
    assert 0 < bodies._cache.size <= bodies._cache.max_bytes
    assert big not in bodies._cache and small not in bodies._cache
