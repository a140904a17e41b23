"""Connections to the outbox database and its schema migrations (Alembic)."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import re
import threading
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg
import sqlalchemy as sa
from psycopg.conninfo import make_conninfo

from postroom.errors import first_line
from postroom.relay.errors import SchemaNotReadyError, UnsupportedDatabaseError
from postroom.settings import Settings

# Alembic is imported where a schema is migrated or its history read: a command or a role that
# only checks that the schema is at the newest revision (check_schema) does so without it.
if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.script import Script, ScriptDirectory

log = logging.getLogger(__name__)

_MIGRATIONS = resources.files("postroom.relay") / "migrations"

# The server's side of every session postroom opens: an idle peer that stops answering (its host
# crashed, the network cut) is noticed after 10 s without traffic and 3 unanswered probes 5 s
# apart, and its session ends, with the advisory locks that keep a relay's claims and a sender's
# ledger claims its own. Linux's defaults wait about two hours (7,200 s, then 9 probes 75 s
# apart), longer than any claim lasts. (Not tcp_user_timeout: it also bounds zero-window probes,
# so it could end a live peer's connection whose window stays shut that long, as the relay's
# LISTEN connection's may while it drains a backlog and reads no notification.) First in
# ``options``, so the URL's own may change them. A server that cannot set one logs so and goes
# on; a Unix-domain socket ignores them.
SERVER_KEEPALIVE_OPTIONS = ("-c tcp_keepalives_idle=10 -c tcp_keepalives_interval=5 "
                            "-c tcp_keepalives_count=3")


def with_options(*parts: str | tuple[str, ...] | None) -> str:
    """libpq's ``options``, in the order given; a part may be a URL's repeated ``options``."""
    flat = [o for part in parts
            for o in ((part,) if isinstance(part, str) else tuple(part or ()))]
    return " ".join(o for o in flat if o)


def _libpq_keywords() -> frozenset[str]:
    return frozenset(option.keyword.decode() for option in psycopg.pq.Conninfo.get_defaults())


def make_engine(settings: Settings, application_name: str = "postroom",
                **kwargs: object) -> sa.Engine:
    """An engine on POSTROOM_DATABASE_URL whose connections use POSTROOM_DATABASE_SCHEMA.

    ``application_name`` names its connections in pg_stat_activity (LISTEN included).
    """
    url = sa.make_url(settings.require("database_url"))
    if "application_name" not in url.query:
        url = url.update_query_dict({"application_name": application_name})
    schema = settings.database_schema
    connect_args: dict[str, object] = {"connect_timeout": 10, "options": with_options(
        SERVER_KEEPALIVE_OPTIONS, url.query.get("options"),
        f"-c search_path={schema}" if schema else "")}
    # hide_parameters: an error must not carry message bodies and addresses into logs.
    return sa.create_engine(url, pool_pre_ping=True, hide_parameters=True,
                            connect_args=connect_args, **kwargs)


def libpq_conninfo(engine: sa.Engine) -> str:
    """The engine's connection parameters as a libpq conninfo (for LISTEN and the async ledger),
    SERVER_KEEPALIVE_OPTIONS before the URL's ``options``. Built from what the engine's dialect
    gives its driver, not from the URL written out again: there a space becomes "+", which
    libpq keeps, and hosts given in the query are not joined."""
    _, params = engine.dialect.create_connect_args(engine.url)
    keywords = _libpq_keywords()
    given = {key: value for key, value in params.items()
             if key in keywords and value is not None}
    given["options"] = with_options(SERVER_KEEPALIVE_OPTIONS, given.get("options"))
    return make_conninfo("", **given)


def _alembic_config(connection: sa.Connection | None = None) -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(_MIGRATIONS))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def migration_scripts() -> ScriptDirectory:
    """This release's migrations, as Alembic reads them."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(_alembic_config())


# The relay's claim has the database compute milliseconds since the epoch; extract() returns an
# exact numeric since PostgreSQL 14 (a double before).
MIN_SERVER_MAJOR = 14


def check_server_version(version: tuple[int | str, ...] | None) -> None:
    """Raise UnsupportedDatabaseError for a server older than MIN_SERVER_MAJOR (``version`` as
    the dialect reports it: major first; unknown passes)."""
    major = version[0] if version else None
    if isinstance(major, int) and major < MIN_SERVER_MAJOR:
        raise UnsupportedDatabaseError(
            f"PostgreSQL {'.'.join(map(str, version or ()))} is too old: postroom needs "
            f"{MIN_SERVER_MAJOR} or newer")


# Migrations of one schema take turns: several `postroom db upgrade` at once (pods starting
# together) would each create the same tables, and all but one fail (UniqueViolation; CREATE
# SCHEMA IF NOT EXISTS races the same way). The lock is the transaction's, and is let go at its
# end; the key is this class and the connection's search path (POSTROOM_DATABASE_SCHEMA's, as
# make_engine sets it), which exists before the schema does.
MIGRATION_LOCK_CLASS = 0x706F7374  # "post"
MIGRATION_LOCK = sa.text(
    "SELECT pg_advisory_xact_lock(:lock_class, hashtext(current_setting('search_path')))")


TRY_MIGRATION_LOCK = sa.text(
    "SELECT pg_try_advisory_xact_lock(:lock_class, hashtext(current_setting('search_path')))")
LOCK_WAIT_SAID_EVERY_S = 10.0


def lock_migrations(conn: sa.Connection, on_wait: Callable[[float], None] | None = None,
                    *, clock: Callable[[], float] = time.monotonic) -> None:
    """Wait until no other migration of the connection's schema runs, and keep others waiting
    until the caller's transaction ends. ``on_wait(seconds)`` is told, when the lock is held
    elsewhere, at once and every LOCK_WAIT_SAID_EVERY_S while this waits in the lock's queue."""
    params = {"lock_class": MIGRATION_LOCK_CLASS}
    if on_wait is None or conn.execute(TRY_MIGRATION_LOCK, params).scalar_one():
        if on_wait is None:
            conn.execute(MIGRATION_LOCK, params)
        return
    started = clock()
    acquired = threading.Event()

    def say() -> None:
        while True:
            on_wait(clock() - started)
            if acquired.wait(LOCK_WAIT_SAID_EVERY_S):
                return

    teller = threading.Thread(target=say, name="migration-lock-wait", daemon=True)
    teller.start()
    try:
        conn.execute(MIGRATION_LOCK, params)  # in the lock's queue, first come first served
    finally:
        acquired.set()
        teller.join()


@dataclasses.dataclass(frozen=True)
class Migration:
    """What `db upgrade` did (or, dry, would do): the revision before (None: no schema yet),
    the one after, the migrations run in order, and in a dry run the SQL they ran."""

    before: str | None
    after: str
    steps: tuple[str, ...]  # "0009 suppression", oldest first
    statements: tuple[str, ...] = ()


def revision_names(scripts: ScriptDirectory, since: str | None,
                   until: str = "head") -> tuple[str, ...]:
    """The migrations after ``since`` (None: all) up to ``until``, oldest first, each as
    ``<revision> <its file's name>``."""
    walked = list(scripts.iterate_revisions(until, since or "base"))
    return tuple(_named(script) for script in reversed(walked) if script is not None)


def _named(script: Script) -> str:
    name = Path(script.path).stem.partition("_")[2].replace("_", " ")
    return f"{script.revision} {name}".strip()


def migrate(engine: sa.Engine, schema: str | None = None, *, dry_run: bool = False,
            on_wait: Callable[[float], None] | None = None) -> Migration:
    """Create or migrate the outbox schema to the newest revision, and say what was done; safe
    to run again, and at the same time from several processes (they take turns; the later ones
    find it done). ``dry_run``: the same in a transaction rolled back, keeping the SQL that ran
    (PostgreSQL's DDL is transactional: nothing is left of it)."""
    from alembic import command
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    statements: list[str] = []
    with engine.connect() as conn, conn.begin() as transaction:
        check_server_version(conn.dialect.server_version_info)
        lock_migrations(conn, on_wait)
        if dry_run:
            # What changes the schema: alembic's and the migrations' lookups (SELECT) are not.
            sa.event.listen(conn, "before_cursor_execute", lambda _c, _cur, statement, *_: (
                None if statement.lstrip().upper().startswith("SELECT")
                else statements.append(statement)))
        if schema:
            conn.execute(sa.text(f'CREATE SCHEMA IF NOT EXISTS "{schema}"'))
        config = _alembic_config(conn)
        scripts = ScriptDirectory.from_config(config)
        before = MigrationContext.configure(conn).get_current_revision()
        _refuse_unknown_revision(before, scripts)
        steps = revision_names(scripts, before)
        command.upgrade(config, "head")
        after = MigrationContext.configure(conn).get_current_revision() or ""
        if dry_run:
            transaction.rollback()
    if not dry_run:
        log.info("outbox schema at revision %s", after)
    return Migration(before, after, steps if before != after else (), tuple(statements))


def upgrade(engine: sa.Engine, schema: str | None = None) -> str:
    """:func:`migrate`, returning the revision the schema is at."""
    return migrate(engine, schema).after


def history(engine: sa.Engine) -> tuple[str | None, tuple[str, ...]]:
    """The revision the outbox schema is at (None: not created) and every migration this
    release has, oldest first (see :func:`revision_names`)."""
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        current = MigrationContext.configure(conn).get_current_revision()
    scripts = migration_scripts()
    _refuse_unknown_revision(current, scripts)
    return current, revision_names(scripts, None)


def downgrade(engine: sa.Engine, revision: str) -> str:
    """Migrate the outbox schema back to ``revision``."""
    from alembic import command
    from alembic.runtime.migration import MigrationContext

    with engine.begin() as conn:
        lock_migrations(conn)
        command.downgrade(_alembic_config(conn), revision)
        current = MigrationContext.configure(conn).get_current_revision()
    log.info("outbox schema at revision %s", current)
    return current or ""


# A migration's file is named after its revision (0017_console_sessions.py holds revision
# "0017"); tests/unit/relay/test_revisions.py holds this against Alembic's own reading.
_MIGRATION_FILE = re.compile(r"(\d{4})_\w+\.py")
# Whether the session's schema (current_schema(), where Alembic looks) has a version table; a
# schema that does not exist has none.
_HAS_VERSION_TABLE = sa.text(
    "SELECT to_regclass(quote_ident(current_schema()) || '.alembic_version') IS NOT NULL")


@functools.cache
def head_revision() -> str:
    """The newest revision of this release's migrations, read from their file names."""
    return max(match[1] for entry in (_MIGRATIONS / "versions").iterdir()
               if (match := _MIGRATION_FILE.fullmatch(entry.name)))


def check_schema(engine: sa.Engine) -> None:
    """Raise SchemaNotReadyError unless the database is at the newest revision (and
    UnsupportedDatabaseError when the server is too old). The schema at the newest revision is
    known by one query; only any other answer asks Alembic, for its words."""
    with engine.connect() as conn:
        check_server_version(conn.dialect.server_version_info)
        if conn.execute(_HAS_VERSION_TABLE).scalar() and list(conn.execute(sa.text(
                "SELECT version_num FROM alembic_version")).scalars()) == [head_revision()]:
            return
    _check_schema_with_alembic(engine)


def _check_schema_with_alembic(engine: sa.Engine) -> None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        current = MigrationContext.configure(conn).get_current_revision()
    scripts = migration_scripts()
    head = scripts.get_current_head()
    if current is None:
        raise SchemaNotReadyError("the outbox schema is not migrated: run `postroom db upgrade`")
    _refuse_unknown_revision(current, scripts)
    if current != head:
        raise SchemaNotReadyError(
            f"outbox schema is at revision {current or 'none'}, expected {head}: "
            "run `postroom db upgrade`")


def _refuse_unknown_revision(current: str | None, scripts: ScriptDirectory) -> None:
    """SchemaNotReadyError when the database is at a revision this release has no migration
    of: a newer release migrated it, and neither `db upgrade` nor this release's roles can use
    it (alembic would say only "Can't locate revision")."""
    import alembic.util

    if current is None:
        return
    try:
        scripts.get_revision(current)
    except alembic.util.CommandError:
        raise SchemaNotReadyError(
            f"the outbox schema is at revision {current}, which this release of postroom does "
            f"not know (its newest is {scripts.get_current_head()}): a newer release migrated "
            "it; run that release, or migrate the schema back with that release first") from None


# SQLSTATEs of a session the server ended under a statement: terminated by an administrator
# (pg_terminate_backend), or in a crash of another backend. A role that meets one in its start-up
# check met a restart, not a wrong setting. (A connection refused while the server is down or
# starting up carries no SQLSTATE in psycopg: it stops the role, as a wrong address does.)
SESSION_ENDED_SQLSTATES = frozenset({"57P01", "57P02"})
START_CHECK_PAUSE_S = 1.0
START_CHECK_TRIES = 30


def check_schema_at_start(engine: sa.Engine, *, tries: int = START_CHECK_TRIES,
                          pause_s: float = START_CHECK_PAUSE_S,
                          check: Callable[[sa.Engine], None] = check_schema,
                          sleep: Callable[[float], None] = time.sleep) -> None:
    """:func:`check_schema` for a role's start, asked again (``pause_s`` apart, up to ``tries``
    times in all) while the server ends the session; any other failure raises at once."""
    for attempt in itertools.count(1):
        try:
            check(engine)
        except sa.exc.OperationalError as exc:
            if attempt >= tries or getattr(exc.orig, "sqlstate", None) not in SESSION_ENDED_SQLSTATES:
                raise
            log.warning("database: %s, while checking the schema at start; asking again in %.0fs "
                        "(%d of %d)", first_line(exc), pause_s, attempt, tries)
            sleep(pause_s)
        else:
            return


def check_database(settings: Settings) -> str:
    """What ``postroom check`` says of the database: it answers at the newest revision."""
    engine = make_engine(settings)
    try:
        check_schema(engine)
    finally:
        engine.dispose()
    return "schema at the newest revision"
