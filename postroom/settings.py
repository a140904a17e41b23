"""postroom's configuration: read once from ``POSTROOM_*`` environment variables and passed down.

Each setting is declared once, as a field of :class:`Settings` made by ``setting()`` (by group, in
``settings_fields.py``); parsing, the repr's masking and README's table (``python -m
postroom.settings --markdown``) follow from it.
Nothing else reads ``os.environ``. A table of our own, not pydantic-settings: a model of this size
imports in ~0.35 s against ~0.13 s here (every CLI call pays it), pydantic_core is a 5 MB compiled
dependency, and a frozen pydantic model does not take ``dataclasses.replace``.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from postroom import rules
from postroom.errors import ConfigError
from postroom.settings_declare import (
    ENV_PREFIX,
    declarations,
    from_file,
    parsed,
)
from postroom.settings_declare import markdown_table as settings_table
from postroom.settings_fields import (
    BounceSettings,
    ConsoleSettings,
    EmailSettings,
    RelaySettings,
    SenderSettings,
    ServiceSettings,
)
from postroom.settings_kafka import (
    is_secret_key,
    mask_kafka_config,
    mask_registry_config,
    mask_url,
    mask_urls,
    parse_kafka_config,
)
from postroom.settings_values import (
    BOUNCE_LOCAL_MAX_CHARS,
    BOUNCE_SECRET_MIN_BYTES,
    LONGEST_PERIOD_S,
    Secret,
    TlsMode,
    parse_duration_s,
    parse_durations_s,
    parse_period_s,
)

__all__ = ["BOUNCE_LOCAL_MAX_CHARS", "BOUNCE_SECRET_MIN_BYTES", "ENV_PREFIX", "FIELDS",
           "LONGEST_PERIOD_S", "PRODUCER_MESSAGE_TIMEOUT_MS", "REGISTRY_TIMEOUT_S", "Secret",
           "Settings", "TlsMode", "default_group", "env_name", "env_size_limits", "is_secret_key",
           "markdown_table",
           "mask_kafka_config", "mask_registry_config", "mask_url", "mask_urls", "parse_duration_s",
           "parse_durations_s", "parse_kafka_config", "parse_period_s"]

# How long a producer keeps trying to deliver one record (librdkafka's message.timeout.ms). A relay
# claim must outlast it, so a live relay's claim never runs out while its records still wait. (A
# claim whose relay's session ended is free at once: after a failed round the relay waits for its
# records before it closes that session, but a session cut under it, or ended by the server's
# keepalive, may free rows whose records are still on their way; the ledger sends a row
# published twice once.)
PRODUCER_MESSAGE_TIMEOUT_MS = 30_000
# How long one Schema Registry request may wait for an answer (the client's ``timeout``); the
# client then retries it (``max.retries``, 3 by default) before postroom reports the registry down.
REGISTRY_TIMEOUT_S = 10


@dataclasses.dataclass(frozen=True, repr=False)
class Settings(ConsoleSettings, BounceSettings, SenderSettings, RelaySettings, EmailSettings,
               ServiceSettings):
    """Every setting postroom reads, each declared once (postroom/settings_fields.py, by group;
    the fields in that module's order). Build with :meth:`from_env`."""

    # The consumer groups derived from the prefix, as (field, value): not a setting. Kept so that
    # dataclasses.replace(settings, topic_prefix=...) derives them again for the new prefix, while
    # a group given explicitly stays; the names themselves stay plain str (librdkafka's admin
    # calls fail on a str subclass).
    derived_groups: frozenset[tuple[str, str]] = dataclasses.field(default=frozenset(),
                                                                   compare=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Parse every ``POSTROOM_*`` variable; a malformed one raises ConfigError naming it."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for field, declared in declarations(Settings):
            raw = env.get(declared.env)
            if raw:
                values[field] = parsed(declared.env, declared.parse, raw)
            path = env.get(declared.file.env) if declared.file else None
            if declared.file is not None and path:
                values[field] = from_file(declared, path, values.get(field))
        return cls(**values)

    def __post_init__(self) -> None:
        derived = set()
        for field, role in (("sender_group", "sender"), ("recorder_group", "recorder")):
            group = getattr(self, field)
            # A derived group is derived again: dataclasses.replace(settings, topic_prefix=...)
            # hands the old prefix's group back, and it must follow the new prefix.
            if not group or (field, group) in self.derived_groups:
                group = default_group(self.topic_prefix, role)
                object.__setattr__(self, field, group)
                derived.add((field, group))
        object.__setattr__(self, "derived_groups", frozenset(derived))
        if self.relay_claim_ttl_s * 1000 <= PRODUCER_MESSAGE_TIMEOUT_MS:
            raise ConfigError(env_name("relay_claim_ttl_s"),
                              f"must be longer than the producer's message timeout "
                              f"({PRODUCER_MESSAGE_TIMEOUT_MS / 1000:g}s), got "
                              f"{self.relay_claim_ttl_s:g}s")
        if self.bounce_address is not None and not self.bounce_secrets:
            # Named by the variable that was set: it is the one that cannot work alone.
            raise ConfigError(env_name("bounce_address"),
                              "needs POSTROOM_BOUNCE_SECRET or POSTROOM_BOUNCE_SECRET_FILE "
                              "to sign the return paths")

    def __repr__(self) -> str:
        shown = []
        for field, declared in declarations(Settings):
            value = getattr(self, field)
            if declared.mask is not None and value:
                value = declared.mask(value)
            shown.append(f"{field}={value!r}")
        return f"Settings({', '.join(shown)})"

    __str__ = __repr__

    def require(self, field: str) -> Any:
        """The value of ``field``, or ConfigError naming its env var when it is unset."""
        value = getattr(self, field)
        if value is None:
            raise ConfigError(env_name(field), "is not set")
        return value

    def check_attachments_root(self) -> None:
        """ConfigError unless POSTROOM_ATTACHMENTS_ROOT, when set, names a directory."""
        if self.attachments_root is not None and not self.attachments_root.is_dir():
            raise ConfigError(env_name("attachments_root"),
                              f"not a directory: {self.attachments_root}")

    def size_limits(self) -> rules.SizeLimits:
        """The caps on an email's parts, as enqueue and the sender apply them."""
        return rules.SizeLimits(
            body_max_bytes=self.body_max_bytes, attachment_max_bytes=self.attachment_max_bytes,
            attachments_total_max_bytes=self.attachments_total_max_bytes,
            event_max_bytes=self.event_max_bytes)

    def kafka_client_config(self) -> dict[str, str]:
        """librdkafka settings common to every client: bootstrap servers plus the extras."""
        bootstrap = self.require("kafka_bootstrap_servers")
        return {"bootstrap.servers": bootstrap, **self.kafka_config}

    def registry_client_config(self) -> dict[str, str | float]:
        """confluent-kafka SchemaRegistryClient settings: the url plus the extras. A request
        that gets no answer gives up after REGISTRY_TIMEOUT_S unless the extras say otherwise
        (the client's own default waits for ever), and the client retries it."""
        url = self.require("schema_registry_url")
        return {"timeout": REGISTRY_TIMEOUT_S, **self.schema_registry_config, "url": url}


def markdown_table() -> str:
    """README's settings table, generated from the declarations (``--markdown`` prints it)."""
    return settings_table(Settings)


def default_group(prefix: str, role: str) -> str:
    """The consumer group of ``role`` ("sender", "recorder") when its setting is unset:
    ``postroom.sender`` under the default prefix, ``staging.sender`` under ``staging.``."""
    return f"{prefix}{role}"


# Every variable (beside the *_FILE ones) -> (field, parser), derived from the declarations.
FIELDS: dict[str, tuple[str, Callable[[str], Any]]] = {
    declared.env: (field, declared.parse) for field, declared in declarations(Settings)}


def env_name(field: str) -> str:
    """The environment variable that sets ``field``."""
    for name, (known, _) in FIELDS.items():
        if known == field:
            return name
    raise KeyError(field)


# The variables of the caps enqueue applies in a job's process (SizeLimits' fields).
SIZE_LIMIT_VARIABLES = tuple(env_name(f.name) for f in dataclasses.fields(rules.SizeLimits))


def env_size_limits(env: Mapping[str, str] | None = None) -> rules.SizeLimits:
    """The caps on an email's parts from the environment's POSTROOM_*_MAX_BYTES alone, as
    Settings.size_limits() gives them: what enqueue applies when its caller passes no limits, so
    a job given the roles' caps refuses what the sender would. The job needs none of the other
    settings. A malformed one raises ConfigError naming it. Read at each call (four lookups);
    parsed once per set of values."""
    env = os.environ if env is None else env
    return _size_limits(tuple(env.get(name) or None for name in SIZE_LIMIT_VARIABLES))


@functools.lru_cache(maxsize=16)
def _size_limits(raw: tuple[str | None, ...]) -> rules.SizeLimits:
    given = {name: value for name, value in zip(SIZE_LIMIT_VARIABLES, raw, strict=True) if value}
    return Settings.from_env(given).size_limits()


if __name__ == "__main__":
    if sys.argv[1:] != ["--markdown"]:
        sys.exit("usage: python -m postroom.settings --markdown")
    sys.stdout.write(markdown_table())
