"""The Postfix smarthost and the bounce intake for integration tests: the smarthost in a
directory of the dev dir (the postfix user must reach every parent, which pytest's tmp_path does
not allow), the intake on a thread of its own."""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from postroom.bounces.service import BounceIntake
from postroom.devkit.smarthost import Smarthost, smarthost
from postroom.metrics import Metrics
from postroom.settings import Settings
from support.metrics import counter
from support.stack import dev_dir

START_TIMEOUT_S = 15.0


def smarthost_dir() -> Path:
    return dev_dir() / "smarthost" / uuid.uuid4().hex[:10]


@contextlib.contextmanager
def started_smarthost(port: int, routes: Mapping[str, tuple[str, int]], *,
                      queue_lifetime_s: int, delay_warning_s: int | None) -> Iterator[Smarthost]:
    """A running Smarthost; its log is printed when the test fails (pytest shows stdout)."""
    with smarthost(smarthost_dir(), port, routes, queue_lifetime_s=queue_lifetime_s,
                   delay_warning_s=delay_warning_s) as host:
        try:
            yield host
        except BaseException:
            print("postfix log:\n" + "\n".join(host.log().splitlines()[-40:]))
            raise


class IntakeThread:
    """`postroom bounces` on a thread, with metrics the test reads."""

    def __init__(self, settings: Settings, engine: sa.Engine, **kwargs: Any) -> None:
        self.metrics = Metrics()
        self.intake = BounceIntake(settings, engine, metrics=self.metrics, **kwargs)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, name="bounces", daemon=True)

    def _main(self) -> None:
        try:
            self.intake.run()
        except BaseException as exc:  # noqa: BLE001 - reported to the test by stop()
            self.error = exc
            self.intake.listening.set()

    def __enter__(self) -> IntakeThread:
        self.thread.start()
        assert self.intake.listening.wait(START_TIMEOUT_S), "the bounce intake did not listen"
        if self.error is not None:
            raise AssertionError("the bounce intake did not start") from self.error
        return self

    def __exit__(self, *_exc_info: object) -> None:
        self.intake.stop()
        self.thread.join(30)
        assert not self.thread.is_alive(), "the bounce intake did not stop"
        if self.error is not None:
            raise AssertionError("the bounce intake crashed") from self.error

    def refused(self, reason: str) -> float:
        return counter(self.metrics, "bounce_refused_total", reason=reason)
