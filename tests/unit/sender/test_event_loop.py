"""POSTROOM_EVENT_LOOP: which loop the sender runs on."""

from __future__ import annotations

import asyncio
import builtins
from typing import Any

import pytest
import uvloop

from postroom.errors import ConfigError
from postroom.sender.service import event_loop_factory


@pytest.mark.parametrize(("choice", "factory"), [
    ("auto", uvloop.new_event_loop),
    ("uvloop", uvloop.new_event_loop),
    ("asyncio", asyncio.new_event_loop),
])
def test_the_loop_chosen(choice: str, factory: object) -> None:
    assert event_loop_factory(choice) is factory


def without_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def refuse(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "uvloop":
            raise ImportError("no uvloop here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", refuse)


def test_auto_falls_back_to_asyncio_without_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    without_uvloop(monkeypatch)
    assert event_loop_factory("auto") is asyncio.new_event_loop


def test_asking_for_a_missing_uvloop_is_a_configuration_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    without_uvloop(monkeypatch)
    with pytest.raises(ConfigError, match=r"POSTROOM_EVENT_LOOP.*not installed"):
        event_loop_factory("uvloop")
