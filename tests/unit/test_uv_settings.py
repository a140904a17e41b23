"""scripts/uv_settings.py: bootstrap installs with uv only from where pip would install."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import hypothesis
import pytest
from hypothesis import given
from hypothesis import strategies as st

from support.fuzz import examples

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "uv_settings.py"
_spec = importlib.util.spec_from_file_location("uv_settings", SCRIPT)
assert _spec and _spec.loader
uv = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(uv)


def test_the_environment_wins_over_install_which_wins_over_global() -> None:
    listed = "\n".join([
        "global.index-url='https://global.example/simple'",
        ":env:.index-url='https://env.example/simple'",
        "install.index-url='https://install.example/simple'",
        "global.extra-index-url='https://a.example/simple'",
        "install.extra-index-url='https://b.example/simple'",
        "global.find-links='/opt/wheels'",
        "download.index-url='https://not-for-install.example/simple'",
    ])
    assert uv.pip_settings(listed) == {"index-url": "https://env.example/simple",
                                       "extra-index-url": "https://b.example/simple",
                                       "find-links": "/opt/wheels"}


def test_indexes_go_to_uvs_environment_and_links_to_its_arguments() -> None:
    settings = {"index-url": " https://u:secret@mirror.example/simple ",
                "extra-index-url": "https://a.example/simple\thttps://b.example/simple",
                "find-links": "/opt/wheels /srv/more", "cert": "/etc/ca.pem",
                "default-timeout": "180"}
    assert uv.uv_settings(settings, {}) == [
        "UV_INDEX_URL=https://u:secret@mirror.example/simple",
        "UV_EXTRA_INDEX_URL=https://a.example/simple https://b.example/simple",
        "--find-links=/opt/wheels", "--find-links=/srv/more", "SSL_CERT_FILE=/etc/ca.pem"]
    assert "SSL_CERT_FILE=/etc/ca.pem" not in uv.uv_settings(settings, {"SSL_CERT_FILE": "/x"})


@pytest.mark.parametrize("value", ["1", "true", "YES", "on"])
def test_no_index_is_no_index_even_with_an_index_set(value: str) -> None:
    told = uv.uv_settings({"no-index": value, "index-url": "https://m.example/simple",
                           "find-links": "/opt/wheels"}, {})
    assert told == ["--no-index", "--find-links=/opt/wheels"]


@pytest.mark.parametrize("setting", ["constraint", "require-hashes", "trusted-host", "pre",
                                     "only-binary", "client-cert", "keyring-provider"])
def test_a_setting_uv_would_not_be_told_leaves_the_install_to_pip(setting: str) -> None:
    with pytest.raises(ValueError, match=setting):
        uv.uv_settings({setting: "x", "index-url": "https://m.example/simple"}, {})


def test_a_line_break_in_a_setting_leaves_the_install_to_pip() -> None:
    with pytest.raises(ValueError, match="line break"):
        uv.uv_settings({"index-url": "https://m.example/simple\n--no-index"}, {})


def test_the_script_reads_pips_files_and_variables(tmp_path: Path) -> None:
    """pip's own reading, a file named by PIP_CONFIG_FILE and a variable; a refusal exits 1."""
    conf = tmp_path / "pip.conf"
    conf.write_text("[install]\nindex-url = https://install.example/simple\n")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PIP_CONFIG_FILE": str(conf),
           "PIP_FIND_LINKS": "/opt/wheels", "PIP_CERT": "/etc/ca.pem"}
    done = subprocess.run([sys.executable, str(SCRIPT)], env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    assert (done.returncode, done.stdout.split()) == (
        0, ["UV_INDEX_URL=https://install.example/simple", "--find-links=/opt/wheels",
            "SSL_CERT_FILE=/etc/ca.pem"])
    refused = subprocess.run([sys.executable, str(SCRIPT)],
                             env={**env, "PIP_CONSTRAINT": str(tmp_path / "c.txt")},
                             capture_output=True, text=True, timeout=60, check=False)
    assert refused.returncode == 1
    assert "pip is set to constraint" in refused.stderr


KEYS = sorted(uv.TOLD | uv.HARMLESS | {"constraint", "trusted-host", "require-hashes"})


@given(settings=st.dictionaries(st.sampled_from(KEYS), st.text(max_size=40), max_size=6),
       ssl_cert_file=st.sampled_from(["", "/etc/ca.pem"]))
@hypothesis.settings(max_examples=examples(300))
def test_any_settings_are_refused_or_told_with_no_index_url_among_the_arguments(
        settings: dict[str, str], ssl_cert_file: str) -> None:
    """Refused exactly when pip is set to more than uv is told or a value breaks a line; else
    every item is one line, an argument uv takes or a variable of its environment, and an index
    URL (which may hold a password) is never an argument."""
    refused = (set(settings) - uv.HARMLESS - uv.TOLD
               or any("\n" in value or "\r" in value for value in settings.values()))
    if refused:
        with pytest.raises(ValueError):
            uv.uv_settings(settings, {"SSL_CERT_FILE": ssl_cert_file})
    else:
        assert_told(uv.uv_settings(settings, {"SSL_CERT_FILE": ssl_cert_file}), settings)


def assert_told(told: list[str], settings: dict[str, str]) -> None:
    for item in told:
        assert "\n" not in item and "\r" not in item
        name, _, value = item.partition("=")
        assert name in {"--no-index", "--find-links", "UV_INDEX_URL", "UV_EXTRA_INDEX_URL",
                        "SSL_CERT_FILE"}
        assert value.strip() == value and (name == "--no-index") == (value == "")
    arguments = " ".join(item for item in told if item.startswith("-"))
    for key in ("index-url", "extra-index-url"):
        for url in settings.get(key, "").split():
            assert url not in arguments or url in settings.get("find-links", "").split()
