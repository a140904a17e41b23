"""Settings declared once: README's table is the one the declarations give, each default shown
is the one in force, and a group derived from the prefix follows a prefix changed later."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest

from postroom.settings import FIELDS, Settings, markdown_table
from postroom.settings_declare import Declaration, declarations, default_text

README = Path(__file__).resolve().parents[3] / "README.md"


def _readme_table() -> str:
    lines = README.read_text(encoding="utf-8").splitlines()
    start = lines.index("| variable | default | meaning |")
    end = next(i for i in range(start, len(lines)) if not lines[i].startswith("|"))
    return "\n".join(lines[start:end]) + "\n"


def test_readmes_settings_table_is_the_generated_one() -> None:
    assert _readme_table() == markdown_table(), (
        "README.md's settings table differs from the declarations in postroom/settings.py: "
        "edit the declaration, then paste `python -m postroom.settings --markdown` into README")


def test_the_table_names_every_variable_once() -> None:
    named = re.findall(r"`(POSTROOM_[A-Z0-9_]+)`", "\n".join(
        line.split(" | ")[0] for line in markdown_table().splitlines()))
    files = [d.file.env for _, d in declarations(Settings) if d.file is not None]
    assert sorted(named) == sorted([*FIELDS, *files])


def test_markdown_is_printed_by_the_module() -> None:
    out = subprocess.run([sys.executable, "-m", "postroom.settings", "--markdown"],
                         capture_output=True, text=True, check=True).stdout
    assert out == markdown_table()


# (field, the value its default column shows) where that column is one value in backticks.
SHOWN = [(f, m.group(1)) for f in dataclasses.fields(Settings) if "setting" in f.metadata
         if (m := re.fullmatch(r"`([^`<]+)`( \(.*\))?", default_text(f, f.metadata["setting"])))]


def test_most_defaults_are_shown_as_a_value() -> None:
    assert len(SHOWN) >= 30


@pytest.mark.parametrize(("field", "shown"), SHOWN, ids=[f.name for f, _ in SHOWN])
def test_a_default_shown_as_one_value_is_the_default(field: dataclasses.Field[object],
                                                     shown: str) -> None:
    declared: Declaration = field.metadata["setting"]
    assert declared.parse(shown) == getattr(Settings(), field.name)


def test_replacing_the_prefix_derives_the_groups_again() -> None:
    moved = dataclasses.replace(Settings(), topic_prefix="staging.")
    assert (moved.sender_group, moved.recorder_group) == ("staging.sender", "staging.recorder")


def test_a_group_given_is_kept_whatever_the_prefix() -> None:
    given = Settings.from_env({"POSTROOM_SENDER_GROUP": "postroom-sender"})
    moved = dataclasses.replace(given, topic_prefix="staging.")
    assert (moved.sender_group, moved.recorder_group) == ("postroom-sender", "staging.recorder")
    renamed = dataclasses.replace(moved, recorder_group="mine")
    assert dataclasses.replace(renamed, topic_prefix="x.").recorder_group == "mine"


def test_the_groups_are_plain_strings_whether_derived_or_given() -> None:
    # librdkafka's admin calls (create_acls) failed on a str subclass.
    derived = dataclasses.replace(Settings(), topic_prefix="staging.")
    given = Settings.from_env({"POSTROOM_SENDER_GROUP": "postroom-sender"})
    assert {type(g) for s in (Settings(), derived, given)
            for g in (s.sender_group, s.recorder_group)} == {str}
