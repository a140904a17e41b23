"""The lag of postroom's consumer groups: read from the broker (reader; when a retry record is due
in due), held as values (report), rendered for `postroom lag` (render) and set as metrics under
kafka-lag-exporter's names (exporter). The arithmetic and the verdicts are in postroom/lagrules.py.
"""

from __future__ import annotations

from postroom.lag.exporter import export, watch
from postroom.lag.reader import (
    MIN_REQUEST_S,
    OFFSETS_RETRY_S,
    ONE_SHOT_INTERVAL_S,
    ONE_SHOT_SAMPLES,
    READ_TIMEOUT_S,
    LagReader,
    postroom_groups,
    read_report,
)
from postroom.lag.render import render_json, render_text
from postroom.lag.report import GroupReport, LagReport, Member, OutboxBacklog, PartitionReport

__all__ = [
    "MIN_REQUEST_S",
    "OFFSETS_RETRY_S",
    "ONE_SHOT_INTERVAL_S",
    "ONE_SHOT_SAMPLES",
    "READ_TIMEOUT_S",
    "GroupReport",
    "LagReader",
    "LagReport",
    "Member",
    "OutboxBacklog",
    "PartitionReport",
    "export",
    "postroom_groups",
    "read_report",
    "render_json",
    "render_text",
    "watch",
]
