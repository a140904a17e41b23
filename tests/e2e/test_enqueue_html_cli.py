"""`postroom enqueue --html-file F --inline PATH`, run as a report job's shell script runs it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import sqlalchemy as sa

from postroom.relay.db import make_engine
from postroom.settings import Settings
from support.commands import run_postroom

pytestmark = pytest.mark.e2e


def postroom(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    assert settings.database_schema
    env = {**os.environ, "POSTROOM_DATABASE_SCHEMA": settings.database_schema}
    return run_postroom(*args, env=env, timeout_s=60)


def rows(settings: Settings, key: str) -> list[sa.Row[tuple[str | None, list[str]]]]:
    engine = make_engine(settings)
    try:
        with engine.connect() as conn:
            return list(conn.execute(sa.text(
                "SELECT html, inline FROM outbox WHERE message_key = :k ORDER BY id"), {"k": key}))
    finally:
        engine.dispose()


def test_enqueue_stores_the_html_and_inline_images(db_settings: Settings, tmp_path: Path) -> None:
    html = '<p>Übersicht — 📈</p><img src="cid:chart.png">'
    (tmp_path / "summary.html").write_text(html, encoding="utf-8")
    (tmp_path / "chart.png").write_bytes(b"\x89PNG")
    proc = postroom(db_settings, "enqueue", "--key", "k", "--to", "a@example.com",
                    "--to", "b@example.com", "--subject", "S", "--body", "text",
                    "--html-file", str(tmp_path / "summary.html"),
                    "--inline", str(tmp_path / "chart.png"))
    assert proc.returncode == 0, proc.stderr
    assert [(r.html, r.inline) for r in rows(db_settings, "k")] == [
        (html, [str(tmp_path / "chart.png")])] * 2


@pytest.mark.parametrize(("extra", "problem"), [
    (["--html-file", "{tmp}/missing.html"], "cannot read --html-file {tmp}/missing.html"),
    (["--inline", "{tmp}/chart.png"], "inline images need an html body"),
    (["--html-file", "{tmp}/summary.html", "--inline", "{tmp}/notes.txt"], "is not an image file"),
])
def test_bad_html_input_is_a_clear_error_and_queues_nothing(
        db_settings: Settings, tmp_path: Path, extra: list[str], problem: str) -> None:
    (tmp_path / "summary.html").write_text("<p>x</p>")
    (tmp_path / "chart.png").write_bytes(b"\x89PNG")
    (tmp_path / "notes.txt").write_text("notes")
    proc = postroom(db_settings, "enqueue", "--key", "bad", "--to", "a@example.com",
                    "--subject", "S", "--body", "b",
                    *[arg.format(tmp=tmp_path) for arg in extra])
    assert proc.returncode == 1
    assert problem.format(tmp=tmp_path) in proc.stderr
    assert "Traceback" not in proc.stderr
    assert rows(db_settings, "bad") == []
