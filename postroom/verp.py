"""The VERP token: a signed name for one outbox row that rides in the envelope sender
(``bounces+<token>@bounce.example.com``) and the DSN ENVID, so a bounce finds its row and a forged
one changes nothing. Pure: the clock and the secrets are arguments."""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import re
from collections.abc import Sequence

from postroom.errors import PostroomError

LOCAL_PART_MAX_CHARS = 64  # RFC 5321 4.5.3.1.1
MAC_CHARS = 16  # 80 bits of HMAC-SHA256 in lowercase base32
OUTBOX_ID_MAX = 2**63 - 1  # the outbox's bigint
_DAY_ZERO = dt.date(1970, 1, 1)
_MAC_CONTEXT = b"postroom-verp-v1"
_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"
DAY_MAX = 36**4 - 1  # days since 1970 in four base36 digits: until 6568-08-18
_TOKEN = re.compile(rf"([0-9a-z]{{1,13}})-([0-9a-z]{{1,4}})-([a-z2-7]{{{MAC_CHARS}}})")


class TokenError(PostroomError, ValueError):
    """The bounce's token names no row of ours."""


class MalformedTokenError(TokenError):
    """The address carries no token of postroom's shape."""


class ForgedTokenError(TokenError):
    """The token's signature matches none of the bounce secrets."""


class ExpiredTokenError(TokenError):
    """The token is older than POSTROOM_BOUNCE_TOKEN_MAX_AGE (or dated ahead of the clock)."""


def _base36(number: int) -> str:
    digits = ""
    while True:
        number, digit = divmod(number, 36)
        digits = _DIGITS[digit] + digits
        if number == 0:
            return digits


def _day_of(now: dt.datetime) -> int:
    if now.tzinfo is None:
        raise ValueError("the clock must be timezone-aware")
    return (now.astimezone(dt.UTC).date() - _DAY_ZERO).days


def _mac(secret: bytes, id_part: str, day_part: str) -> str:
    digest = hmac.new(secret, b"|".join([_MAC_CONTEXT, id_part.encode(), day_part.encode()]),
                      hashlib.sha256).digest()
    return base64.b32encode(digest).decode().lower()[:MAC_CHARS]


def make_token(outbox_id: int, secret: bytes, now: dt.datetime) -> str:
    """The token naming ``outbox_id``, made on ``now``'s (UTC) day and signed with ``secret``:
    ``<id base36>-<day base36>-<16 chars of HMAC-SHA256, base32>``, lowercase, at most 35 chars."""
    if not 0 < outbox_id <= OUTBOX_ID_MAX:
        raise ValueError(f"outbox id out of range: {outbox_id}")
    if not secret:
        raise ValueError("the bounce secret is empty")
    day = _day_of(now)
    if not 0 <= day <= DAY_MAX:
        raise ValueError(f"the clock is out of the token's range: {now.isoformat()}")
    id_part, day_part = _base36(outbox_id), _base36(day)
    return f"{id_part}-{day_part}-{_mac(secret, id_part, day_part)}"


def _split(address: str) -> tuple[str, str]:
    local, at, domain = address.rpartition("@")
    if not at or not local or not domain:
        raise MalformedTokenError(f"not an address: {address[:100]!r}")
    return local, domain


def return_path(bounce_address: str, token: str) -> str:
    """The envelope sender carrying ``token``: ``bounces@d`` becomes ``bounces+<token>@d``."""
    local, domain = _split(bounce_address)
    path_local = f"{local}+{token}"
    if len(path_local) > LOCAL_PART_MAX_CHARS:
        raise ValueError(f"{bounce_address}: its local part leaves no room for the token "
                         f"({len(path_local)} > {LOCAL_PART_MAX_CHARS} chars)")
    return f"{path_local}@{domain}"


def _token_of(address_or_token: str, bounce_address: str) -> str:
    if "@" not in address_or_token:
        return address_or_token
    local, domain = _split(address_or_token.strip().strip("<>"))
    bounce_local, bounce_domain = _split(bounce_address)
    prefix = f"{bounce_local}+".lower()
    if domain.lower() != bounce_domain.lower() or not local.lower().startswith(prefix):
        raise MalformedTokenError(f"not an address of {bounce_address}")
    return local[len(prefix):]


def read_token(address_or_token: str, bounce_address: str, secrets: Sequence[bytes],
               now: dt.datetime, max_age: dt.timedelta) -> int:
    """The outbox id named by a token, bare (a DSN's ENVID) or in a return path of
    ``bounce_address``; raises MalformedTokenError, ForgedTokenError (no secret signed it; the
    compare is constant-time) or ExpiredTokenError (its day ended more than ``max_age`` ago, or it
    is dated more than a day ahead of ``now``); whatever the address, nothing else."""
    match = _TOKEN.fullmatch(_token_of(address_or_token, bounce_address).lower())
    if match is None:
        raise MalformedTokenError("not a postroom token")
    id_part, day_part, mac = match.groups()
    if not any(hmac.compare_digest(_mac(secret, id_part, day_part), mac) for secret in secrets if secret):
        raise ForgedTokenError
    outbox_id, day, today = int(id_part, 36), int(day_part, 36), _day_of(now)
    # Dates are only known to the day: a token counts as made at the end of its day.
    made_by = dt.datetime.combine(_DAY_ZERO + dt.timedelta(days=day + 1), dt.time(), dt.UTC)
    if day > today + 1 or now - made_by > max_age:
        raise ExpiredTokenError
    if not 0 < outbox_id <= OUTBOX_ID_MAX:
        raise MalformedTokenError("the token's outbox id is out of range")
    return outbox_id
