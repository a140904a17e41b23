"""The values of postroom's settings: each parser takes the text of one ``POSTROOM_*`` variable and
returns its value or raises ValueError with a one-line message that never echoes a secret.
"""

from __future__ import annotations

import enum
import math
import re
from pathlib import Path

from postroom import rules
from postroom.errors import InvalidContentError

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
# The longest a bounce token may live or an address stay suppressed: far more than any policy
# needs, and far enough from the end of Python's datetime (9999) and a timedelta (999,999,999
# days) that a date computed from it stays one.
LONGEST_PERIOD_S = 36500 * 86400.0


class Secret:
    """A string that does not show itself in repr, str or logs."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('********')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


class TlsMode(enum.StrEnum):
    AUTO = "auto"          # STARTTLS whenever the server offers it
    STARTTLS = "starttls"  # STARTTLS required
    TLS = "tls"            # implicit TLS from the first byte
    NONE = "none"


def password_file(text: str) -> Secret:
    """A password file's text: one line, its line break not part of the password."""
    return Secret(text.rstrip("\r\n"))


def stars_each(secrets: tuple[bytes, ...]) -> tuple[str, ...]:
    """Secrets as a repr shows them: as many as there are, none of them."""
    return tuple("********" for _ in secrets)


def parse_duration_s(text: str) -> float:
    """``"5m"`` -> 300.0. Units: ms, s (default), m, h, d."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"not a duration: {shown(text)} (examples: 500ms, 2s, 5m, 1h, 30d)")
    value = float(match.group(1)) * _UNIT_S[match.group(2) or "s"]
    if value <= 0:
        raise ValueError(f"a duration must be positive: {text!r}")
    if not math.isfinite(value):
        raise ValueError(f"not a duration: {shown(text)} is too long")
    return value


def parse_period_s(text: str) -> float:
    """A duration of at most LONGEST_PERIOD_S (a token's life, a suppression's): dates are
    computed from it, and one past what a timestamp holds would fail where it is used."""
    value = parse_duration_s(text)
    if value > LONGEST_PERIOD_S:
        raise ValueError(f"at most 100 years (36500d), got {shown(text.strip())}")
    return value


def parse_durations_s(text: str) -> tuple[float, ...]:
    """``"5m,10m"`` -> (300.0, 600.0); an empty string means no tiers."""
    parts = [p for p in text.split(",") if p.strip()]
    return tuple(parse_duration_s(p) for p in parts)



_WHOLE_NUMBER = re.compile(r"\s*[+-]?[0-9]{1,18}\s*")


def shown(text: str) -> str:
    """A value as an error shows it: quoted, escaped, cut short."""
    return repr(text if len(text) <= 40 else text[:40] + "...")


def whole_number(text: str, example: str = "10") -> int:
    """An integer written in ASCII digits; a ValueError saying the expected form otherwise (int()
    alone said ``invalid literal for int() with base 10``)."""
    if not _WHOLE_NUMBER.fullmatch(text):
        raise ValueError(f"expected a whole number such as {example}, got {shown(text)}")
    return int(text)


def positive_int(text: str) -> int:
    value = whole_number(text)
    if value < 1:
        raise ValueError(f"must be at least 1, got {value}")
    return value


def replication_factor(text: str) -> int:
    value = whole_number(text, "3, or -1 for the broker default")
    if value < 1 and value != -1:
        raise ValueError(f"must be at least 1, or -1 for the broker default, got {value}")
    return value


def tcp_port(text: str) -> int:
    value = whole_number(text, "25 (a TCP port, 1 to 65535)")
    if not 0 < value < 65536:
        raise ValueError(f"not a TCP port (1 to 65535): {value}")
    return value


def listen_port(text: str) -> int:
    """A TCP port to listen on: 1 to 65535, or 0 for any free one (the role logs which)."""
    value = whole_number(text, "9108 (a TCP port, 1 to 65535, or 0 for any free one)")
    if not 0 <= value < 65536:
        raise ValueError(f"not a TCP port (1 to 65535, or 0 for any free one): {value}")
    return value


def http_url(text: str) -> str:
    text = text.strip().rstrip("/")
    if not re.fullmatch(r"https?://[^\s/]+(/\S*)?", text):
        raise ValueError("expected an http(s) URL such as http://registry:8081 "
                         "(Apicurio: http://host:8080/apis/ccompat/v7)")
    return text




def database_url(text: str) -> str:
    if not text.startswith("postgresql"):
        raise ValueError("expected a SQLAlchemy URL such as postgresql+psycopg://user@host:5432/db")
    return text


def identifier(text: str) -> str:
    if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", text):
        raise ValueError("expected a lower-case SQL identifier (letters, digits, '_')")
    return text


def tls_mode(text: str) -> TlsMode:
    try:
        return TlsMode(text.strip().lower())
    except ValueError:
        raise ValueError(f"expected one of {', '.join(m.value for m in TlsMode)}") from None


def prefix(text: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9._-]*", text):
        raise ValueError("a topic prefix may hold only letters, digits, '.', '_' and '-'")
    return text


def attachments_root(text: str) -> Path:
    # Existence is checked by the component that reads it (the sender), not by every process
    # that shares the environment.
    path = Path(text).resolve()
    try:
        rules.check_root(str(path))
    except InvalidContentError as exc:
        raise ValueError(str(exc)) from None
    return path


def mail_from(text: str) -> str:
    # Checked here: a From the sender's rules refuse would fail every email without a sender.
    try:
        return rules.check_mailbox(text.strip(), what="the From address")
    except InvalidContentError as exc:
        raise ValueError(str(exc)) from None


def event_max_bytes(text: str) -> int:
    value = positive_int(text)
    if value > rules.EVENT_MAX_BYTES_CEILING:
        raise ValueError(f"must stay well under Kafka's default message.max.bytes (1 MiB): at "
                         f"most {rules.EVENT_MAX_BYTES_CEILING}, got {value}")
    return value


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def boolean(text: str) -> bool:
    word = text.strip().lower()
    if word not in _TRUE | _FALSE:
        raise ValueError("expected true or false")
    return word in _TRUE


def existing_file(text: str) -> Path:
    path = Path(text).resolve()
    if not path.is_file():
        raise ValueError(f"not a file: {path}")
    return path


def destination_by(text: str) -> str:
    value = text.strip().lower()
    if value not in ("domain", "smarthost"):
        raise ValueError("expected domain (one destination per recipient domain) or smarthost")
    return value


def rate(text: str) -> float:
    """Messages per second, ``0`` for no limit; ``30/m`` and ``2/s`` are read too."""
    number, _, per = text.strip().partition("/")
    seconds = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}.get(per.strip())
    if seconds is None:
        raise ValueError(f"expected a rate such as 2/s or 30/m, got {shown(text)}")
    try:
        value = float(number) / seconds
    except ValueError:
        raise ValueError(f"expected a rate such as 2/s or 30/m, got {shown(text)}") from None
    if not (value >= 0 and value != float("inf")):
        raise ValueError(f"expected a rate of 0 or more, e.g. 2/s or 30/m, got {shown(text)}")
    return value


def log_level(text: str) -> str:
    level = text.strip().upper()
    if level not in {"DEBUG", "INFO", "WARNING", "ERROR"}:
        raise ValueError("expected DEBUG, INFO, WARNING or ERROR")
    return level


def event_loop(text: str) -> str:
    loop = text.strip().lower()
    if loop not in {"auto", "uvloop", "asyncio"}:
        raise ValueError("expected auto, uvloop or asyncio")
    return loop


# The longest token postroom.verp makes (35 characters) and "+": the bounce address's local part
# must leave room for them within RFC 5321's 64.
BOUNCE_LOCAL_MAX_CHARS = 64 - 36
BOUNCE_SECRET_MIN_BYTES = 16


def bounce_address(text: str) -> str:
    # The envelope sender of every email: one bare ASCII address, with room for the token.
    try:
        address = rules.check_address(text, what="the bounce address")
    except InvalidContentError as exc:
        raise ValueError(str(exc)) from None
    if not address.isascii():
        raise ValueError(f"the bounce address {shown(address)} must be ASCII (it is the "
                         "envelope sender of every email, whatever the server supports)")
    if len(address.rpartition("@")[0]) > BOUNCE_LOCAL_MAX_CHARS:
        raise ValueError(f"the bounce address's local part may be at most "
                         f"{BOUNCE_LOCAL_MAX_CHARS} characters (a token is added to it)")
    return address


def bounce_secrets(text: str) -> tuple[bytes, ...]:
    """Secrets separated by commas (or lines, in a file): the first signs, all verify."""
    secrets = tuple(part.strip() for part in re.split(r"[,\r\n]", text) if part.strip())
    if not secrets:
        raise ValueError("no secret given")
    for number, secret in enumerate(secrets, start=1):
        # Never echo a secret, not even a short one.
        if len(secret.encode()) < BOUNCE_SECRET_MIN_BYTES:
            raise ValueError(f"secret {number} is shorter than {BOUNCE_SECRET_MIN_BYTES} bytes")
    return tuple(secret.encode() for secret in secrets)


def listen(text: str) -> tuple[str, int]:
    """``host:port``, ``[v6]:port`` or ``:port`` (all interfaces)."""
    host, colon, port = text.strip().rpartition(":")
    if not colon:
        raise ValueError(f"expected host:port such as 127.0.0.1:2526, got {shown(text)}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not re.fullmatch(r"[A-Za-z0-9._:-]*", host):
        raise ValueError(f"expected host:port such as 127.0.0.1:2526, got {shown(text)}")
    return (host or "0.0.0.0", tcp_port(port))  # noqa: S104 - ":port" asks for every interface


def limit_or_off(text: str) -> int:
    value = whole_number(text, "3, or 0 for off")
    if value < 0:
        raise ValueError(f"must be 0 (off) or more, got {value}")
    return value




# postroom web: the console's sign-in and what it trusts.
WEB_TOKEN_MIN_CHARS = 16


def _one_line_secret(text: str, min_chars: int, what: str, example: str) -> Secret:
    """A file's one line (its line break dropped) of at least ``min_chars`` printable characters
    and no blank: a blank pasted with it, or a character a browser cannot send or UTF-8 cannot
    encode (a byte not in UTF-8 in the variable), would never match or sign."""
    value = text.rstrip("\r\n")
    if len(value) < min_chars or any(ch.isspace() for ch in value):
        raise ValueError(f"{what} needs at least {min_chars} characters and no blank "
                         f"(e.g. `{example}`)")
    if not value.isprintable():
        raise ValueError(f"{what} holds a character that is not printable (a control, a "
                         f"zero-width space, a byte not in UTF-8): use `{example}`")
    return Secret(value)


def web_token(text: str) -> Secret:
    """A console access token: at least WEB_TOKEN_MIN_CHARS printable characters, no blank."""
    return _one_line_secret(text, WEB_TOKEN_MIN_CHARS, "a token", "openssl rand -hex 24")


WEB_SESSION_KEY_MIN_CHARS = 32


def web_session_key(text: str) -> Secret:
    """The key that signs the console's session cookies: at least WEB_SESSION_KEY_MIN_CHARS
    printable characters, no blank."""
    return _one_line_secret(text, WEB_SESSION_KEY_MIN_CHARS, "a session key",
                            "openssl rand -hex 32")


def proxy_networks(text: str) -> tuple[str, ...]:
    """Comma-separated addresses or networks (``10.0.0.5,10.1.0.0/16,::1``), as written by
    ipaddress."""
    import ipaddress

    every_mapped_ipv4 = ipaddress.IPv6Network("::ffff:0:0/96")
    networks = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            network = ipaddress.ip_network(part, strict=False)
        except ValueError:
            raise ValueError(f"not an IP address or network: {shown(part)}") from None
        if network.prefixlen == 0 or (isinstance(network, ipaddress.IPv6Network)
                                      and network.supernet_of(every_mapped_ipv4)):
            raise ValueError(f"{shown(part)} trusts every address: anyone could sign in as anyone "
                             "with the header; name the proxies")
        networks.append(str(network))
    if not networks:
        raise ValueError("expected addresses such as 127.0.0.1 or 10.0.0.0/8")
    return tuple(networks)


def host_names(text: str) -> tuple[str, ...]:
    """Comma-separated host names (``console.example.com,*.example.com,127.0.0.1``), without a
    port, in lower case."""
    names = tuple(p.strip().lower() for p in text.split(",") if p.strip())
    for name in names:
        if not re.fullmatch(r"(\*\.)?[a-z0-9]([a-z0-9.-]*[a-z0-9])?|\[[0-9a-f:.]+\]", name):
            raise ValueError(f"not a host name (no port, no scheme): {shown(name)}")
    if not names:
        raise ValueError("expected host names such as console.example.com")
    return names


def address_list(text: str) -> frozenset[str]:
    """Comma-separated bare addresses, in lower case (as a proxy's header is compared)."""
    addresses = set()
    for part in (p.strip() for p in text.split(",")):
        if part:
            try:
                addresses.add(rules.check_address(part, what="address").lower())
            except InvalidContentError as exc:
                raise ValueError(str(exc)) from None
    return frozenset(addresses)


def trace_url(text: str) -> str:
    """An http(s) URL template holding ``{trace_id}``."""
    url = text.strip()
    if not re.fullmatch(r"https?://\S+", url) or "{trace_id}" not in url:
        raise ValueError("expected an http(s) URL with {trace_id} in it, such as "
                         "https://tempo.example.com/trace/{trace_id}")
    if url.replace("{trace_id}", "").count("{") or url.replace("{trace_id}", "").count("}"):
        raise ValueError("only {trace_id} may be in braces")
    return url
