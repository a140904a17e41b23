"""The mail transport the attempt core sends through (sender/ports.py's MailTransport): a slot of
the SMTP pool, and the delivery that builds the message and sends it within its deadline."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

from postroom.schemas.codec import EmailRequested
from postroom.sender.delivery import Delivery
from postroom.sender.outcome import SmtpReply
from postroom.sender.smtp import SmtpPool, SmtpSlot


class SmtpTransport:
    def __init__(self, pool: SmtpPool, delivery: Delivery) -> None:
        self._pool = pool
        self._delivery = delivery

    def slot(self) -> _HeldDelivery:
        return _HeldDelivery(self._pool, self._delivery)

    async def close(self) -> None:
        await self._pool.close()


class _DeliverySlot:
    __slots__ = ("_delivery", "_slot")

    def __init__(self, delivery: Delivery, slot: SmtpSlot) -> None:
        self._delivery = delivery
        self._slot = slot

    async def send(self, event: EmailRequested, now: dt.datetime,
                   on_accepted: Callable[[str], None]) -> tuple[SmtpReply, str]:
        return await self._delivery.send(event, self._slot, now, on_accepted)


class _HeldDelivery:
    """``async with transport.slot()``: a class, as the pool's own slot is, not contextlib's
    generator-based manager (one per email)."""

    __slots__ = ("_delivery", "_held")

    def __init__(self, pool: SmtpPool, delivery: Delivery) -> None:
        self._held = pool.slot()
        self._delivery = delivery

    async def __aenter__(self) -> _DeliverySlot:
        return _DeliverySlot(self._delivery, await self._held.__aenter__())

    async def __aexit__(self, *exc_info: object) -> None:
        await self._held.__aexit__(*exc_info)
