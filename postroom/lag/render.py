"""The lag report for `postroom lag`: lines for a person, or one JSON object a line."""

from __future__ import annotations

import json
from collections.abc import Mapping

from postroom.lag.report import GroupReport, LagReport, Member


def render_text(report: LagReport, roles: Mapping[str, str] | None = None) -> list[str]:
    """The report for a person; ``roles`` names the role of each group (its members)."""
    lines = []
    for group in report.groups:
        role = (roles or {}).get(group.group, "consumer of this group")
        members = ", ".join(_member(m, group.members) for m in group.members) \
            or f"none (no {role} is running)"
        if not group.members_known:
            members = "unknown"
        partial = (f" (PARTIAL: {group.unavailable} of {len(group.partitions)} partitions "
                   "unavailable, not counted)" if group.unavailable else "")
        lines.append(f"{group.group}: {_group_verdict(group)}, state {group.state}, "
                     f"members {members}; total lag {group.sum_lag}, "
                     f"max {group.max_lag_seconds:.1f}s behind{partial}")
        if group.idle:
            lines.append(f"  WARN {len(group.idle)} of {len(group.members)} members own no "
                         "partition and stand by: the group has more members than its topics "
                         "have partitions (POSTROOM_TOPIC_PARTITIONS)")
        said = None
        for p in group.partitions:
            if p.unavailable is not None:
                # One reason for many partitions (the coordinator's) is said once.
                why = " (as above)" if p.unavailable == said else f": {p.unavailable}"
                lines.append(f"  {p.topic}[{p.partition}] UNAVAILABLE{why}")
                said = p.unavailable
                continue
            committed = "-" if p.committed is None else str(p.committed)
            line = f"  {p.topic}[{p.partition}] committed={committed} end={p.end} lag={p.lag}"
            if p.tier is not None:
                line += f" waiting={p.lag} overdue={_known(p.overdue)}"
                if p.overdue and p.overdue_seconds is not None:
                    line += f" ({p.overdue_seconds:.1f}s late)"
            else:
                behind = "unknown" if p.lag_seconds is None else f"{p.lag_seconds:.1f}s"
                line += f" behind={behind}"
            lines.append(line + f" {p.verdict.name}")
    lines.extend(_replication_lines(report))
    if report.outbox is not None:
        age = report.outbox.oldest_age_s
        lines.append(f"outbox: {report.outbox.rows} row(s) waiting for the relay"
                     + (f", oldest {age:.1f}s" if age is not None else ""))
    return lines


def _member(member: Member, members: tuple[Member, ...]) -> str:
    """A member as `lag` lists it: its client id (postroom's names the host and process) at its
    address, and the broker's member id when another member has the same client id."""
    name = f"{member.client_id}@{member.host.lstrip('/')}"
    if member.member_id and sum(m.client_id == member.client_id for m in members) > 1:
        name += f" [member {member.member_id[-12:]}]"
    return f"{name} ({member.partitions} partitions{', IDLE' if member.partitions == 0 else ''})"


def _known(value: int | None) -> str:
    return "unknown" if value is None else str(value)


def _group_verdict(group: GroupReport) -> str:
    """The group's verdict; UNKNOWN when none of its partitions was read."""
    return group.verdict.name if group.known else "UNKNOWN"


def _replication_lines(report: LagReport) -> list[str]:
    """A line per topic with partitions offline, under-replicated or below min.insync.replicas."""
    if report.replication is None:
        return ["replication: UNKNOWN (the cluster's metadata could not be read)"]
    return [f"replication: {topic}: {h.offline} offline, {h.under_replicated} under-replicated, "
            f"{h.below_min_isr} below min.insync.replicas (of {h.partitions} partitions; "
            "`postroom check` names them)"
            for topic, h in report.replication.items()
            if h.offline or h.under_replicated or h.below_min_isr]


def render_json(report: LagReport) -> list[str]:
    lines = [json.dumps({**p.as_json(), "group_state": g.state,
                         "group_members": len(g.members) if g.members_known else None,
                         "group_idle_members": len(g.idle) if g.members_known else None,
                         "group_verdict": _group_verdict(g)})
             for g in report.groups for p in g.partitions]
    # Only topics with a problem (or none read): a healthy cluster adds no line.
    replication = report.replication
    if replication is None:
        lines.append(json.dumps({"replication": None}))
    else:
        lines.extend(json.dumps({"replication": topic, "partitions": h.partitions,
                                 "offline": h.offline, "under_replicated": h.under_replicated,
                                 "below_min_insync_replicas": h.below_min_isr})
                     for topic, h in replication.items()
                     if h.offline or h.under_replicated or h.below_min_isr)
    if report.outbox is not None:
        lines.append(json.dumps({"outbox_backlog": report.outbox.rows,
                                 "outbox_oldest_age_seconds": report.outbox.oldest_age_s}))
    return lines
