"""postroom's ACLs as the broker's bindings, and created where the broker lacks them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from confluent_kafka import KafkaException

from postroom.acls import Acl, Pattern, Resource
from postroom.kafka.clients import make_admin
from postroom.kafka.errors import translate
from postroom.kafka.probe import check_reachable
from postroom.settings import Settings


def acl_binding(acl: Acl, *, as_filter: bool = False) -> Any:
    """The broker's binding for ``acl``; with ``as_filter``, the filter matching only it (to
    describe or delete it)."""
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        AclBinding,
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    kinds = {Resource.TOPIC: ResourceType.TOPIC, Resource.GROUP: ResourceType.GROUP,
             Resource.CLUSTER: ResourceType.BROKER}
    patterns = {Pattern.LITERAL: ResourcePatternType.LITERAL,
                Pattern.PREFIXED: ResourcePatternType.PREFIXED}
    kind = AclBindingFilter if as_filter else AclBinding
    return kind(kinds[acl.resource], acl.name, patterns[acl.pattern], acl.principal, "*",
                AclOperation[acl.operation.name], AclPermissionType.ALLOW)


def _binding_key(binding: Any) -> tuple[str, ...]:
    return tuple(str(getattr(binding, field)) for field in (
        "restype", "name", "resource_pattern_type", "principal", "host", "operation",
        "permission_type"))


def apply_acls(settings: Settings, acls: Sequence[Acl],
               timeout_s: float = 30.0) -> list[tuple[Acl, str]]:
    """Create each ACL the broker does not hold yet; return ``(acl, "created" | "exists")``.

    The principal needs ALTER and DESCRIBE on the cluster.
    """
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    check_reachable(settings)
    admin = make_admin(settings)
    # None matches any name, principal and host (the stubs say str).
    everything = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY,  # type: ignore[arg-type]
                                  None, None, AclOperation.ANY, AclPermissionType.ALLOW)  # type: ignore[arg-type]
    try:
        held = {_binding_key(b) for b in admin.describe_acls(
            everything, request_timeout=timeout_s).result()}
    except KafkaException as exc:
        raise translate(exc, "cannot read the broker's ACLs (needs DESCRIBE on the cluster)") from exc
    bindings = {acl: acl_binding(acl) for acl in acls}
    missing = [b for b in bindings.values() if _binding_key(b) not in held]
    if missing:
        for binding, future in admin.create_acls(missing, request_timeout=timeout_s).items():
            try:
                future.result()
            except KafkaException as exc:
                raise translate(exc, f"cannot create ACL {binding} "
                                     "(needs ALTER on the cluster)") from exc
    created = {_binding_key(b) for b in missing}
    return [(acl, "created" if _binding_key(b) in created else "exists")
            for acl, b in bindings.items()]
