"""The sender's loop serves the producer's acknowledgements while a registry lookup runs: the
sends in flight wait on them, and a registry that does not answer takes tens of seconds."""

from __future__ import annotations

import asyncio

import pytest

from postroom.sender.service import serving


def test_a_slow_lookup_is_served_around_and_its_answer_returned() -> None:
    served: list[float] = []

    async def slow_lookup() -> str:
        await asyncio.sleep(0.35)
        return "schemas"

    async def main() -> str:
        loop = asyncio.get_running_loop()
        return await serving(slow_lookup(), lambda: served.append(loop.time()), 0.05)

    assert asyncio.run(main()) == "schemas"
    assert len(served) >= 4  # every 50 ms of the 350, not once before the wait


def test_a_lookup_that_fails_raises_its_error() -> None:
    async def failing() -> None:
        await asyncio.sleep(0.01)
        raise LookupError("registry says no")

    with pytest.raises(LookupError, match="registry says no"):
        asyncio.run(serving(failing(), lambda: None, 0.05))
