"""The newest revision as the schema check reads it (from the migrations' file names, without
Alembic) is Alembic's head, and each file holds the revision its name starts with."""

from __future__ import annotations

from importlib import resources

from alembic.config import Config
from alembic.script import ScriptDirectory

from postroom.relay.db import head_revision


def scripts() -> ScriptDirectory:
    config = Config()
    config.set_main_option("script_location", str(resources.files("postroom.relay") / "migrations"))
    return ScriptDirectory.from_config(config)


def test_the_head_read_from_the_file_names_is_alembics() -> None:
    assert head_revision() == scripts().get_current_head()


def test_each_migration_file_is_named_after_its_revision() -> None:
    found = {script.revision: script.path for script in scripts().walk_revisions()}
    assert found
    for revision, path in found.items():
        assert path.rpartition("/")[2].startswith(f"{revision}_"), (revision, path)
