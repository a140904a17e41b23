"""Settings of a Django 5.2 project with no app of its own: its one database is the local stack's
PostgreSQL (POSTROOM_DATABASE_URL, read as postroom reads it), through Django's psycopg 3
backend. tests/integration/relay/test_connections.py enqueues on its connection."""

from __future__ import annotations

from sqlalchemy.engine import make_url

from postroom.settings import Settings

_url = make_url(Settings.from_env().database_url or "postgresql://localhost/postroom")

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _url.database or "",
        "USER": _url.username or "",
        "PASSWORD": _url.password or "",
        "HOST": _url.host or "",
        "PORT": str(_url.port or ""),
    },
}
INSTALLED_APPS: list[str] = []
USE_TZ = True
TIME_ZONE = "UTC"
SECRET_KEY = "tests only, never a deployment's"  # noqa: S105
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
