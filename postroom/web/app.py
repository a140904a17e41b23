"""The console's web application: Starlette routes over a ConsoleStore, pages rendered by Jinja2
with every value escaped, a signed session cookie naming a session the store keeps, a CSRF token
on every POST, a strict Content-Security-Policy on every response, and an audit entry for every
action."""

from __future__ import annotations

import functools
import logging
import secrets
import urllib.parse
from collections.abc import Awaitable, Callable
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
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from postroom.errors import (
    InvalidContentError,
    KafkaClientError,
    PostroomError,
    first_line,
    printable,
)
from postroom.relay.suppression import NotSuppressedError
from postroom.settings import Settings
from postroom.web import auth, forms, pages
from postroom.web.auth import CSRF_FIELD, Identity, Role
from postroom.web.middleware import LimitedBody, Refused, SecurityHeaders
from postroom.web.pages import as_days, as_utc, redrive_fields, redrive_plan
from postroom.web.store import Action, ConsoleStore, SessionLimits

log = logging.getLogger(__name__)

HERE = Path(__file__).parent
SESSION_COOKIE = "postroom_console"
SESSION_MAX_AGE_S = 8 * 3600  # a session not used for this long is signed out
SESSION_LIFETIME_S = 12 * 3600  # and any session this long after its sign-in: a working day
SESSION_LIMITS = SessionLimits(SESSION_MAX_AGE_S, SESSION_LIFETIME_S)
SESSION_ID_BYTES = 16
_UNKNOWN = object()  # request.state's identity before it is asked
# A database that does not answer: the driver's errors, and the pool's wait for a connection
# that every request holds while the database is slow (SQLAlchemy's own TimeoutError).
DATABASE_DOWN = (sa_errors.DBAPIError, sa_errors.TimeoutError)
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
            return await self.refusal(request, exc.status, str(exc))
        except HTTPException as exc:  # Starlette's own refusal of a form (too many fields)
            return await self.refusal(request, exc.status_code,
                                      printable((str(exc.detail).splitlines() or [""])[0]))
        except forms.FormError as exc:
            return await self.refusal(request, 400, str(exc))
        except (InvalidContentError, NotSuppressedError) as exc:
            return await self.refusal(request, 400, printable(str(exc)))
        except KafkaClientError as exc:
            return await self.refusal(request, 502, printable(str(exc)))
        except PostroomError as exc:
            return await self.refusal(request, 500, printable(str(exc)))
        except DATABASE_DOWN as exc:
            log.warning("the database refused a console request: %s", first_line(exc))
            return await self.refusal(request, 503, "the database does not answer: "
                                      f"{printable(first_line(exc))}")
        except Exception:
            log.exception("console request %s %s failed", request.method, request.url.path)
            return await self.refusal(request, 500, "internal error (postroom web logged it)")

    return route


def page(needed: Role = Role.READER, *, signed_in: bool = True,
         active: bool = True) -> Callable[[Handler], Any]:
    """A route handler that needs a signed-in identity with ``needed``; a POST also needs the
    session's CSRF token in its form, checked before anything else is read or done, and one
    refused (a field, a row that is not there) is audited with why. A request to a route not
    ``active`` (a page's background refresh) does not keep its session from going idle."""

    def wrap(handler: Handler) -> Any:
        @functools.wraps(handler)
        async def admitted(self: Console, request: Request) -> Response:
            who = await self.admit(request, needed, redirect=signed_in, active=active)
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
        self.templates.filters["utc"] = as_utc
        self.throttle = auth.SignInThrottle()

    # --- who is asking -------------------------------------------------------------------
    async def identity(self, request: Request, *, active: bool = True) -> Identity | None:
        """The trusted proxy's header first (it signs every request), then the session: one the
        store knows, signed in and not signed out, within SESSION_LIMITS (used within 8 hours,
        signed in within 12), signed in with the token its role has now (a cookie is signed, so
        without the store a copy of it would outlive a sign-out). Asked once a request; an
        ``active`` one counts as the session's use."""
        known = getattr(request.state, "identity", _UNKNOWN)
        if known is None or isinstance(known, Identity):
            return known
        peer = request.client.host if request.client else None
        who = auth.by_proxy(peer, request.headers.getlist(auth.PROXY_EMAIL_HEADER), self.settings)
        sid = request.session.get("sid")
        if who is None and isinstance(sid, str) and sid:
            found = await run_in_threadpool(self.store.session, sid, SESSION_LIMITS,
                                            active=active)
            if found is not None and auth.session_holds(sid, found.who.role, found.token_mac,
                                                        self.settings):
                who = found.who
        request.state.identity = who
        return who

    async def admit(self, request: Request, needed: Role, *, redirect: bool,
                    active: bool = True) -> Identity | Response:
        """Who may go on (Refused otherwise): a POST's CSRF token first, then the identity and
        its role; a GET page without one is sent to sign in."""
        if request.method == "POST":
            try:
                await self.check_csrf(request)
            except Refused as exc:
                forger = await self.identity(request, active=False) if exc.status == 403 else None
                if forger is not None:
                    await self.audit_refusal(request, forger, "CSRF token missing or wrong")
                raise
        who = await self.identity(request, active=active)
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
        """``template`` with ``values``; the header names ``who``, or whoever the request was
        found to be."""
        if who is None:
            who = getattr(request.state, "identity", None)
        body = self.templates.get_template(template).render(
            who=who, csrf=self.csrf_token(request), path=request.url.path, **values)
        return HTMLResponse(body, status_code=status)

    async def refusal(self, request: Request, status: int, message: str) -> HTMLResponse:
        """The page saying why, with the header of whoever asked when that can be known (not
        when the database that keeps the sessions does not answer)."""
        try:
            await self.identity(request, active=False)
        except (*DATABASE_DOWN, PostroomError):
            request.state.identity = None
        return self.render(request, "refused.html", status, message=message)

    # --- signing in ----------------------------------------------------------------------
    @answered
    async def signin_form(self, request: Request) -> Response:
        if await self.identity(request) is not None:
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
        given = form.get("token")
        token = given if isinstance(given, str) else ""
        who = auth.by_token(token, self.settings)
        if who is None:
            self.throttle.refused(peer)
            await run_in_threadpool(self.store.record, Action(
                Identity(f"anonymous ({peer})", Role.READER, "token"), "sign-in refused", "-"))
            return self.render(request, "signin.html", 401, next=_local(form.get("next")),
                               tokens=True, error="sign-in refused: that token is not valid")
        before = request.session.get("sid")
        if isinstance(before, str) and before:  # signed in again: the session before ends
            await run_in_threadpool(self.store.close_session, before, peer)
        # Audited first: a sign-in the audit cannot record does not happen.
        await run_in_threadpool(self.store.record, Action(who, "sign in", peer))
        sid = secrets.token_urlsafe(SESSION_ID_BYTES)
        await run_in_threadpool(self.store.open_session, sid, who,
                                auth.session_mac(sid, token), SESSION_LIMITS)
        request.session.clear()  # a fresh session: nothing from before the sign-in carries over
        request.session.update({"sid": sid, "csrf": auth.new_csrf_token()})
        return RedirectResponse(_local(form.get("next")) or "/search", status_code=303)

    @answered
    async def signout(self, request: Request) -> Response:
        await self.check_csrf(request)
        sid = request.session.get("sid")
        if isinstance(sid, str) and sid:  # the store audits the sign-out of a session it had
            await run_in_threadpool(self.store.close_session, sid,
                                    request.client.host if request.client else "?")
        request.session.clear()
        return RedirectResponse("/signin", status_code=303)

    # --- reading (postroom/web/pages.py) ----------------------------------------------------
    search = page()(pages.search)
    email = page()(pages.email)
    report = page()(pages.report)
    report_csv = page()(pages.report_csv)
    suppression = page()(pages.suppression)
    dead_letters = page()(pages.dead_letters)
    dead_letter = page()(pages.dead_letter)
    confirm_redrive = page()(pages.confirm_redrive)
    glance = page()(pages.glance)
    # The glance page's script asks every few seconds: an open tab is not someone using it.
    glance_json = page(signed_in=False, active=False)(pages.glance_json)
    audit = page()(pages.audit)

    # --- acting (operator) -----------------------------------------------------------------
    @page(Role.OPERATOR)
    async def suppression_add(self, request: Request, who: Identity) -> Response:
        wanted = forms.suppression_form(await request.form())
        expiry_s = wanted.expiry_s or self.settings.suppression_expiry_s
        entry = await run_in_threadpool(
            self.store.suppress, wanted.address, wanted.reason, expiry_s,
            Action(who, "suppression add", wanted.address,
                   detail=f"for {as_days(expiry_s)}: {wanted.reason or ''}".rstrip(": ")))
        return self._done(request, who, f"suppressed {entry.address} until "
                                        f"{as_utc(entry.expires_at)}", "/suppression")

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
        kind, key, recipient = redrive_fields(form)
        if form.get("confirm") != "yes":
            raise forms.FormError("confirm: the redrive was not confirmed")
        plan = await run_in_threadpool(redrive_plan, self.store, kind, key, recipient)
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


def make_app(settings: Settings, store: ConsoleStore) -> Starlette:
    """The console as an ASGI application. Session cookies are signed with
    POSTROOM_WEB_SESSION_KEY(_FILE), or without it a key made here: a restart then signs everyone
    out, and no other replica takes this one's cookies (said once, in the log)."""
    console = Console(settings, store)
    if settings.web_session_key is not None:
        session_key = settings.web_session_key.reveal()
    else:
        session_key = secrets.token_urlsafe(32)
        log.info("POSTROOM_WEB_SESSION_KEY_FILE is not set: sessions are signed with a key made "
                 "at this start, so a restart signs everyone out and another replica refuses "
                 "this one's sessions")
    return Starlette(routes=console.routes(), middleware=[
        Middleware(SecurityHeaders),
        Middleware(TrustedHostMiddleware, allowed_hosts=list(settings.web_hosts or ["*"]),
                   www_redirect=False),
        Middleware(LimitedBody),
        Middleware(SessionMiddleware, secret_key=session_key,
                   session_cookie=SESSION_COOKIE, max_age=SESSION_MAX_AGE_S, same_site="strict",
                   https_only=settings.web_secure_cookie),
    ])


def _local(target: object) -> str | None:
    """A sign-in's next page, only when it is a path of this site (no open redirect)."""
    if isinstance(target, str) and target.startswith("/") and not target.startswith("//") \
            and "\\" not in target and target.isprintable():
        return target
    return None
