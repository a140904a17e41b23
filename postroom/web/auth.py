"""Who a request is and what it may do: sign-in by token, the trusted proxy's header, the two
roles, and the CSRF token every POST carries. Pure: no request object, no I/O."""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import hmac
import ipaddress
import secrets
import time
from collections.abc import Callable, Iterable, Sequence

from postroom.errors import ConfigError
from postroom.settings import Settings

# The header oauth2-proxy (and most single-sign-on proxies) set to the signed-in address.
PROXY_EMAIL_HEADER = "X-Forwarded-Email"
CSRF_FIELD = "csrf"
CSRF_TOKEN_BYTES = 32
EMAIL_MAX_CHARS = 254
LOOPBACK = (ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128"),
            ipaddress.ip_network("::ffff:127.0.0.0/104"))


class Role(enum.StrEnum):
    READER = "reader"      # searches, reads timelines, reports and lists
    OPERATOR = "operator"  # and acts: suppress, remove, replay, requeue

    def may(self, needed: Role) -> bool:
        return self is Role.OPERATOR or needed is Role.READER


@dataclasses.dataclass(frozen=True)
class Identity:
    who: str   # an address from the proxy, or "operator token" / "reader token"
    role: Role
    by: str    # "token" or "proxy"


def check_configured(settings: Settings) -> None:
    """ConfigError unless at least one way to sign in is set: the console never serves anyone
    unauthenticated."""
    if (settings.web_operator_token is None and settings.web_reader_token is None
            and not settings.web_trusted_proxies):
        raise ConfigError("POSTROOM_WEB_OPERATOR_TOKEN_FILE",
                          "postroom web needs a way to sign in: a token "
                          "(POSTROOM_WEB_OPERATOR_TOKEN_FILE, POSTROOM_WEB_READER_TOKEN_FILE) or "
                          "a single-sign-on proxy (POSTROOM_WEB_TRUSTED_PROXIES)")
    if (settings.web_operator_token is not None and settings.web_reader_token is not None
            and _same(settings.web_operator_token.reveal(), settings.web_reader_token.reveal())):
        raise ConfigError("POSTROOM_WEB_READER_TOKEN",
                          "is the operator's token: a reader would sign in as an operator")
    if any(ipaddress.ip_network(net).overlaps(loopback) for net in settings.web_trusted_proxies
           for loopback in LOOPBACK if ipaddress.ip_network(net).version == loopback.version) \
            and not settings.web_hosts:
        raise ConfigError("POSTROOM_WEB_HOSTS", "is needed when POSTROOM_WEB_TRUSTED_PROXIES "
                          "holds a loopback address: name the hosts the proxy forwards (a "
                          "browser on this host could otherwise reach the console through a "
                          "name rebound to loopback, and send the header itself)")
    if settings.web_operators and not settings.web_trusted_proxies:
        raise ConfigError("POSTROOM_WEB_OPERATORS", "names the operators a proxy signs in: it "
                          "needs POSTROOM_WEB_TRUSTED_PROXIES")


def _same(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode(), expected.encode())


def by_token(given: str, settings: Settings) -> Identity | None:
    """The identity a sign-in token gives, or None: compared in constant time, the operator's
    first."""
    if not given:
        return None
    if settings.web_operator_token is not None and _same(
            given, settings.web_operator_token.reveal()):
        return Identity("operator token", Role.OPERATOR, "token")
    if settings.web_reader_token is not None and _same(given, settings.web_reader_token.reveal()):
        return Identity("reader token", Role.READER, "token")
    return None


def session_mac(session_id: str, token: str) -> str:
    """What ties a session to the token that signed it in: the HMAC-SHA256 of its id under the
    token. The store keeps it beside the id's hash; neither gives the token, nor the id."""
    return hmac.new(token.encode(), session_id.encode(), hashlib.sha256).hexdigest()


def session_holds(session_id: str, role: Role, token_mac: str, settings: Settings) -> bool:
    """Whether a session with ``role`` was signed in with the token that role has now: a token
    changed or removed (a leaked one replaced, and the console restarted) ends the sessions it
    signed in, which the database would otherwise keep past the restart."""
    token = settings.web_operator_token if role is Role.OPERATOR else settings.web_reader_token
    return token is not None and hmac.compare_digest(
        session_mac(session_id, token.reveal()).encode(), token_mac.encode())


def is_trusted(peer: str | None, networks: Iterable[str]) -> bool:
    """Whether the connection's peer address is one of the trusted proxies'."""
    if not peer:
        return False
    try:
        address = ipaddress.ip_address(peer)
    except ValueError:
        return False
    # A listener on [::] sees an IPv4 proxy as ::ffff:a.b.c.d.
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    return any(address in ipaddress.ip_network(net) or (mapped is not None and mapped in
                                                         ipaddress.ip_network(net))
               for net in networks)


def by_proxy(peer: str | None, headers: Sequence[str],
             settings: Settings) -> Identity | None:
    """The identity a trusted proxy's X-Forwarded-Email gives (``headers``: each of its values),
    or None: the header counts only on a connection from POSTROOM_WEB_TRUSTED_PROXIES, and only
    once, as one plain address (a proxy that appends its own after a client's would otherwise
    let the client's win)."""
    if len(headers) != 1 or not is_trusted(peer, settings.web_trusted_proxies):
        return None
    email = headers[0].strip().lower()
    if not email or len(email) > EMAIL_MAX_CHARS or "@" not in email or not email.isprintable() \
            or any(ch.isspace() or ch in "<>,;\"" for ch in email):
        return None
    role = Role.OPERATOR if email in settings.web_operators else Role.READER
    return Identity(email, role, "proxy")


# Refused sign-ins a peer may have in a window before it must wait: a person mistyping is not
# stopped, a guesser (and the audit rows each guess writes) is.
SIGNIN_REFUSALS_MAX = 10
SIGNIN_WINDOW_S = 60.0


class SignInThrottle:
    """Refused sign-ins per peer address over the last ``window_s`` seconds (``clock``'s)."""

    def __init__(self, max_refusals: int = SIGNIN_REFUSALS_MAX,
                 window_s: float = SIGNIN_WINDOW_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._max = max_refusals
        self._window_s = window_s
        self._clock = clock
        self._refused: dict[str, list[float]] = {}

    def _recent(self) -> dict[str, list[float]]:
        since = self._clock() - self._window_s
        for peer in list(self._refused):
            kept = [at for at in self._refused[peer] if at > since]
            if kept:
                self._refused[peer] = kept
            else:
                del self._refused[peer]
        return self._refused

    def blocked(self, peer: str) -> bool:
        """Whether ``peer`` has had its refusals in the window: it may not try now."""
        return len(self._recent().get(peer, ())) >= self._max

    def refused(self, peer: str) -> None:
        self._recent().setdefault(peer, []).append(self._clock())

    def __len__(self) -> int:
        """Peers with a refusal in the window (what the throttle holds)."""
        return len(self._recent())


def new_csrf_token() -> str:
    return secrets.token_urlsafe(CSRF_TOKEN_BYTES)


def csrf_matches(expected: str | None, posted: object) -> bool:
    """Whether a POST carries the session's CSRF token (a forged form cannot know it)."""
    if not expected or not isinstance(posted, str) or not posted:
        return False
    return _same(posted, expected)
