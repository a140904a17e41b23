"""`postroom report failures --to`: a refused address writes nothing, not even the CSV."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
import sqlalchemy as sa

from postroom.relay.errors import InvalidEmailError
from postroom.relay.report import Failure, mail_report
from postroom.rules import SizeLimits

NOW = dt.datetime(2026, 12, 1, 7, 0, tzinfo=dt.UTC)
FAILURE = Failure(1, "old@example.com", "news", "news|old@example.com", "News", "failed", 1,
                  "550 5.1.1 unknown", NOW)


@pytest.mark.integration
def test_a_report_to_a_bad_address_leaves_no_csv(engine: sa.Engine, tmp_path: Path) -> None:
    with pytest.raises(InvalidEmailError), engine.begin() as conn:
        mail_report(conn, [FAILURE], NOW, "not-an-address", SizeLimits(), tmp_path)
    assert list(tmp_path.rglob("*")) == []
    with engine.begin() as conn:  # the same to a good address writes and attaches it
        mailed = mail_report(conn, [FAILURE], NOW, "owner@example.com", SizeLimits(), tmp_path)
    assert mailed.attached is not None and mailed.attached.exists()
