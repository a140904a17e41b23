"""What a failed writer-schema lookup means: a schema the registry says it lacks is unreadable
(poison); any other failure is the registry not answering now (the record waits)."""

from __future__ import annotations

from typing import Any

import pytest

from postroom.schemas.codec import load_schema
from postroom.schemas.errors import SchemaError, SchemaUnavailableError
from postroom.schemas.registry import Registry, RegistryError
from postroom.settings import Settings

SETTINGS = Settings.from_env({"POSTROOM_SCHEMA_REGISTRY_URL": "http://registry.invalid:8080"})


class _Found:
    def __init__(self, text: str, schema_type: str | None = "AVRO") -> None:
        self.schema_str = text
        self.schema_type = schema_type


def registry_answering(answer: Any) -> Registry:
    registry = Registry(SETTINGS)

    def call(what: str, method: str, *args: Any) -> Any:
        assert method == "get_schema"
        if isinstance(answer, Exception):
            raise answer
        return answer
    registry._call = call  # type: ignore[method-assign]
    return registry


@pytest.mark.parametrize(("answer", "raised", "message"), [
    (RegistryError("schema id 7: not found (HTTP 404, code 40403)", status=404, code=40403),
     SchemaError, "has no schema id 7"),
    # A 404 without the registry's own code is a proxy's page in front of a registry that is
    # not there yet (confluent-kafka gives it code -1): the registry has said nothing, so wait.
    (RegistryError("not found", status=404, code=None), SchemaUnavailableError, "not found"),
    (RegistryError("schema id 7: <html> (HTTP 404, code -1)", status=404, code=-1),
     SchemaUnavailableError, "HTTP 404"),
    (RegistryError("no answer from the schema registry at http://registry.invalid:8080: "
                   "ConnectError: refused"), SchemaUnavailableError, "ConnectError"),
    (RegistryError("schema id 7: internal (HTTP 500, code 50001)", status=500, code=50001),
     SchemaUnavailableError, "HTTP 500"),
    (RegistryError("schema id 7: unauthorized (HTTP 401, code 40101)", status=401, code=40101),
     SchemaUnavailableError, "HTTP 401"),
    (_Found('{"type": "record", "name": "X", "fields": [{"name": "a", "type": "nope"}]}'),
     SchemaError, "invalid Avro schema"),
    (_Found("syntax = 'proto3';", "PROTOBUF"), SchemaError, "not Avro"),
])
def test_a_failed_lookup_is_poison_only_when_the_registry_says_so(
        answer: Any, raised: type[SchemaError], message: str) -> None:
    with pytest.raises(SchemaError, match=message) as caught:
        registry_answering(answer).schema_by_id(7)
    assert type(caught.value) is raised


def test_a_found_schema_is_kept() -> None:
    registry = registry_answering(_Found(load_schema("email_requested").text))
    first = registry.schema_by_id(7)
    registry._call = None  # type: ignore[assignment]  # not asked again
    assert registry.schema_by_id(7) is first
    assert first.fingerprint == load_schema("email_requested").fingerprint
