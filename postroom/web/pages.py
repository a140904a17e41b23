"""The console's reading pages (search, an email, a report run, the suppression list, dead
letters, a redrive's confirmation, the glance, the audit), each a handler of Console's, and the
values they show."""

from __future__ import annotations

import datetime as dt
import urllib.parse
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from postroom.relay.report import Failure, csv_lines
from postroom.web import forms, timeline
from postroom.web.auth import Identity
from postroom.web.middleware import Refused
from postroom.web.store import ConsoleStore

if TYPE_CHECKING:
    from postroom.web.app import Console

DLQ_PAGE_LETTERS = 50
AUDIT_PAGE_ENTRIES = 100
SUPPRESSION_SHOWN_MAX = 500
REPORT_FAILURES_SHOWN = 500


async def search(console: Console, request: Request, who: Identity) -> Response:
    wanted = forms.search_filter(request.query_params)
    found = await run_in_threadpool(console.store.search, wanted, forms.PAGE_ROWS + 1)
    rows = found.rows[:forms.PAGE_ROWS]
    next_page = older = scanned_to = None
    if len(found.rows) > forms.PAGE_ROWS:
        next_page = _search_after(wanted, rows[-1]["keyset_at"], rows[-1]["id"])
    elif found.scanned_to is not None:  # a search by state stopped at its bound: go on from there
        older = _search_after(wanted, *found.scanned_to)
        scanned_to = found.scanned_to[0]
    return console.render(request, "search.html", who=who, rows=rows, wanted=wanted,
                          states=forms.STATES, next_page=next_page, older=older,
                          scanned_to=scanned_to,
                          first_page="/search?" + urllib.parse.urlencode(wanted.as_params())
                          if wanted.after else None)


def _search_after(wanted: forms.SearchFilter, keyset_at: dt.datetime, row_id: int) -> str:
    """The search's link to the rows older than (keyset_at, row_id)."""
    return "/search?" + urllib.parse.urlencode(
        {**wanted.as_params(), "after": forms.cursor(keyset_at, row_id)})


async def email(console: Console, request: Request, who: Identity) -> Response:
    row_id = int(request.path_params["row_id"])
    found = (await run_in_threadpool(console.store.email, row_id)
             if row_id <= forms.ROW_ID_MAX else None)
    if found is None:
        raise Refused(404, f"no outbox row {row_id}")
    events = timeline.events(found.row, found.ledger, found.suppression,
                             console.settings.retry_delays_s)
    return console.render(request, "email.html", who=who, row=found.row, events=events,
                       trace=timeline.trace_link(found.row.get("traceparent"),
                                                 console.settings.web_trace_url),
                       redrivable=found.row["status"] in ("failed", "dead"))


async def report(console: Console, request: Request, who: Identity) -> Response:
    key = forms.text_field(request.query_params, "key", forms.KEY_MAX_CHARS, "message key")
    # The page shows the first failures (a run of a million would be a page of 100 MB); the
    # CSV has every one.
    run = (await run_in_threadpool(console.store.report_run, key, REPORT_FAILURES_SHOWN)
           if key else None)
    return console.render(request, "report.html", who=who, key=key, run=run,
                       failed=sum(n for s, n in run.counts if s in timeline.FINAL_BAD)
                       if run else 0,
                       csv_link="/report.csv?" + urllib.parse.urlencode({"key": key})
                       if key else None,
                       total=sum(n for _, n in run.counts) if run else 0)


async def report_csv(console: Console, request: Request, who: Identity) -> Response:
    key = forms.required_key(request.query_params)
    batches = console.store.failure_batches(key)
    # The first batch runs the query: a database that does not answer is still a 503 page,
    # not a download cut short.
    first = await run_in_threadpool(next, batches, None)
    name = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in key)[:80]
    return StreamingResponse(csv_pieces(first, batches),
                             media_type="text/csv; charset=utf-8",
                             headers={"content-disposition":
                                      f'attachment; filename="failures-{name}.csv"'})


async def suppression(console: Console, request: Request, who: Identity) -> Response:
    wanted = forms.text_field(request.query_params, "q", 320, "search")
    # One page of the list, searched by the database: it may hold a million addresses.
    entries = await run_in_threadpool(console.store.suppressed, wanted,
                                      SUPPRESSION_SHOWN_MAX + 1)
    return console.render(request, "suppression.html", who=who, q=wanted or "",
                       entries=entries[:SUPPRESSION_SHOWN_MAX],
                       more=len(entries) > SUPPRESSION_SHOWN_MAX,
                       default_expiry=as_days(console.settings.suppression_expiry_s))


async def dead_letters(console: Console, request: Request, who: Identity) -> Response:
    before = forms.dlq_cursor(request.query_params.get("before"))
    found = await run_in_threadpool(console.store.dead_letter_page, before, DLQ_PAGE_LETTERS)
    return console.render(request, "dlq.html", who=who, letters=found.letters,
                       first=before is not None, next_page=None if found.before is None
                       else "/dlq?" + urllib.parse.urlencode(
                           {"before": forms.dlq_cursor_text(found.before)}))


async def dead_letter(console: Console, request: Request, who: Identity) -> Response:
    partition, offset = forms.letter_at(request.query_params.get("at"))
    found = await run_in_threadpool(console.store.dead_letter_at, partition, offset)
    if found is None:
        raise Refused(404, f"no dead letter at partition {partition}, offset {offset}")
    return console.render(request, "letter.html", who=who, found=found,
                       at=f"{partition}@{offset}")


async def confirm_redrive(console: Console, request: Request, who: Identity) -> Response:
    kind, key, recipient = redrive_fields(request.query_params)
    plan = await run_in_threadpool(redrive_plan, console.store, kind, key, recipient)
    return console.render(request, "redrive.html", who=who, kind=kind, key=key,
                       recipient=recipient or "", plan=plan)


def redrive_plan(store: ConsoleStore, kind: str, key: str, recipient: str | None) -> Any:
    """What a redrive of ``key`` would move (a replay's key is the dead letter's partition@offset)."""
    if kind == "replay":  # the key is the dead letter's place, partition@offset
        return store.plan_replay(*forms.letter_at(key))
    return store.plan_requeue(key, recipient)


async def glance(console: Console, request: Request, who: Identity) -> Response:
    return console.render(request, "glance.html", who=who)


async def glance_json(console: Console, request: Request, who: Identity) -> Response:
    return JSONResponse(await run_in_threadpool(console.store.glance))


async def audit(console: Console, request: Request, who: Identity) -> Response:
    before_id = forms.audit_cursor(request.query_params.get("before"))
    entries = await run_in_threadpool(console.store.audit, before_id, AUDIT_PAGE_ENTRIES + 1)
    more = len(entries) > AUDIT_PAGE_ENTRIES
    entries = entries[:AUDIT_PAGE_ENTRIES]
    return console.render(request, "audit.html", who=who, entries=entries,
                       next_page=f"/audit?before={entries[-1].id}" if more else None)


def redrive_fields(source: Any) -> tuple[str, str, str | None]:
    kind = forms.text_field(source, "kind", 10, "kind")
    if kind not in ("replay", "requeue"):
        raise forms.FormError("kind: replay or requeue")
    recipient = forms.text_field(source, "recipient", 320, "recipient")
    return kind, forms.required_key(source), recipient if kind == "requeue" else None


def csv_pieces(first: list[Failure] | None, rest: Iterator[list[Failure]]) -> Iterator[str]:
    """The CSV render_csv writes, a batch of failures a piece (the header row first)."""
    yield csv_lines((), header=True)
    if first is not None:
        yield csv_lines(first)
        yield from (csv_lines(batch) for batch in rest)


def as_days(seconds: float) -> str:
    return f"{seconds / 86400:g}d" if seconds >= 86400 else f"{seconds / 3600:g}h"


def as_utc(moment: Any) -> str:
    if isinstance(moment, dt.datetime):
        return moment.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return "-"
