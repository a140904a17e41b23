"""The newest revision as the schema check reads it (from the migrations' file names, without
Alembic) is Alembic's head, and each file holds the revision its name starts with."""

from __future__ import annotations

from postroom.relay.db import head_revision, migration_scripts


def test_the_head_read_from_the_file_names_is_alembics() -> None:
    assert head_revision() == migration_scripts().get_current_head()


def test_each_migration_file_is_named_after_its_revision() -> None:
    found = {script.revision: script.path for script in migration_scripts().walk_revisions()}
    assert found
    for revision, path in found.items():
        assert path.rpartition("/")[2].startswith(f"{revision}_"), (revision, path)
