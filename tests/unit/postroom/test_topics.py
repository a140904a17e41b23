"""Tables for topic naming: names from a prefix, and the inverses back to priority and tier."""

from __future__ import annotations

import pytest

from postroom.topics import (
    Priority,
    all_topics,
    dead_letter_topic,
    priority_of_topic,
    priority_topic,
    results_topic,
    retry_topic,
    sender_topics,
    tier_of_retry_topic,
)

PREFIXES = ["postroom.", "", "t3f9a.", "staging-eu_1."]


@pytest.mark.parametrize(("text", "expected"), [
    ("high", Priority.HIGH),
    ("normal", Priority.NORMAL),
    ("low", Priority.LOW),
    ("HIGH", Priority.HIGH),
    ("  Low\n", Priority.LOW),
])
def test_priority_parse(text: str, expected: Priority) -> None:
    assert Priority.parse(text) is expected


@pytest.mark.parametrize("text", ["", "urgent", "hi", "high low", "0"])
def test_priority_parse_rejects(text: str) -> None:
    with pytest.raises(ValueError, match=r"unknown priority .*expected one of: high, normal, low"):
        Priority.parse(text)


@pytest.mark.parametrize(("prefix", "priority", "expected"), [
    ("postroom.", Priority.HIGH, "postroom.email.high"),
    ("postroom.", Priority.NORMAL, "postroom.email.normal"),
    ("postroom.", "low", "postroom.email.low"),
    ("", Priority.LOW, "email.low"),
    ("t1.", "high", "t1.email.high"),
])
def test_priority_topic(prefix: str, priority: Priority | str, expected: str) -> None:
    assert priority_topic(prefix, priority) == expected


def test_priority_topic_rejects_unknown_priority() -> None:
    with pytest.raises(ValueError, match="urgent"):
        priority_topic("postroom.", "urgent")


@pytest.mark.parametrize(("prefix", "tier", "expected"), [
    ("postroom.", 1, "postroom.email.retry.1"),
    ("postroom.", 4, "postroom.email.retry.4"),
    ("postroom.", 12, "postroom.email.retry.12"),
    ("", 2, "email.retry.2"),
])
def test_retry_topic(prefix: str, tier: int, expected: str) -> None:
    assert retry_topic(prefix, tier) == expected


@pytest.mark.parametrize("tier", [0, -1])
def test_retry_topic_rejects_tiers_below_one(tier: int) -> None:
    with pytest.raises(ValueError, match="retry tier starts at 1"):
        retry_topic("postroom.", tier)


@pytest.mark.parametrize(("prefix", "expected_dead", "expected_results"), [
    ("postroom.", "postroom.email.dead", "postroom.email.results"),
    ("", "email.dead", "email.results"),
])
def test_dead_letter_and_results_topics(prefix: str, expected_dead: str,
                                        expected_results: str) -> None:
    assert dead_letter_topic(prefix) == expected_dead
    assert results_topic(prefix) == expected_results


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("tier", [1, 2, 4, 9, 10, 123])
def test_retry_topic_round_trip(prefix: str, tier: int) -> None:
    assert tier_of_retry_topic(prefix, retry_topic(prefix, tier)) == tier


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("priority", list(Priority))
def test_priority_topic_round_trip(prefix: str, priority: Priority) -> None:
    assert priority_of_topic(prefix, priority_topic(prefix, priority)) is priority


@pytest.mark.parametrize(("prefix", "topic"), [
    ("postroom.", "postroom.email.high"),
    ("postroom.", "postroom.email.dead"),
    ("postroom.", "postroom.email.results"),
    ("postroom.", "postroom.email.retry."),
    ("postroom.", "postroom.email.retry.0"),
    ("postroom.", "postroom.email.retry.01"),
    ("postroom.", "postroom.email.retry.-1"),
    ("postroom.", "postroom.email.retry.1a"),
    ("postroom.", "postroom.email.retry.1.2"),
    ("postroom.", "postroom.email.retry. 1"),
    ("postroom.", "postroom.email.retry.\u00b2"),   # superscript two: isdigit() but not int()
    ("postroom.", "postroom.email.retry.\u0663"),   # Arabic-Indic three
    ("postroom.", "other.email.retry.1"),
    ("postroom.", "email.retry.1"),
    ("", "x.email.retry.1"),
    ("a.", "a.email.retry"),
])
def test_tier_of_retry_topic_is_none_for_anything_else(prefix: str, topic: str) -> None:
    assert tier_of_retry_topic(prefix, topic) is None


@pytest.mark.parametrize(("prefix", "topic"), [
    ("postroom.", "postroom.email.retry.1"),
    ("postroom.", "postroom.email.dead"),
    ("postroom.", "postroom.email.HIGH"),
    ("postroom.", "postroom.email.high."),
    ("postroom.", "other.email.high"),
    ("postroom.", "email.high"),
    ("", "x.email.high"),
])
def test_priority_of_topic_is_none_for_anything_else(prefix: str, topic: str) -> None:
    assert priority_of_topic(prefix, topic) is None


@pytest.mark.parametrize(("tiers", "expected"), [
    (0, ["p.email.high", "p.email.normal", "p.email.low", "p.email.dead", "p.email.results"]),
    (2, ["p.email.high", "p.email.normal", "p.email.low", "p.email.retry.1", "p.email.retry.2",
         "p.email.dead", "p.email.results"]),
])
def test_all_topics(tiers: int, expected: list[str]) -> None:
    assert all_topics("p.", tiers) == expected


@pytest.mark.parametrize("prefix", PREFIXES)
def test_all_topics_are_distinct_and_each_classified_once(prefix: str) -> None:
    topics = all_topics(prefix, 4)
    assert len(set(topics)) == len(topics) == 3 + 4 + 2
    kinds = [
        (priority_of_topic(prefix, t) is not None) + (tier_of_retry_topic(prefix, t) is not None)
        + (t in {dead_letter_topic(prefix), results_topic(prefix)})
        for t in topics
    ]
    assert kinds == [1] * len(topics)


@pytest.mark.parametrize(("tiers", "expected"), [
    (0, ["p.email.high", "p.email.normal", "p.email.low"]),
    (2, ["p.email.high", "p.email.normal", "p.email.low", "p.email.retry.1", "p.email.retry.2"]),
])
def test_the_sender_reads_priorities_and_tiers_but_not_results_or_dead_letters(
        tiers: int, expected: list[str]) -> None:
    assert sender_topics("p.", tiers) == expected
