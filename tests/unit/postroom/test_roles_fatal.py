"""Each role's loop stops on a Kafka client in librdkafka's fatal state noted anywhere in the
process (postroom.kafka.fatal), not only on the call that met it: the recorder before its next
read, the bounce intake while it waits for connections."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from postroom.errors import KafkaFatalError
from postroom.kafka import fatal
from postroom.settings import Settings


class _Fenced:
    def __init__(self) -> None:
        self.reads = 0
        self.closed = False

    def subscribe(self, topics: list[str]) -> None:
        pass

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Any]:
        self.reads += 1
        return []

    def close(self) -> None:
        self.closed = True


class _Err:
    """What librdkafka gives for a fenced static member."""

    def str(self) -> str:
        return "Broker: Static consumer fenced by other consumer with same group.instance.id"

    def name(self) -> str:
        return "FENCED_INSTANCE_ID"


def noted(monkeypatch: pytest.MonkeyPatch) -> fatal.FatalState:
    state = fatal.FatalState()
    state.note(_Err(), "consumer")  # type: ignore[arg-type]
    monkeypatch.setattr(fatal, "FATAL", state)
    return state


def test_the_recorder_stops_on_a_fatal_client_and_closes_its_consumer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from postroom.relay.recorder import Recorder

    noted(monkeypatch)
    consumer = _Fenced()
    settings = Settings.from_env({"POSTROOM_KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1"})
    recorder = Recorder(settings, None, consumer_factory=lambda: consumer,  # type: ignore[arg-type]
                        schema_by_id=lambda schema_id: None)  # type: ignore[arg-type,return-value]
    with pytest.raises(KafkaFatalError, match=r"group\.instance\.id"):
        recorder.run()
    assert (consumer.reads, consumer.closed) == (0, True)


def test_the_bounce_intake_stops_waiting_on_a_fatal_client(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from postroom.bounces.service import until_stopped

    monkeypatch.setattr(fatal, "FATAL", fatal.FatalState())

    async def main() -> None:
        stopping = asyncio.Event()
        waiting = asyncio.ensure_future(until_stopped(stopping))
        await asyncio.sleep(0)
        assert not waiting.done()
        fatal.FATAL.note(_Err(), "producer")  # type: ignore[arg-type]
        await asyncio.wait_for(waiting, 5)

    with pytest.raises(KafkaFatalError):
        asyncio.run(main())


def test_the_bounce_intake_stops_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    from postroom.bounces.service import until_stopped

    monkeypatch.setattr(fatal, "FATAL", fatal.FatalState())

    async def main() -> None:
        stopping = asyncio.Event()
        waiting = asyncio.ensure_future(until_stopped(stopping))
        stopping.set()
        await asyncio.wait_for(waiting, 5)

    asyncio.run(main())
