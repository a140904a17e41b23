"""pip's effective source settings, told to uv: scripts/bootstrap.sh installs with uv only when
uv would install from where pip would.

Run by the venv's Python. Prints one item a line: ``NAME=value`` for uv's environment (the index
URLs, which may hold credentials: in the environment they stay out of the process list; a CA
bundle) and ``--option=value`` for its arguments. Exits 1, saying why, when pip is set to
something uv would not be told (a constraint, hashes required, a trusted host...): pip then
installs, as it is set to.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys

# `pip config list` names each setting section.key: the [global] and [install] sections of every
# configuration file pip reads (merged as pip merges them), and :env: for PIP_* variables.
# pip install takes the environment first, then [install], then [global].
RANK = {"global": 0, "install": 1, ":env:": 2}
# Settings that do not change what is installed or from where.
HARMLESS = {"cache-dir", "config-file", "default-timeout", "disable-pip-version-check",
            "no-cache-dir", "no-color", "no-input", "progress-bar", "quiet", "require-virtualenv",
            "retries", "root-user-action", "timeout", "verbose"}
TOLD = {"cert", "extra-index-url", "find-links", "index-url", "no-index"}


def pip_settings(listed: str) -> dict[str, str]:
    """``pip config list``'s output as the value pip install takes for each setting."""
    best: dict[str, tuple[int, str]] = {}
    for line in listed.splitlines():
        name, _, value = line.partition("=")
        section, _, key = name.partition(".")
        if section in RANK and RANK[section] >= best.get(key, (-1, ""))[0]:
            best[key] = (RANK[section], str(ast.literal_eval(value)))
    return {key: value for key, (_, value) in best.items()}


def uv_settings(settings: dict[str, str], environ: dict[str, str]) -> list[str]:
    """uv's environment and arguments for ``settings``; ValueError for one uv is not told."""
    unknown = sorted(set(settings) - HARMLESS - TOLD)
    if unknown:
        raise ValueError(f"pip is set to {', '.join(unknown)}, which uv would not be told")
    if any("\n" in value or "\r" in value for value in settings.values()):
        raise ValueError("a pip setting holds a line break")
    told: list[str] = []
    if settings.get("no-index", "").strip().lower() in ("1", "true", "yes", "on"):
        told.append("--no-index")
    elif settings.get("index-url", "").strip():
        told.append(f"UV_INDEX_URL={settings['index-url'].strip()}")
    if extra := settings.get("extra-index-url", "").split():
        told.append(f"UV_EXTRA_INDEX_URL={' '.join(extra)}")
    told += [f"--find-links={link}" for link in settings.get("find-links", "").split()]
    if settings.get("cert", "").strip() and not environ.get("SSL_CERT_FILE"):
        told.append(f"SSL_CERT_FILE={settings['cert'].strip()}")
    return told


def main() -> int:
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"],
                            capture_output=True, text=True, check=True).stdout
    try:
        told = uv_settings(pip_settings(listed), dict(os.environ))
    except ValueError as exc:
        print(f"bootstrap: {exc}", file=sys.stderr)
        return 1
    print("\n".join(told))
    return 0


if __name__ == "__main__":
    sys.exit(main())
