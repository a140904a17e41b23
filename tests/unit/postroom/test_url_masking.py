"""Every URL-shaped setting (the database's, the registry's, OTLP endpoints, URLs inside client
settings) shows no credentials wherever postroom prints it: the settings' repr, logs, `check`,
commands' output and errors (issue 46, item 6)."""

from __future__ import annotations

import argparse
import io
import logging
from typing import Any

import pytest

from postroom import tracing
from postroom.cli import admin
from postroom.logs import EscapingFilter
from postroom.schemas import registry as registry_module
from postroom.schemas.registry import Registry, RegistryError
from postroom.settings import Settings, mask_url, mask_urls

TOKEN = "t0k3n-s3cr3t"  # noqa: S105 - a made-up secret the tests look for
P = "POSTROOM_"


@pytest.mark.parametrize(("url", "shown"), [
    (f"postgresql+psycopg://app:{TOKEN}@db:5432/mail", "postgresql+psycopg://app:********@db:5432/mail"),
    # a password holding "@" (SQLAlchemy takes it so): the old mask showed what followed it
    (f"postgresql+psycopg://app:pa@{TOKEN}@db/mail", "postgresql+psycopg://app:********@db/mail"),
    (f"postgresql+psycopg://app:a/{TOKEN}@db/mail", "postgresql+psycopg://app:********@db/mail"),
    ("postgresql+psycopg://app@db/mail", "postgresql+psycopg://app@db/mail"),  # a role name
    (f"https://user:{TOKEN}@collector:4318", "https://user:********@collector:4318"),
    (f"https://{TOKEN}@collector:4318/v1/traces", "https://********@collector:4318/v1/traces"),
    (f"http://registry:8081/apis?api_key={TOKEN}&x=1", "http://registry:8081/apis?api_key=********&x=1"),
    (f"https://c/v1/traces?access_token={TOKEN}", "https://c/v1/traces?access_token=********"),
    (f"postgresql://app@db/mail?sslpassword={TOKEN}", "postgresql://app@db/mail?sslpassword=********"),
    ("http://registry:8081", "http://registry:8081"),
])
def test_mask_url(url: str, shown: str) -> None:
    assert mask_url(url) == shown


def test_mask_urls_masks_every_url_in_a_text() -> None:
    text = (f"export to https://u:{TOKEN}@collector failed; db postgresql://a:{TOKEN}@h/d; "
            "mail a@example.com")
    assert mask_urls(text) == ("export to https://u:********@collector failed; db "
                               "postgresql://a:********@h/d; mail a@example.com")


@pytest.mark.parametrize(("name", "value"), [
    ("SCHEMA_REGISTRY_URL", f"https://{TOKEN}@registry.example.com"),
    ("DATABASE_URL", f"postgresql+psycopg://app:pa@{TOKEN}@db/mail"),
    ("KAFKA_CONFIG", "sasl.mechanism=OAUTHBEARER;sasl.oauthbearer.method=oidc;"
                     f"sasl.oauthbearer.token.endpoint.url=https://client:{TOKEN}@idp/token"),
    ("KAFKA_CONSUMER_CONFIG", f"sasl.oauthbearer.token.endpoint.url=https://{TOKEN}@idp/t"),
    ("SCHEMA_REGISTRY_CONFIG", f"bearer.auth.issuer.endpoint.url=https://c:{TOKEN}@idp/token"),
])
def test_a_url_setting_shows_no_credentials_in_the_settings_repr(name: str, value: str) -> None:
    shown = repr(Settings.from_env({P + name: value}))
    assert TOKEN not in shown
    assert "********" in shown


def test_the_otlp_endpoint_is_logged_without_its_credentials(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="postroom.tracing")
    made = tracing.setup("relay", {"OTEL_EXPORTER_OTLP_ENDPOINT": f"https://user:{TOKEN}@127.0.0.1:9"})
    try:
        assert "to https://user:********@127.0.0.1:9" in caplog.text
        assert TOKEN not in caplog.text
    finally:
        made.shutdown(timeout_s=0.1)


def test_the_log_masks_a_url_any_library_writes() -> None:
    """The roles' one handler stars credentials in every line, a library's among them."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(EscapingFilter())
    logger = logging.getLogger("some.library")
    logger.addHandler(handler)
    try:
        logger.warning("cannot reach %s", f"https://{TOKEN}@collector/v1/traces")
    finally:
        logger.removeHandler(handler)
    assert stream.getvalue() == "cannot reach https://********@collector/v1/traces\n"


def test_schemas_register_names_the_registry_without_its_credentials(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(registry_module, "register_contract", lambda *a, **k: [])
    settings = Settings.from_env({P + "SCHEMA_REGISTRY_URL": f"https://sr:{TOKEN}@registry"})
    admin.cmd_schemas_register(settings, argparse.Namespace(compatibility="BACKWARD",
                                                            schema_dir=None))
    err = capsys.readouterr().err
    assert "at https://sr:********@registry with" in err
    assert TOKEN not in err


def test_a_registry_error_shows_no_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """The client's transport errors may name the URL as it was given (httpx does, for an HTTP
    status); the error postroom raises (and `check` prints) shows it masked."""
    url = f"https://{TOKEN}@registry.invalid"

    class Client:
        def __init__(self, config: dict[str, Any]) -> None:
            pass

        def get_subjects(self) -> list[str]:
            raise RuntimeError(f"Server error '503' for url '{url}/subjects'")

        def close(self) -> None:
            pass

    class Package:
        SchemaRegistryClient = Client
        SchemaRegistryError = LookupError

    monkeypatch.setattr(registry_module, "_client_package", lambda: Package)
    with pytest.raises(RegistryError) as caught:
        Registry(Settings.from_env({P + "SCHEMA_REGISTRY_URL": url})).subjects()
    assert TOKEN not in str(caught.value)
    assert "for url 'https://********@registry.invalid/subjects'" in str(caught.value)


def test_check_names_the_registry_without_its_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Registry, "schema_ids", lambda self, topics: dict.fromkeys(topics, 1))
    monkeypatch.setattr(Registry, "compatibility", lambda self, subject: "BACKWARD")
    said = registry_module.check_registry(
        Settings.from_env({P + "SCHEMA_REGISTRY_URL": f"https://{TOKEN}@registry"}))
    assert said.startswith("https://********@registry: all ")
