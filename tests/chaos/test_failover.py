"""The failover suite: faults of a three-broker cluster's nodes while mail flows, checked as the
rest of the chaos suite is (tests/chaos/checks.py), with the longest pause in deliveries.

`make chaos-cluster` starts the cluster stack (.dev-cluster) and runs it; CHAOS_ONLY=text runs
the scenarios whose name holds that text (text|other: either), FAILOVER_PROTOCOLS=classic,
kip848,... the consumer group settings to run them under (failover.PROTOCOLS; default:
postroom's own, classic), and FAILOVER_REPEAT=n each n times. The table goes to the log dir's failover.md.
"""

from __future__ import annotations

import os
import random

import pytest

from chaos.failover import BROKERS, FAILOVER, PROTOCOLS, failover_table, with_protocol
from chaos.test_chaos import assert_clean, run_all
from postroom.kafka import make_admin
from postroom.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.chaos, pytest.mark.failover]


def require_cluster(settings: Settings) -> None:
    """Fail, never skip, unless the stack is the cluster: its faults need three brokers, and on
    the default stack they would find none of its nodes."""
    if os.environ.get("POSTROOM_DEV_BROKERS") != str(BROKERS):
        pytest.fail(f"the failover suite runs on a {BROKERS}-broker cluster: `make chaos-cluster` "
                    f"(or . .dev-cluster/env after `make services-cluster`)")
    brokers = make_admin(settings).list_topics(timeout=30).brokers
    assert len(brokers) == BROKERS, f"the cluster answers with brokers {sorted(brokers)}"


@pytest.mark.timeout(7200)
def test_failover(stack_settings: Settings) -> None:
    require_cluster(stack_settings)
    seed = int(os.environ.get("CHAOS_SEED") or random.SystemRandom().randrange(1 << 31))
    only = os.environ.get("CHAOS_ONLY", "").split("|")
    names = os.environ.get("FAILOVER_PROTOCOLS", "classic").split(",")
    unknown = [n for n in names if n not in PROTOCOLS]
    assert not unknown, f"FAILOVER_PROTOCOLS names {unknown}; known: {sorted(PROTOCOLS)}"
    repeat = int(os.environ.get("FAILOVER_REPEAT", "1"))
    chosen = [s for _ in range(repeat) for name in names
              for s in with_protocol(FAILOVER, PROTOCOLS[name]) if any(o in s.name for o in only)]
    assert chosen, f"CHAOS_ONLY={only!r} names no scenario"
    assert_clean(run_all(stack_settings, chosen, seed, failover_table, "failover.md"))
