"""How a setting is declared (:func:`setting`: its variable, parser, default, help and mask, as a
dataclass field's metadata) and what is derived from the declarations: the parse of one value into
a one-line ConfigError, and README's settings table.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from postroom.errors import ConfigError
from postroom.logs import escape_unprintable

ENV_PREFIX = "POSTROOM_"
# The largest file a setting is read from: a secret or a client's configuration is a few lines.
SETTING_FILE_MAX_BYTES = 1024 * 1024
# A meaning of SAME_ROW puts a setting in the README row of the one declared before it.
SAME_ROW = ""


@dataclasses.dataclass(frozen=True)
class FileVariant:
    """``<NAME>_FILE``: the same setting read from a file (for secrets). ``merge`` says how it meets
    the variable: the file ``wins``, the variable wins key by key (``under``), or both set is an
    error (``alone``)."""

    env: str
    parse: Callable[[str], Any]
    merge: Literal["wins", "under", "alone"]
    meaning: str = SAME_ROW


@dataclasses.dataclass(frozen=True)
class Declaration:
    """What :func:`setting` attaches to a field: everything but its name, type and default."""

    env: str
    parse: Callable[[str], Any]
    meaning: str
    shown_default: str | None  # README's default column; None: the default in backticks
    mask: Callable[[Any], Any] | None  # how repr shows a set value; None: as it is
    file: FileVariant | None


def setting(env: str, parse: Callable[[str], Any], default: Any = None, *, meaning: str,
            shown: str | None = None, mask: Callable[[Any], Any] | None = None,
            file: FileVariant | None = None, factory: Callable[[], Any] | None = None) -> Any:
    """Declare one setting: a dataclass field whose metadata holds its :class:`Declaration`."""
    if file is not None:
        file = dataclasses.replace(file, env=ENV_PREFIX + file.env)
    declared = Declaration(ENV_PREFIX + env, parse, meaning, shown, mask, file)
    metadata = {"setting": declared}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def parsed(name: str, parse: Callable[[str], Any], raw: str) -> Any:
    try:
        return parse(raw)
    except (ValueError, OSError) as exc:
        # One line, whatever the value held (a path with a line break).
        raise ConfigError(name, escape_unprintable(str(exc))) from exc


def from_file(declared: Declaration, path: str, given: Any) -> Any:
    """The value the file at ``path`` gives ``declared``, met with ``given`` (what its variable
    gave, or None) as its variant's merge says."""
    variant = declared.file
    if variant is None:
        raise TypeError(f"{declared.env} has no file variant")
    if variant.merge == "alone" and given is not None:
        raise ConfigError(variant.env, f"set this or {declared.env}, not both")
    # ValueError from reading: a NUL in the path, a file not in UTF-8.
    value = parsed(variant.env, lambda p: variant.parse(_text_of(Path(p))), path)
    if variant.merge == "under" and given is not None:
        return {**value, **given}
    return value


def _text_of(path: Path) -> str:
    """A setting's file as UTF-8 text, SETTING_FILE_MAX_BYTES at most (a device such as
    /dev/zero named by mistake is refused, not read for ever). Not UTF-8: a ValueError that names
    where, never the byte (UnicodeDecodeError's text does: a byte of the secret the file holds)."""
    with path.open("rb") as file:
        data = file.read(SETTING_FILE_MAX_BYTES + 1)
    if len(data) > SETTING_FILE_MAX_BYTES:
        raise ValueError(f"{path}: larger than {SETTING_FILE_MAX_BYTES // 1024} KiB: not a "
                         "setting's file")
    try:
        text = data.decode()
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text (at byte {exc.start})") from None
    return text.replace("\r\n", "\n").replace("\r", "\n")  # as read_text's newlines


def declarations(cls: type[Any]) -> list[tuple[str, Declaration]]:
    """(field name, declaration) of every setting of dataclass ``cls``, in declaration order."""
    return [(f.name, f.metadata["setting"]) for f in dataclasses.fields(cls)
            if "setting" in f.metadata]


def default_text(field: dataclasses.Field[Any], declared: Declaration) -> str:
    if declared.shown_default is not None:
        return declared.shown_default
    default = field.default
    if default is None:
        return ""
    if isinstance(default, bool):
        return f"`{str(default).lower()}`"
    return f"`{default}`"


def markdown_table(cls: type[Any]) -> str:
    """README's settings table, one row per declaration (SAME_ROW ones joined to the row above)."""
    rows: list[tuple[list[str], list[str], str]] = []
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for field, declared in declarations(cls):
        entries = [(declared.env, default_text(fields[field], declared), declared.meaning)]
        if declared.file is not None:
            entries.append((declared.file.env, "", declared.file.meaning))
        for name, default, meaning in entries:
            if meaning == SAME_ROW and rows:
                rows[-1][0].append(name)
                if default:
                    rows[-1][1].append(default)
            else:
                rows.append(([name], [default] if default else [], meaning))
    lines = ["| variable | default | meaning |", "|---|---|---|"]
    for names, defaults, meaning in rows:
        default = f" {' / '.join(defaults)} " if defaults else " "
        lines.append(f"| {' / '.join(f'`{n}`' for n in names)} |{default}| {meaning} |")
    return "\n".join(lines) + "\n"
