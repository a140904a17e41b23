"""postroom's ACLs as the broker's bindings, and the filter matching each one alone (what the
tests delete ACLs with). Pure: no client is created."""

from __future__ import annotations

from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
)

from postroom.acls import Acl, Operation, Pattern, Resource, Role
from postroom.kafka import acl_binding

READ_PREFIXED = Acl(Role.SENDER, "User:postroom-sender", Operation.READ, Resource.TOPIC, "p.email.",
                    Pattern.PREFIXED)


def test_an_acl_is_the_brokers_allow_binding_for_any_host() -> None:
    binding = acl_binding(READ_PREFIXED)
    assert type(binding) is AclBinding
    assert (binding.restype, binding.name, binding.resource_pattern_type, binding.principal,
            binding.host, binding.operation, binding.permission_type) == (
        ResourceType.TOPIC, "p.email.", ResourcePatternType.PREFIXED, "User:postroom-sender",
        "*", AclOperation.READ, AclPermissionType.ALLOW)


def test_its_filter_matches_exactly_that_binding() -> None:
    matching = acl_binding(READ_PREFIXED, as_filter=True)
    assert type(matching) is AclBindingFilter
    fields = ("restype", "name", "resource_pattern_type", "principal", "host", "operation",
              "permission_type")
    assert [getattr(matching, f) for f in fields] == [
        getattr(acl_binding(READ_PREFIXED), f) for f in fields]
