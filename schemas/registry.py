"""Talks to the Schema Registry (Confluent's REST API, through confluent-kafka's client): registers
the contract under each topic's subject, gives writers their schema ids and readers the writer
schemas of ids they meet. Lazy: no request before the first call.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from postroom.errors import PostroomError
from postroom.schemas.codec import Schema, load_schema, parse_schema_text
from postroom.schemas.compatibility import COMPATIBILITY_LEVELS, DEFAULT_COMPATIBILITY
from postroom.schemas.errors import SchemaError, SchemaUnavailableError
from postroom.schemas.framing import SCHEMALESS, Framing, SchemaById
from postroom.settings import Settings, mask_registry_config, mask_url, mask_urls
from postroom.topics import topic_schemas, value_subject

log = logging.getLogger(__name__)

CONTRACT = ("email_requested", "email_result")  # schemas/<name>.avsc
# Confluent's error codes for "subject not found" and "schema/version not found".
_NOT_FOUND_CODES = (40401, 40402, 40403)


def _client_package() -> Any:
    """confluent-kafka's schema_registry package, imported on first use: the import takes about
    0.3 s, which every CLI command would pay otherwise."""
    import confluent_kafka.schema_registry as package

    return package


def _avro(text: str) -> Any:
    return _client_package().Schema(text, "AVRO")


class RegistryError(PostroomError):
    """The Schema Registry refused a request or could not be reached."""

    def __init__(self, message: str, *, status: int | None = None,
                 code: int | None = None) -> None:
        self.status = status
        self.code = code
        super().__init__(message)


@dataclasses.dataclass(frozen=True)
class Registered:
    """What ``register`` did for one subject."""

    subject: str
    schema_name: str
    schema_id: int
    version: int
    new: bool  # False: this schema was already the subject's version ``version``


class Registry:
    """The registry at POSTROOM_SCHEMA_REGISTRY_URL; every method may raise RegistryError."""

    def __init__(self, settings: Settings) -> None:
        self._config = settings.registry_client_config()
        self._url = mask_url(settings.require("schema_registry_url"))
        self._client: Any = None  # confluent_kafka.schema_registry.SchemaRegistryClient
        self._by_id: dict[int, Schema] = {}
        self._lock = threading.RLock()

    @property
    def url(self) -> str:
        return self._url

    @contextlib.contextmanager
    def _session(self) -> Iterator[None]:
        """One HTTP client for the calls inside, closed after them. A process asks the registry
        at start and rarely after (writer schemas are kept), so no connection is left open."""
        with self._lock:
            if self._client is not None:
                yield
                return
            log.debug("schema registry client config %s", mask_registry_config(self._config))
            try:
                self._client = _client_package().SchemaRegistryClient(dict(self._config))
            except ValueError as exc:
                raise RegistryError(f"POSTROOM_SCHEMA_REGISTRY_CONFIG: {exc}") from exc
            try:
                yield
            finally:
                client, self._client = self._client, None
                client.close()

    def _call(self, what: str, method: str, *args: Any) -> Any:
        """``SchemaRegistryClient.<method>(*args)``, its failures translated to RegistryError
        with the registry's own message."""
        package = _client_package()
        try:
            with self._session():
                return getattr(self._client, method)(*args)
        except package.SchemaRegistryError as exc:
            raise RegistryError(f"{what}: {exc.error_message} (HTTP {exc.http_status_code}, "
                                f"code {exc.error_code})", status=exc.http_status_code,
                                code=exc.error_code) from exc
        except RegistryError:
            raise
        # The client raises its HTTP library's transport errors (not re-exported) and ValueError
        # for a bad setting: any of them means the request did not get an answer.
        except Exception as exc:
            # Its text may name the URL as written, credentials and all.
            raise RegistryError(f"{what}: no answer from the schema registry at {self._url}: "
                                f"{type(exc).__name__}: {mask_urls(str(exc))}") from exc

    def subjects(self) -> list[str]:
        return list(self._call("cannot list subjects", "get_subjects"))

    def schema_ids(self, schemas_by_topic: Mapping[str, str]) -> dict[str, int]:
        """topic -> the id of today's contract schema under the topic's subject; a subject
        without it is an error that says to run ``postroom schemas register``."""
        with self._session():
            return self._schema_ids_in_session(schemas_by_topic)

    def _schema_ids_in_session(self, schemas_by_topic: Mapping[str, str]) -> dict[str, int]:
        ids = {}
        for topic, name in schemas_by_topic.items():
            subject = value_subject(topic)
            schema = load_schema(name)
            try:
                found = self._call(f"subject {subject}", "lookup_schema", subject,
                                   _avro(schema.text))
            except RegistryError as exc:
                if exc.code in _NOT_FOUND_CODES:
                    raise RegistryError(f"{schema.name} is not registered under subject {subject} "
                                        f"at {self._url}; run `postroom schemas register`",
                                        status=exc.status, code=exc.code) from exc
                raise
            ids[topic] = int(found.schema_id)
            with self._lock:
                self._by_id.setdefault(ids[topic], schema)
        return ids

    def schema_by_id(self, schema_id: int) -> Schema:
        """The writer schema with registry id ``schema_id`` (fetched once, then kept).

        SchemaError when the registry says it has no such id (HTTP 404 with its error code
        40401-40403) or gives a schema that
        is not Avro: the record is unreadable. SchemaUnavailableError for any other failure (no
        answer, a server error, a refused login): the record waits until the registry answers.
        """
        with self._lock:
            known = self._by_id.get(schema_id)
        if known is not None:
            return known
        try:
            found = self._call(f"schema id {schema_id}", "get_schema", schema_id)
        except RegistryError as exc:
            # Only the registry's own word: an ingress or proxy in front of a registry that
            # restarts answers a bare 404 too (confluent-kafka gives it code -1).
            if exc.code in _NOT_FOUND_CODES:
                raise SchemaError(f"the schema registry has no schema id {schema_id}") from exc
            raise SchemaUnavailableError(str(exc)) from exc
        if (found.schema_type or "AVRO") != "AVRO":
            raise SchemaError(f"schema id {schema_id} is a {found.schema_type} schema, not Avro")
        schema = parse_schema_text(found.schema_str, f"registry schema id {schema_id}")
        with self._lock:
            self._by_id[schema_id] = schema
        return schema

    def preload(self, subjects: list[str]) -> int:
        """Fetch every version of ``subjects`` now, so records written with any of them decode
        without asking the registry later; returns how many schemas are known."""
        with self._session():
            return self._preload_in_session(subjects)

    def _preload_in_session(self, subjects: list[str]) -> int:
        existing = set(self.subjects())
        for subject in subjects:
            if subject not in existing:
                continue
            for version in self._call(f"subject {subject}", "get_versions", subject):
                found = self._call(f"subject {subject} version {version}", "get_version",
                                   subject, version)
                with self._lock:
                    known = int(found.schema_id) in self._by_id
                if not known:
                    schema = parse_schema_text(found.schema.schema_str, f"{subject} version {version}")
                    with self._lock:
                        self._by_id[int(found.schema_id)] = schema
        with self._lock:
            return len(self._by_id)

    def compatibility(self, subject: str) -> str | None:
        """The subject's own compatibility level, or None when it has none of its own."""
        try:
            return str(self._call(f"subject {subject}", "get_compatibility", subject))
        except RegistryError as exc:
            if exc.status == 404:
                return None
            raise

    def register(self, schemas_by_topic: Mapping[str, Schema],
                 compatibility: str = DEFAULT_COMPATIBILITY) -> list[Registered]:
        """Set each topic's subject to ``compatibility`` and register its schema under it.
        Idempotent: a schema already registered keeps its id and version. A schema the rule
        rejects raises RegistryError carrying the registry's own message."""
        with self._session():
            return self._register_in_session(schemas_by_topic, compatibility)

    def _register_in_session(self, schemas_by_topic: Mapping[str, Schema],
                            compatibility: str) -> list[Registered]:
        if compatibility not in COMPATIBILITY_LEVELS:
            raise RegistryError(f"unknown compatibility level {compatibility!r} "
                                f"(expected one of {', '.join(COMPATIBILITY_LEVELS)})")
        done = []
        for topic, schema in schemas_by_topic.items():
            subject = value_subject(topic)
            wire = _avro(schema.text)
            if self.compatibility(subject) != compatibility:
                self._call(f"cannot set the compatibility of {subject}", "set_compatibility",
                           subject, compatibility)
            try:
                before = self._call(f"subject {subject}", "lookup_schema", subject, wire)
            except RegistryError as exc:
                if exc.code not in _NOT_FOUND_CODES:
                    raise
                before = None
            if before is None:
                self._call(f"the registry refused {schema.name} under {subject}",
                           "register_schema", subject, wire)
            found = self._call(f"subject {subject}", "lookup_schema", subject, wire)
            done.append(Registered(subject, schema.name.removesuffix(".avsc"), int(found.schema_id),
                                   int(found.version), new=before is None))
        return done


def framing_for(settings: Settings, registry: Registry | None = None) -> Framing:
    """How this process writes records: schemaless without a registry, else the Confluent wire
    format with the ids registered for every topic (RegistryError when one is missing)."""
    if settings.schema_registry_url is None:
        return SCHEMALESS
    registry = registry or Registry(settings)
    ids = registry.schema_ids(topic_schemas(settings.topic_prefix, len(settings.retry_delays_s)))
    log.info("writing the Confluent wire format; schema ids from %s: %s", registry.url,
             ", ".join(f"{topic}={schema_id}" for topic, schema_id in ids.items()))
    return Framing(ids)


def schema_lookup(settings: Settings) -> SchemaById | None:
    """The way to a Confluent-framed record's writer schema for a reader that meets few records
    (the redrive, `postroom lag`): None without a registry; else the registry's lookup, each
    schema fetched when a record first names its id."""
    if settings.schema_registry_url is None:
        return None
    return Registry(settings).schema_by_id


def reader_for(settings: Settings, topics: list[str],
               registry: Registry | None = None) -> SchemaById | None:
    """How this process finds the writer schema of a Confluent-framed record read from
    ``topics``: None without a registry; else the registry's lookup, every version of the
    topics' subjects fetched up front."""
    if settings.schema_registry_url is None:
        return None
    registry = registry or Registry(settings)
    known = registry.preload([value_subject(topic) for topic in topics])
    log.info("reading both framings; %d writer schemas preloaded from %s", known, registry.url)
    return registry.schema_by_id


def contract_schemas(schema_dir: Path | None = None) -> dict[str, Schema]:
    """The contract's schemas by name: this version's, or the .avsc files in ``schema_dir``
    (a contract prepared for the next release, say); SchemaError for a missing or bad file."""
    if schema_dir is None:
        return {name: load_schema(name) for name in CONTRACT}
    found = {}
    for name in CONTRACT:
        path = schema_dir / f"{name}.avsc"
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise SchemaError(f"cannot read {path}: {exc}") from exc
        # errors name the file; the schema is named as the package's
        found[name] = dataclasses.replace(parse_schema_text(text, str(path)), name=f"{name}.avsc")
    return found


def register_contract(settings: Settings, compatibility: str = DEFAULT_COMPATIBILITY, *,
                      schema_dir: Path | None = None,
                      registry: Registry | None = None) -> list[Registered]:
    """``postroom schemas register``: the contract under every topic's subject (idempotent)."""
    registry = registry or Registry(settings)
    schemas = contract_schemas(schema_dir)
    topics = topic_schemas(settings.topic_prefix, len(settings.retry_delays_s))
    return registry.register({topic: schemas[name] for topic, name in topics.items()},
                             compatibility)


def check_registry(settings: Settings, registry: Registry | None = None) -> str:
    """What ``postroom check`` says of the registry: none configured, or every topic's subject
    holds today's contract (RegistryError naming the first that does not)."""
    if settings.schema_registry_url is None:
        return "none configured (POSTROOM_SCHEMA_REGISTRY_URL): records are schemaless Avro"
    registry = registry or Registry(settings)
    topics = topic_schemas(settings.topic_prefix, len(settings.retry_delays_s))
    ids = registry.schema_ids(topics)
    levels = sorted({registry.compatibility(value_subject(t)) or "registry default"
                     for t in topics})
    return (f"{registry.url}: all {len(ids)} subjects hold today's contract "
            f"(compatibility {', '.join(levels)})")
