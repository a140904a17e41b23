"""Runs the console: checks its sign-in settings and the database, then serves the app with
uvicorn on POSTROOM_WEB_LISTEN until SIGTERM or SIGINT (uvicorn's own clean stop)."""

from __future__ import annotations

import logging

from postroom import logs
from postroom.settings import Settings
from postroom.web import auth

log = logging.getLogger(__name__)


def console_address(settings: Settings) -> str:
    """The console's URL as POSTROOM_WEB_LISTEN gives it."""
    host, port = settings.web_listen
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/"


def serve(settings: Settings) -> None:
    """Serve until stopped. ConfigError (before anything waits) without a way to sign in."""
    auth.check_configured(settings)
    import uvicorn

    from postroom.relay.db import check_schema_at_start, make_engine
    from postroom.web.app import make_app
    from postroom.web.store import DatabaseStore

    logs.set_level(settings.log_level)
    engine = make_engine(settings, application_name="postroom-web")
    store = DatabaseStore(settings, engine)
    try:
        check_schema_at_start(engine)
        host, port = settings.web_listen
        config = uvicorn.Config(
            make_app(settings, store), host=host, port=port,
            # The peer address is the connection's: a trusted proxy is recognised by it, so no
            # X-Forwarded-For may rewrite it.
            proxy_headers=False, server_header=False, date_header=False, log_config=None,
            access_log=False, lifespan="off")
        log.info("console at %s (sign-in: %s)", console_address(settings), ", ".join(
            way for way, on in (("operator token", settings.web_operator_token),
                                ("reader token", settings.web_reader_token),
                                ("trusted proxy", settings.web_trusted_proxies)) if on))
        uvicorn.Server(config).run()
    finally:
        store.close()
        engine.dispose()
