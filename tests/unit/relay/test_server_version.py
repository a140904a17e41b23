"""postroom refuses a PostgreSQL older than it supports, by name, before touching the schema."""

from __future__ import annotations

import re

import pytest

from postroom.relay.db import check_server_version
from postroom.relay.errors import UnsupportedDatabaseError


@pytest.mark.parametrize("version", [(13, 16), (9, 6, 24)])
def test_a_server_older_than_14_is_refused_by_its_version(version: tuple[int, ...]) -> None:
    shown = re.escape(".".join(map(str, version)))
    with pytest.raises(UnsupportedDatabaseError, match=rf"PostgreSQL {shown} is too old: .*14"):
        check_server_version(version)


@pytest.mark.parametrize("version", [(14, 0), (15, 14), (17, 2), (18, "beta1"), None, ()])
def test_14_and_newer_pass_as_does_an_unknown_version(
        version: tuple[int | str, ...] | None) -> None:
    check_server_version(version)
