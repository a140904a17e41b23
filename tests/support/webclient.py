"""The console's app under Starlette's TestClient, signed in as the tests' tokens: what the
console's unit tests share."""

from __future__ import annotations

import re
from typing import Any

from starlette.testclient import TestClient

from postroom.settings import Settings
from postroom.web.app import make_app
from support.console import MemoryStore

OPERATOR_TOKEN = "operator-token-0123456789"  # noqa: S105 - the test's own
READER_TOKEN = "reader-token-0123456789ab"  # noqa: S105 - the test's own
PROXY = "10.0.0.5"


def settings(**env: str) -> Settings:
    """The console's settings with both tokens, and ``env`` over them."""
    return Settings.from_env({"POSTROOM_WEB_OPERATOR_TOKEN": OPERATOR_TOKEN,
                              "POSTROOM_WEB_READER_TOKEN": READER_TOKEN, **env})


def client(store: MemoryStore, peer: str = "127.0.0.1", **env: str) -> TestClient:
    """A client of a console over ``store``, seen as coming from ``peer``."""
    return TestClient(make_app(settings(**env), store), client=(peer, 50000),
                      follow_redirects=False)


def csrf_of(page: str) -> str:
    """The CSRF token a page's form carries."""
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found, "the page carries no CSRF field"
    return found.group(1)


def sign_in(web: TestClient, token: str) -> Any:
    """Sign ``web`` in with ``token`` through the sign-in form; the response."""
    form = web.get("/signin")
    return web.post("/signin", data={"csrf": csrf_of(form.text), "token": token, "next": ""})
