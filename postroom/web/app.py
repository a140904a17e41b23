"""The console's web application: Starlette routes over a ConsoleStore, pages rendered by Jinja2
with every value escaped, a session cookie signed per process, a CSRF token on every POST, a
strict Content-Security-Policy on every response, and an audit entry for every action."""

from __future__ import annotations

import functools
import logging
import secrets
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import jinja2
from sqlalchemy import exc as sa_errors
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from postroom.errors import (
    InvalidContentError,
    KafkaClientError,
    PostroomError,
    first_line,
    printable,
)
from postroom.relay.report import Failure, csv_lines
from postroom.relay.suppression import NotSuppressedError
from postroom.settings import Settings
from postroom.web import auth, forms, timeline
from postroom.web.auth import CSRF_FIELD, Identity, Role
from postroom.web.store import Action, ConsoleStore

log = logging.getLogger(__name__)

HERE = Path(__file__).parent
SESSION_COOKIE = "postroom_console"
SESSION_MAX_AGE_S = 8 * 3600
DLQ_PAGE_LETTERS = 50
AUDIT_PAGE_ENTRIES = 100
SUPPRESSION_SHOWN_MAX = 500
REPORT_FAILURES_SHOWN = 500
# The largest form any page posts is a few hundred bytes: a body beyond this is refused before
# it is read (an outsider's sign-in POST would otherwise be held in memory whole).
FORM_MAX_BYTES = 64 * 1024
# No inline script or style anywhere: the pages load /static/console.js and console.css only.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
SECURITY_HEADERS = (
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-store"),
)


class SecurityHeaders:
    """Adds SECURITY_HEADERS to every response (pages, JSON, static files, errors)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {name for name, _ in SECURITY_HEADERS}
                message["headers"] = [(n, v) for n, v in message.get("headers", [])
                                      if n.lower() not in names] + list(SECURITY_HEADERS)
            await send(message)

        await self.app(scope, receive, with_headers)


class Refused(Exception):
    """A request the console answers with a page saying why (status, one line)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class LimitedBody:
    """Refuses a request body over FORM_MAX_BYTES (Refused 413 from the handler's first read),
    by its Content-Length or, chunked, as it arrives: nothing past the limit is read."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers", [])).get(b"content-length", b"0")
        too_large = Refused(413, f"refused: a request body larger than {FORM_MAX_BYTES} bytes")
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            if not declared.isdigit() or int(declared) > FORM_MAX_BYTES:
                raise too_large
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > FORM_MAX_BYTES:
                raise too_large
            return message

        await self.app(scope, limited, send)


Handler = Callable[["Console", Request, Identity], Awaitable[Response]]
OpenHandler = Callable[["Console", Request], Awaitable[Response]]


def answered(handler: OpenHandler) -> Any:
    """A route handler whose refusals and failures become a page (with the security headers)
    saying why in one line; an unexpected failure is logged."""

    @functools.wraps(handler)
    async def route(self: Console, request: Request) -> Response:
        try:
            return await handler(self, request)
        except Refused as exc:
            return self.refusal(request, exc.status, str(exc))
        except HTTPException as exc:  # Starlette's own refusal of a form (too many fields)
            return self.refusal(request, exc.status_code,
                                printable((str(exc.detail).splitlines() or [""])[0]))
        except forms.FormError as exc:
            return self.refusal(request, 400, str(exc))
        except (InvalidContentError, NotSuppressedError) as exc:
            return self.refusal(request, 400, printable(str(exc)))
        except KafkaClientError as exc:
            return self.refusal(request, 502, printable(str(exc)))
        except PostroomError as exc:
            return self.refusal(request, 500, printable(str(exc)))
        except sa_errors.DBAPIError as exc:
            log.warning("the database refused a console request: %s", first_line(exc))
            return self.refusal(request, 503, "the database does not answer: "
                                f"{printable(first_line(exc))}")
        except Exception:
            log.exception("console request %s %s failed", request.method, request.url.path)
            return self.refusal(request, 500, "internal error (postroom web logged it)")

    return route


def page(needed: Role = Role.READER, *, signed_in: bool = True) -> Callable[[Handler], Any]:
    """A route handler that needs a signed-in identity with ``needed``; a POST also needs the
    session's CSRF token in its form, checked before anything else is read or done, and one
    refused (a field, a row that is not there) is audited with why."""

    def wrap(handler: Handler) -> Any:
        @functools.wraps(handler)
        async def admitted(self: Console, request: Request) -> Response:
            who = await self.admit(request, needed, redirect=signed_in)
            if isinstance(who, Response):
                return who
            if request.method != "POST":
                return await handler(self, request, who)
            try:
                return await handler(self, request, who)
            except (Refused, forms.FormError, InvalidContentError, NotSuppressedError) as exc:
                await self.audit_refusal(request, who, printable(first_line(exc)))
                raise

        return answered(admitted)

    return wrap


class Console:
    """The routes, their templates and the store they read."""

    def __init__(self, settings: Settings, store: ConsoleStore) -> None:
        auth.check_configured(settings)
        self.settings = settings
        self.store = store
        self.templates = jinja2.Environment(
            loader=jinja2.FileSystemLoader(HERE / "templates"),
            autoescape=True,  # every value a job, a server or a person wrote is escaped
            undefined=jinja2.StrictUndefined)
        self.templates.filters["utc"] = _utc
        # The sessions signed in by this process and not signed out, by id, with when each was
        # last seen: a cookie is signed, so without this a copy of it would outlive a sign-out.
        self.sessions: dict[str, float] = {}
        self.throttle = auth.SignInThrottle()

    # --- who is asking -------------------------------------------------------------------
    def identity(self, request: Request) -> Identity | None:
        """The trusted proxy's header first (it signs every request), then the session."""
        peer = request.client.host if request.client else None
        proxied = auth.by_proxy(peer, request.headers.getlist(auth.PROXY_EMAIL_HEADER),
                                self.settings)
        if proxied is not None:
            return proxied
        session = request.session
        if (session.get("who") and session.get("role") in {r.value for r in Role}
                and self._live(session.get("sid"))):
            return Identity(str(session["who"]), Role(session["role"]), "token")
        return None

    def _live(self, sid: object) -> bool:
        now = time.monotonic()
        for stale in [s for s, seen in self.sessions.items() if now - seen > SESSION_MAX_AGE_S]:
            del self.sessions[stale]
        if not isinstance(sid, str) or sid not in self.sessions:
            return False
        self.sessions[sid] = now
        return True

    async def admit(self, request: Request, needed: Role, *, redirect: bool) -> Identity | Response:
        """Who may go on (Refused otherwise): a POST's CSRF token first, then the identity and
        its role; a GET page without one is sent to sign in."""
        if request.method == "POST":
            try:
                await self.check_csrf(request)
            except Refused as exc:
                if exc.status == 403 and (forger := self.identity(request)) is not None:
                    await self.audit_refusal(request, forger, "CSRF token missing or wrong")
                raise
        who = self.identity(request)
        if who is None:
            if request.method == "GET" and redirect:
                target = request.url.path + (f"?{request.url.query}" if request.url.query
                                             else "")
                return RedirectResponse("/signin?" + urllib.parse.urlencode({"next": target}),
                                        status_code=303)
            raise Refused(401, "sign in first")
        if not who.role.may(needed):
            await self.audit_refusal(request, who, f"needs the {needed.value} role")
            raise Refused(403, f"this needs the {needed.value} role; you are signed in as "
                               f"{who.who} with the {who.role.value} role")
        return who

    async def audit_refusal(self, request: Request, who: Identity, why: str) -> None:
        """A signed-in user's refused action, in the audit as a row of its own (an anonymous
        one is not: it names no one, and would let anyone fill the table)."""
        await run_in_threadpool(self.store.record, Action(
            who, f"refused: {request.method} {request.url.path}", why))

    @staticmethod
    def csrf_token(request: Request) -> str:
        token = request.session.get("csrf")
        if not isinstance(token, str) or not token:
            token = auth.new_csrf_token()
            request.session["csrf"] = token
        return token

    async def check_csrf(self, request: Request) -> FormData:
        form = await request.form()
        if not auth.csrf_matches(request.session.get("csrf"), form.get(CSRF_FIELD)):
            raise Refused(403, "refused: the form's CSRF token is missing or wrong (reload the "
                               "page and try again)")
        return form

    # --- rendering -----------------------------------------------------------------------
    def render(self, request: Request, template: str, status: int = 200,
               who: Identity | None = None, **values: Any) -> HTMLResponse:
        body = self.templates.get_template(template).render(
            who=who if who is not None else self.identity(request),
            csrf=self.csrf_token(request), path=request.url.path, **values)
        return HTMLResponse(body, status_code=status)

    def refusal(self, request: Request, status: int, message: str) -> HTMLResponse:
        return self.render(request, "refused.html", status, message=message)

    # --- signing in ----------------------------------------------------------------------
    @answered
    async def signin_form(self, request: Request) -> Response:
        if self.identity(request) is not None:
            return RedirectResponse("/search", status_code=303)
        return self.render(request, "signin.html", next=_local(request.query_params.get("next")),
                           tokens=self.settings.web_operator_token is not None
                           or self.settings.web_reader_token is not None)

    @answered
    async def signin(self, request: Request) -> Response:
        form = await self.check_csrf(request)
        peer = request.client.host if request.client else "?"
        if self.throttle.blocked(peer):  # not audited: its refusals are, up to the limit
            return self.render(request, "signin.html", 429, next=_local(form.get("next")),
                               tokens=True, error=f"sign-in refused: too many refused sign-ins "
                               f"from {peer}; wait a minute")
        token = form.get("token")
        who = auth.by_token(token if isinstance(token, str) else "", self.settings)
        if who is None:
            self.throttle.refused(peer)
            await run_in_threadpool(self.store.record, Action(
                Identity(f"anonymous ({peer})", Role.READER, "token"), "sign-in refused", "-"))
            return self.render(request, "signin.html", 401, next=_local(form.get("next")),
                               tokens=True, error="sign-in refused: that token is not valid")
        # Audited first: a sign-in the audit cannot record does not happen.
        await run_in_threadpool(self.store.record, Action(who, "sign in", peer))
        request.session.clear()  # a fresh session: nothing from before the sign-in carries over
        sid = secrets.token_urlsafe(16)
        self.sessions[sid] = time.monotonic()
        request.session.update({"who": who.who, "role": who.role.value, "sid": sid,
                                "csrf": auth.new_csrf_token()})
        return RedirectResponse(_local(form.get("next")) or "/search", status_code=303)

    @answered
    async def signout(self, request: Request) -> Response:
        await self.check_csrf(request)
        self.sessions.pop(str(request.session.get("sid")), None)
        request.session.clear()
        return RedirectResponse("/signin", status_code=303)

    # --- reading -------------------------------------------------------------------------
    @page()
    async def search(self, request: Request, who: Identity) -> Response:
        wanted = forms.search_filter(request.query_params)
        rows = await run_in_threadpool(self.store.search, wanted, forms.PAGE_ROWS + 1)
        more = len(rows) > forms.PAGE_ROWS
        rows = rows[:forms.PAGE_ROWS]
        next_page = None
        if more:
            last = rows[-1]
            next_page = "/search?" + urllib.parse.urlencode(
                {**wanted.as_params(), "after": forms.cursor(last["keyset_at"], last["id"])})
        return self.render(request, "search.html", who=who, rows=rows, wanted=wanted,
                           states=forms.STATES, next_page=next_page,
                           first_page="/search?" + urllib.parse.urlencode(wanted.as_params())
                           if wanted.after else None)

    @page()
    async def email(self, request: Request, who: Identity) -> Response:
        row_id = int(request.path_params["row_id"])
        found = (await run_in_threadpool(self.store.email, row_id)
                 if row_id <= forms.ROW_ID_MAX else None)
        if found is None:
            raise Refused(404, f"no outbox row {row_id}")
        events = timeline.events(found.row, found.ledger, found.suppression,
                                 self.settings.retry_delays_s)
        return self.render(request, "email.html", who=who, row=found.row, events=events,
                           trace=timeline.trace_link(found.row.get("traceparent"),
                                                     self.settings.web_trace_url),
                           redrivable=found.row["status"] in ("failed", "dead"))

    @page()
    async def report(self, request: Request, who: Identity) -> Response:
        key = forms.text_field(request.query_params, "key", forms.KEY_MAX_CHARS, "message key")
        # The page shows the first failures (a run of a million would be a page of 100 MB); the
        # CSV has every one.
        run = (await run_in_threadpool(self.store.report_run, key, REPORT_FAILURES_SHOWN)
               if key else None)
        return self.render(request, "report.html", who=who, key=key, run=run,
                           failed=sum(n for s, n in run.counts if s in timeline.FINAL_BAD)
                           if run else 0,
                           csv_link="/report.csv?" + urllib.parse.urlencode({"key": key})
                           if key else None,
                           total=sum(n for _, n in run.counts) if run else 0)

    @page()
    async def report_csv(self, request: Request, who: Identity) -> Response:
        key = forms.required_key(request.query_params)
        batches = self.store.failure_batches(key)
        # The first batch runs the query: a database that does not answer is still a 503 page,
        # not a download cut short.
        first = await run_in_threadpool(next, batches, None)
        name = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in key)[:80]
        return StreamingResponse(_csv_pieces(first, batches),
                                 media_type="text/csv; charset=utf-8",
                                 headers={"content-disposition":
                                          f'attachment; filename="failures-{name}.csv"'})

    @page()
    async def suppression(self, request: Request, who: Identity) -> Response:
        wanted = forms.text_field(request.query_params, "q", 320, "search")
        # One page of the list, searched by the database: it may hold a million addresses.
        entries = await run_in_threadpool(self.store.suppressed, wanted,
                                          SUPPRESSION_SHOWN_MAX + 1)
        return self.render(request, "suppression.html", who=who, q=wanted or "",
                           entries=entries[:SUPPRESSION_SHOWN_MAX],
                           more=len(entries) > SUPPRESSION_SHOWN_MAX,
                           default_expiry=_days(self.settings.suppression_expiry_s))

    @page()
    async def dead_letters(self, request: Request, who: Identity) -> Response:
        before = forms.dlq_cursor(request.query_params.get("before"))
        found = await run_in_threadpool(self.store.dead_letter_page, before, DLQ_PAGE_LETTERS)
        return self.render(request, "dlq.html", who=who, letters=found.letters,
                           first=before is not None, next_page=None if found.before is None
                           else "/dlq?" + urllib.parse.urlencode(
                               {"before": forms.dlq_cursor_text(found.before)}))

    @page()
    async def dead_letter(self, request: Request, who: Identity) -> Response:
        partition, offset = forms.letter_at(request.query_params.get("at"))
        found = await run_in_threadpool(self.store.dead_letter_at, partition, offset)
        if found is None:
            raise Refused(404, f"no dead letter at partition {partition}, offset {offset}")
        return self.render(request, "letter.html", who=who, found=found,
                           at=f"{partition}@{offset}")

    @page()
    async def confirm_redrive(self, request: Request, who: Identity) -> Response:
        kind, key, recipient = _redrive_fields(request.query_params)
        plan = await run_in_threadpool(self._plan, kind, key, recipient)
        return self.render(request, "redrive.html", who=who, kind=kind, key=key,
                           recipient=recipient or "", plan=plan)

    def _plan(self, kind: str, key: str, recipient: str | None) -> Any:
        if kind == "replay":  # the key is the dead letter's place, partition@offset
            return self.store.plan_replay(*forms.letter_at(key))
        return self.store.plan_requeue(key, recipient)

    @page()
    async def glance(self, request: Request, who: Identity) -> Response:
        return self.render(request, "glance.html", who=who)

    @page(signed_in=False)
    async def glance_json(self, request: Request, who: Identity) -> Response:
        return JSONResponse(await run_in_threadpool(self.store.glance))

    @page()
    async def audit(self, request: Request, who: Identity) -> Response:
        before_id = forms.audit_cursor(request.query_params.get("before"))
        entries = await run_in_threadpool(self.store.audit, before_id, AUDIT_PAGE_ENTRIES + 1)
        more = len(entries) > AUDIT_PAGE_ENTRIES
        entries = entries[:AUDIT_PAGE_ENTRIES]
        return self.render(request, "audit.html", who=who, entries=entries,
                           next_page=f"/audit?before={entries[-1].id}" if more else None)

    # --- acting (operator) -----------------------------------------------------------------
    @page(Role.OPERATOR)
    async def suppression_add(self, request: Request, who: Identity) -> Response:
        wanted = forms.suppression_form(await request.form())
        expiry_s = wanted.expiry_s or self.settings.suppression_expiry_s
        entry = await run_in_threadpool(
            self.store.suppress, wanted.address, wanted.reason, expiry_s,
            Action(who, "suppression add", wanted.address,
                   detail=f"for {_days(expiry_s)}: {wanted.reason or ''}".rstrip(": ")))
        return self._done(request, who, f"suppressed {entry.address} until "
                                        f"{_utc(entry.expires_at)}", "/suppression")

    @page(Role.OPERATOR)
    async def suppression_remove(self, request: Request, who: Identity) -> Response:
        address = forms.text_field(await request.form(), "address", 320, "address")
        if address is None:
            raise forms.FormError("address: required")
        held = await run_in_threadpool(self.store.unsuppress, address,
                                       Action(who, "suppression remove", address))
        return self._done(request, who, f"removed {held} from the suppression list",
                          "/suppression")

    @page(Role.OPERATOR)
    async def redrive(self, request: Request, who: Identity) -> Response:
        form = await request.form()
        kind, key, recipient = _redrive_fields(form)
        if form.get("confirm") != "yes":
            raise forms.FormError("confirm: the redrive was not confirmed")
        plan = await run_in_threadpool(self._plan, kind, key, recipient)
        if plan.unknown is not None:
            raise Refused(404, f"unknown key {plan.unknown!r}: {dict(plan.skipped)[plan.unknown]}")
        target = (f"dead letter {key}" if kind == "replay"
                  else key + (f" for {recipient}" if recipient else ""))
        moved = await run_in_threadpool(self.store.redrive, plan, Action(
            who, kind, target, detail=", ".join(row.idempotency_key for row in plan.rows)))
        past = {"replay": "replayed", "requeue": "requeued"}[kind]
        return self._done(request, who, f"{past} {len(moved)} row(s): back on the relay's queue "
                                        "with a fresh retry budget" if moved
                          else f"{past} nothing", "/search?" + urllib.parse.urlencode(
                              {"key": key}) if kind == "requeue" else "/dlq")

    def _done(self, request: Request, who: Identity, message: str, back: str) -> Response:
        return self.render(request, "done.html", who=who, message=message, back=back)

    # --- the application -------------------------------------------------------------------
    def routes(self) -> list[Route | Mount]:
        return [
            Route("/", lambda request: RedirectResponse("/search", status_code=303)),
            Route("/signin", self.signin_form, methods=["GET"]),
            Route("/signin", self.signin, methods=["POST"]),
            Route("/signout", self.signout, methods=["POST"]),
            Route("/search", self.search, methods=["GET"]),
            Route("/email/{row_id:int}", self.email, methods=["GET"]),
            Route("/report", self.report, methods=["GET"]),
            Route("/report.csv", self.report_csv, methods=["GET"]),
            Route("/suppression", self.suppression, methods=["GET"]),
            Route("/suppression/add", self.suppression_add, methods=["POST"]),
            Route("/suppression/remove", self.suppression_remove, methods=["POST"]),
            Route("/dlq", self.dead_letters, methods=["GET"]),
            Route("/dlq/letter", self.dead_letter, methods=["GET"]),
            Route("/redrive", self.confirm_redrive, methods=["GET"]),
            Route("/redrive", self.redrive, methods=["POST"]),
            Route("/glance", self.glance, methods=["GET"]),
            Route("/glance.json", self.glance_json, methods=["GET"]),
            Route("/audit", self.audit, methods=["GET"]),
            Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
        ]


def make_app(settings: Settings, store: ConsoleStore, session_secret: str | None = None) -> Starlette:
    """The console as an ASGI application. Sessions are signed with ``session_secret``, by
    default one made for this process: a restart signs everyone out."""
    console = Console(settings, store)
    return Starlette(routes=console.routes(), middleware=[
        Middleware(SecurityHeaders),
        Middleware(TrustedHostMiddleware, allowed_hosts=list(settings.web_hosts or ["*"]),
                   www_redirect=False),
        Middleware(LimitedBody),
        Middleware(SessionMiddleware, secret_key=session_secret or secrets.token_urlsafe(32),
                   session_cookie=SESSION_COOKIE, max_age=SESSION_MAX_AGE_S, same_site="strict",
                   https_only=settings.web_secure_cookie),
    ])


def _redrive_fields(source: Any) -> tuple[str, str, str | None]:
    kind = forms.text_field(source, "kind", 10, "kind")
    if kind not in ("replay", "requeue"):
        raise forms.FormError("kind: replay or requeue")
    recipient = forms.text_field(source, "recipient", 320, "recipient")
    return kind, forms.required_key(source), recipient if kind == "requeue" else None


def _csv_pieces(first: list[Failure] | None, rest: Iterator[list[Failure]]) -> Iterator[str]:
    """The CSV render_csv writes, a batch of failures a piece (the header row first)."""
    yield csv_lines((), header=True)
    if first is not None:
        yield csv_lines(first)
        yield from (csv_lines(batch) for batch in rest)


def _local(target: object) -> str | None:
    """A sign-in's next page, only when it is a path of this site (no open redirect)."""
    if isinstance(target, str) and target.startswith("/") and not target.startswith("//") \
            and "\\" not in target and target.isprintable():
        return target
    return None


def _days(seconds: float) -> str:
    return f"{seconds / 86400:g}d" if seconds >= 86400 else f"{seconds / 3600:g}h"


def _utc(moment: Any) -> str:
    import datetime as dt

    if isinstance(moment, dt.datetime):
        return moment.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return "-"

