"""The console's ASGI middleware: the security headers on every response and the bound on a
request's body; Refused, the one-line refusal a handler (or the bound) raises."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

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
