"""Tables for what a batch of claims answers, leases, their renewal, and the wait on a key another
sender holds."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from postroom.sender.claims import (
    RENEW_AFTER_S,
    Claim,
    ClaimResult,
    KeyState,
    busy_wait_s,
    decide_claims,
    first_attempts,
    lease_s,
    needs_renewal,
    send_deadline_s,
)
from postroom.settings import Settings
from support.fuzz import examples

NOW = dt.datetime(2026, 10, 2, 7, 0, tzinfo=dt.UTC)


def s(seconds: float) -> dt.datetime:
    return NOW + dt.timedelta(seconds=seconds)


@pytest.mark.parametrize(("lease_until", "wait"), [
    (None, 1.0),          # the holder is not known: ask again soon
    (s(0.5), 0.7),        # just past the holder's lease
    (s(0), 0.2),
    (s(-30), 0.2),        # already expired: try again at once, but not in a hot loop
    (s(600), 1.0),        # a long lease: ask again every second (the holder may die or answer)
    (s(5), 1.0),
])
def test_busy_wait(lease_until: dt.datetime | None, wait: float) -> None:
    assert busy_wait_s(lease_until, NOW) == pytest.approx(wait)


@pytest.mark.parametrize(("connect_s", "reply_s", "deadline", "lease"), [
    (30.0, 60.0, 270.0, 285.0),   # the defaults
    (1.0, 2.0, 9.0, 24.0),
])
def test_the_lease_outlasts_the_send_deadline(connect_s: float, reply_s: float, deadline: float,
                                               lease: float) -> None:
    settings = Settings(smtp_connect_timeout_s=connect_s, smtp_timeout_s=reply_s)
    assert (send_deadline_s(settings), lease_s(settings)) == (deadline, lease)


@pytest.mark.parametrize(("age_s", "same_session", "renew"), [
    (0.0, True, False),                  # claimed as the send before it ended: the usual case
    (RENEW_AFTER_S, True, False),
    (RENEW_AFTER_S + 0.001, True, True),  # waited long (a paused destination)
    (0.0, False, True),                  # the session that took it ended: someone may have it now
])
def test_a_claim_is_renewed_when_old_or_taken_on_an_ended_session(
        age_s: float, same_session: bool, renew: bool) -> None:
    assert needs_renewal(age_s, same_session) is renew


def test_a_claim_not_renewed_still_outlasts_its_send_and_record() -> None:
    settings = Settings()
    assert lease_s(settings) - RENEW_AFTER_S > send_deadline_s(settings) + RENEW_AFTER_S


# -- what a batch of claims answers (sender/ledger.py runs the statements, claims decides) --------

def mine(taken_from: str | None = None) -> ClaimResult:
    return ClaimResult(Claim.MINE, taken_from=taken_from, session=SESSION)


SESSION = 3
LEASE = s(30)
BUSY = ClaimResult(Claim.BUSY)


@pytest.mark.parametrize(("items", "taken", "others", "answers"), [
    # The statement took the key: ours to send, with the session it was taken on.
    ([("k", 1)], {"k": None}, [], [mine()]),
    ([("k", 1)], {"k": "dead-owner"}, [], [mine("dead-owner")]),
    # A copy of the key in the same batch waits for the first, as a second sender would.
    ([("k", 1), ("k", 1)], {"k": None}, [], [mine(), BUSY]),
    # Another sender's live lease.
    ([("k", 1)], {}, [KeyState("k", "sending", LEASE, 1)], [ClaimResult(Claim.BUSY, 1, None, LEASE)]),
    # A server accepted it: never again, whatever the attempt.
    ([("k", 4)], {}, [KeyState("k", "sent", None, 1, "<m@x>")],
     [ClaimResult(Claim.SENT, 1, "<m@x>")]),
    ([("k", 1), ("k", 2)], {}, [KeyState("k", "sent", None, 1, "<m@x>")],
     [ClaimResult(Claim.SENT, 1, "<m@x>")] * 2),
    # This attempt was made and its outcome published (a copy of its record).
    ([("k", 2)], {}, [KeyState("k", "released", None, 2, None, 2)],
     [ClaimResult(Claim.DONE, 2)]),
    ([("k", 1)], {}, [KeyState("k", "released", None, 2, None, 2)],
     [ClaimResult(Claim.DONE, 2)]),
    # 0a694d2: a copy of attempt 2 and attempt 3 in one batch; attempt 3 is not done: it asks
    # again, alone (answered DONE, the email never reached its final state).
    ([("k", 2), ("k", 3)], {}, [KeyState("k", "released", None, 2, None, 2)],
     [ClaimResult(Claim.DONE, 2), BUSY]),
    # Released after a deferred send (no attempt done), and not taken: someone took it meanwhile.
    ([("k", 1)], {}, [KeyState("k", "released", None, 1)], [ClaimResult(Claim.BUSY, 1)]),
    # A key the statement neither took nor found (deleted by retention meanwhile): ask again.
    ([("k", 1)], {}, [], [BUSY]),
    # Keys answer on their own; rows of keys taken or not asked are not the decision's.
    ([("a", 1), ("b", 1), ("a", 1)], {"a": None},
     [KeyState("a", "sent"), KeyState("b", "sent", None, 1, "<b@x>"), KeyState("z", "sent")],
     [mine(), ClaimResult(Claim.SENT, 1, "<b@x>"), BUSY]),
])
def test_what_a_batch_of_claims_answers(items: list[tuple[str, int]], taken: dict[str, str | None],
                                        others: list[KeyState], answers: list[ClaimResult]) -> None:
    assert decide_claims(items, taken, others, SESSION) == answers


def test_the_statement_asks_each_key_once_with_its_first_attempt() -> None:
    assert first_attempts([("a", 2), ("b", 1), ("a", 3)]) == {"a": 2, "b": 1}


def expected_claim(key: str, attempt: int, first_of_key: bool, taken: dict[str, str | None],
                   row: KeyState | None, first_attempt: int) -> Claim:
    """The specification, one request at a time."""
    if key in taken:
        return Claim.MINE if first_of_key else Claim.BUSY
    if row is None:
        return Claim.BUSY
    if row.state == "sent":
        return Claim.SENT
    done = row.done_attempt
    if done is not None and done >= first_attempt and done >= attempt:
        return Claim.DONE
    return Claim.BUSY


KEYS = st.sampled_from(["a", "b", "c"])
ATTEMPTS = st.integers(1, 4)


@st.composite
def batches(draw: st.DrawFn) -> tuple[list[tuple[str, int]], dict[str, str | None],
                                      list[KeyState]]:
    items = draw(st.lists(st.tuples(KEYS, ATTEMPTS), min_size=1, max_size=8))
    keys = sorted({key for key, _ in items})
    taken = {key: draw(st.sampled_from([None, "other"])) for key in keys if draw(st.booleans())}
    others = [KeyState(key, draw(st.sampled_from(["sending", "sent", "released"])), None,
                       draw(ATTEMPTS), None, draw(st.none() | ATTEMPTS))
              for key in keys if key not in taken and draw(st.booleans())]
    return items, taken, others


@settings(max_examples=examples(300), deadline=None)
@given(batches())
def test_each_request_is_answered_as_specified(
        batch: tuple[list[tuple[str, int]], dict[str, str | None], list[KeyState]]) -> None:
    items, taken, others = batch
    rows = {row.key: row for row in others}
    first = first_attempts(items)
    answers = decide_claims(items, taken, others, SESSION)
    assert len(answers) == len(items)
    seen: set[str] = set()
    for (key, attempt), answer in zip(items, answers, strict=True):
        assert answer.claim is expected_claim(key, attempt, key not in seen, taken, rows.get(key),
                                              first[key])
        seen.add(key)
    # Never two sends of one key from one batch, and never an attempt skipped as done that
    # the ledger does not hold done.
    assert all(sum(1 for (k, _), a in zip(items, answers, strict=True)
                   if k == key and a.claim is Claim.MINE) <= 1 for key in first)
    for (key, attempt), answer in zip(items, answers, strict=True):
        if answer.claim is Claim.DONE:
            done = rows[key].done_attempt
            assert done is not None and done >= attempt
