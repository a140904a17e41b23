"""The chaos scenarios: each a known input set and the faults injected while it flows, run by
``run_scenario``; ``SHORT`` runs in `make test`, ``FULL`` (plus a seeded random mix) in `make chaos`.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable
from pathlib import Path

from chaos import bouncestorm, storm
from chaos.checks import Outcome, check
from chaos.harness import TIERS, Run, check_own_stack, recipients_for
from chaos.mailserver import ChaosMailServer
from postroom.settings import Settings, parse_duration_s
from support.registry import registry_url

Inject = Callable[[Run, random.Random], None]
Verify = Callable[[Run], list[str]]


@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str
    emails: int
    inject: Inject
    proves: str
    feed_per_s: float = 2000.0
    env: tuple[tuple[str, str], ...] = ()
    exact_attempts: bool = False   # no fault can redo or add an attempt
    drain_timeout_s: float = 120.0
    start_faults_at: float = 0.2   # share of the input accepted by the server before faults
    backlog: int = 0               # rows kept unfinished while faults come (see Run.feed)
    steady_feed: bool = False      # ... or fed at feed_per_s until the faults are done
    kills_at_full_load: bool = False  # a sender kill that finds no key in doubt fails the run
    # Every key a killed sender held in doubt must have been tried again within this long of
    # the kill (the 60 s, with the default session timeout); None: no limit.
    takeover_limit_s: float | None = None
    recipients: Callable[[int, str], list[str]] = recipients_for
    role_env: tuple[tuple[str, str, str], ...] = ()  # (command, name, value): one kind of role
    before_stop: Verify | None = None  # more checks while the roles run, after the drain
    after_stop: Verify | None = None   # ... and after they stopped
    registry: bool = False  # every role with the stack's Schema Registry (Confluent framing)
    # the sender's and recorder's groups' own configs, set on the broker before the roles start
    # (KIP-848's consumer.session.timeout.ms ...; the failover suite's protocols)
    group_config: tuple[tuple[str, str], ...] = ()
    bounces: bool = False  # `postroom bounces` runs beside the roles (the bounce storm)

    @property
    def smtp_timeout_s(self) -> float:
        return parse_duration_s(dict(self.env).get("POSTROOM_SMTP_TIMEOUT", "60s"))


def _progress(run: Run, share: float) -> Callable[[], bool]:
    return lambda: run.accepted() >= share * len(run.expected)


# Keys `sending`, of a sender's SMTP concurrency, that make it busy enough to kill at full load
# (a key is `sending` from its claim, taken while it waits in its destination's line, to its mark).
BUSY_SHARE = 0.5
BUSY_TIMEOUT_S = 60.0
# After a sender was seen busy, the kill waits a random moment more: killing right when the
# ledger count crossed the mark, or right after the harness's query loaded PostgreSQL, would pick
# moments when marks lag.
AFTER_BUSY_S = (0.2, 1.0)
SENDERS = ["sender1", "sender2"]
# A sender seen busy can be idle a moment later (its partitions moving in a rebalance): a kill
# at full load that finds nothing in doubt is repeated, up to this many times, and reported.
IDLE_KILL_REPEATS = 3


def kill_senders(times: int, gap_s: tuple[float, float], at_full_load: bool = False) -> Inject:
    """``times`` SIGKILLs of a sender drawn at random, ``gap_s`` apart. ``at_full_load``: drawn
    from the ones busy for a second (BUSY_SHARE) after the gap, killed AFTER_BUSY_S later. A
    sender whose partitions hold only retry tiers, or whose backlog ran out, is busy only in
    bursts: a kill of that one would say little about a sender at full load. (Under the
    cooperative-sticky assignment the senders had before range, one of two often held no
    priority partition at all.)"""
    def inject(run: Run, rng: random.Random) -> None:
        for _ in range(times):
            time.sleep(rng.uniform(*gap_s))
            for _attempt in range(IDLE_KILL_REPEATS + 1):
                targets = SENDERS
                after_s = 0.0
                if at_full_load:
                    targets = run.busy_senders(BUSY_SHARE, BUSY_TIMEOUT_S) or SENDERS
                    after_s = rng.uniform(*AFTER_BUSY_S)
                run.kill(rng.choice(targets), after_s=after_s)
                if not at_full_load or run.kills[-1].in_doubt or _attempt == IDLE_KILL_REPEATS:
                    break
                run.kills[-1] = dataclasses.replace(run.kills[-1], repeated=True)
    return inject


def kill_role(name: str, times: int, gap_s: tuple[float, float]) -> Inject:
    def inject(run: Run, rng: random.Random) -> None:
        for _ in range(times):
            time.sleep(rng.uniform(*gap_s))
            run.kill(name)
    return inject


def terminate_each_role(run: Run, rng: random.Random) -> None:
    for prefix in ("relay", "sender", "recorder"):
        time.sleep(rng.uniform(0.3, 1.0))
        run.terminate_backends(prefix)


def restart_postgres(run: Run, rng: random.Random) -> None:
    run.restart_postgres()


def kill_broker(run: Run, rng: random.Random) -> None:
    run.kill_broker(down_s=rng.uniform(2, 5))


def kill_relay_with_broker_down(run: Run, rng: random.Random) -> None:
    run.kill_relay_with_broker_down(down_s=rng.uniform(2, 4))


def smtp_down(run: Run, rng: random.Random) -> None:
    run.smtp_down(1.2)  # longer than the first two retry tiers (0.5 s, 1 s), short of the chain


def drop_in_data(run: Run, rng: random.Random) -> None:
    run.smtp_fault(1.0, drop_data=True)


def slow_replies(run: Run, rng: random.Random) -> None:
    run.smtp_fault(1.0, slow_s=3.0)  # the suite's reply timeout is 2 s here


def poison(run: Run, rng: random.Random) -> None:
    run.poison()


def long_transaction(run: Run, rng: random.Random) -> None:
    run.hold_open_transaction(15.0, recipients_for(40, f"held{run.tag}"))


def long_transaction_minute(run: Run, rng: random.Random) -> None:
    run.hold_open_transaction(60.0, recipients_for(40, f"held{run.tag}"))


def stop_sender(run: Run, rng: random.Random) -> None:
    run.pause(rng.choice(["sender1", "sender2"]), 15.0)  # past the 10 s session timeout


def storm_recipients(count: int, tag: str) -> list[str]:
    """The known input, with one recipient in twelve deferred once by a broken reply and one in
    twelve accepted with one (see mailserver.GARBLED_*)."""
    plain = recipients_for(count, tag)
    return [f"garble-{tag}-{i}@example.com" if i % 12 == 3 else
            f"garble250-{tag}-{i}@example.com" if i % 12 == 9 else rcpt
            for i, rcpt in enumerate(plain)]


def poison_storm(rounds: int, per_round: int, gap_s: tuple[float, float]) -> Inject:
    """The hostile rows by SQL at once, then ``rounds`` rounds of hostile records on every topic
    the roles read (``per_round`` on the sender's, a third as many results), ``gap_s`` apart."""
    def inject(run: Run, rng: random.Random) -> None:
        run.storm = storm.Storm()
        run.storm.write_rows(run)
        run._fault()
        for n in range(rounds):
            time.sleep(rng.uniform(*gap_s))
            run.storm.produce(run, [*storm.storm_records(
                rng, run.tag, run.settings.topic_prefix, TIERS, 2 * n * per_round, per_round),
                *run.storm.forged(run, rng, 3), *run.storm.cross_framed(run, rng, 3)])
            run.storm.foreign(run, rng, (2 * n + 1) * per_round + per_round // 2, 2)
            run._fault()
    return inject


STORM_ENV = (("sender", "POSTROOM_BODY_MAX_BYTES", str(storm.SENDER_BODY_MAX_BYTES)),)


def poison_storm_scenario(name: str, emails: int, rounds: int, per_round: int,
                          feed_per_s: float, backlog: int, registry: bool = False) -> Scenario:
    """``backlog``: the feed goes on past ``emails`` until the last round is in (Run.feed), so
    every round meets mail in flight."""
    return Scenario(
        name, emails, poison_storm(rounds, per_round, (0.5, 1.5)),
        "hostile records on every topic, hostile rows by SQL and broken server replies while "
        "mail flows: every email delivered once, every hostile input ended and counted, no "
        "role exits, lag back to 0", feed_per_s=feed_per_s, start_faults_at=0.05,
        recipients=storm_recipients, role_env=STORM_ENV, before_stop=storm.before_stop,
        after_stop=storm.after_stop, drain_timeout_s=180, backlog=backlog, registry=registry)


POISON_STORM = poison_storm_scenario("poison storm", 3000, 8, 60, 150.0, 300)
POISON_STORM_REGISTRY = poison_storm_scenario(
    "poison storm, Schema Registry", 3000, 8, 60, 150.0, 300, registry=True)
POISON_STORM_SHORT = poison_storm_scenario("poison storm (short)", 400, 2, 40, 100.0, 100)


BOUNCE_STORM = Scenario(
    "bounce storm", 600, bouncestorm.inject,
    "junk, forged, replayed and genuine reports at the bounce intake, from a relay that reuses "
    "its connection after every reply, while mail flows: every genuine report recorded, no role "
    "exits, the intake's memory bounded, the mail delivered as ever", feed_per_s=60.0,
    start_faults_at=0.05, bounces=True, before_stop=bouncestorm.before_stop,
    after_stop=bouncestorm.after_stop, drain_timeout_s=240)


def random_mix(run: Run, rng: random.Random) -> None:
    """Six faults drawn from the cheap ones, at random moments. SMTP faults are left out: two of
    them on one deferred recipient could use up its attempts and make "dead" the right answer."""
    faults: list[Inject] = [kill_senders(1, (0.2, 1.0)), kill_role("relay", 1, (0.2, 1.0)),
                            kill_role("recorder", 1, (0.2, 1.0)), terminate_each_role,
                            restart_postgres, poison]
    for _ in range(6):
        rng.choice(faults)(run, rng)


SHORT = [
    Scenario("sender SIGKILL x2", 500, kill_senders(2, (0.5, 1.5)),
             "a killed sender's in-flight keys are taken over at once and nothing is lost",
             feed_per_s=120.0),
    Scenario("relay + recorder SIGKILL, pg_terminate_backend", 300, lambda run, rng: (
        kill_role("relay", 1, (0.2, 0.5))(run, rng), kill_role("recorder", 1, (0.2, 0.5))(run, rng),
        terminate_each_role(run, rng)),
             "republished rows and replayed results change nothing; every role reconnects",
             feed_per_s=300.0),
]

FULL = [
    Scenario("sender SIGKILL x1 at full load", 5000,
             kill_senders(1, (3.0, 5.0), at_full_load=True),
             "one kill of a sender at full load, default session timeout: every key it held in "
             "doubt is tried again by the next owner within 60 s of the kill",
             feed_per_s=1000.0, start_faults_at=0.02, backlog=3000, kills_at_full_load=True,
             takeover_limit_s=60.0),
    Scenario("sender SIGKILL x10, 12-14 s apart", 5000,
             kill_senders(10, (12.0, 14.0), at_full_load=True),
             "ten kills of a sender at full load, each on a group settled since the last: "
             "in-flight keys resent within seconds, duplicates only from the killed sender's "
             "window", feed_per_s=1000.0, start_faults_at=0.02, backlog=3000,
             kills_at_full_load=True, drain_timeout_s=240),
    Scenario("sender SIGKILL x5, 1-3 s apart", 2000, kill_senders(5, (1.0, 3.0)),
             "kills faster than the group settles: slower takeovers, still nothing lost",
             feed_per_s=400.0, start_faults_at=0.02),
    Scenario("relay SIGKILL x3", 1500, kill_role("relay", 3, (0.5, 1.5)),
             "a relay killed between publish and mark republishes; the ledger absorbs it",
             feed_per_s=500.0),
    Scenario("recorder SIGKILL x3", 1000, kill_role("recorder", 3, (0.5, 1.5)),
             "a replayed results batch changes nothing", exact_attempts=True),
    Scenario("broker SIGKILL + restart", 1000, kill_broker,
             "no email lost or sent twice while the broker is down and comes back"),
    # Fed slowly, so the relay claims rows while the broker is down. Before migration 0013 the
    # dead relay's rows waited for their claim to run out (60 s), and this run failed its drain.
    Scenario("relay SIGKILL holding claims, broker down", 1000, kill_relay_with_broker_down,
             "the rows a killed relay had claimed but not published go out as soon as a relay "
             "runs again, not when their claim runs out", feed_per_s=100.0,
             drain_timeout_s=30),
    Scenario("PostgreSQL fast restart", 1000, restart_postgres,
             "relay, ledger and recorder reconnect; the ledger retakes its owner lock"),
    Scenario("pg_terminate_backend of each role", 1000, terminate_each_role,
             "a terminated session frees its owner's claims; each role reconnects"),
    Scenario("SMTP down 1.2 s", 800, smtp_down,
             "deliveries travel the retry tiers and go out when the server is back"),
    Scenario("drops in DATA", 800, drop_in_data,
             "a connection dropped before the 250 is a transient failure, retried once more"),
    Scenario("replies slower than the timeout", 800, slow_replies,
             "a 250 after the timeout is retried: the only duplicates SMTP forces on us",
             env=(("POSTROOM_SMTP_TIMEOUT", "2s"),)),
    Scenario("poison records", 800, poison,
             "unreadable records on a priority, a retry and the results topic stop nothing",
             exact_attempts=True),
    Scenario("outbox transaction open 60 s", 600, long_transaction_minute,
             "rows committing around an open transaction, and its own rows, all go out",
             feed_per_s=20.0, exact_attempts=True, start_faults_at=0.0, drain_timeout_s=180),
    Scenario("sender SIGSTOP 15 s, SIGCONT", 1000, stop_sender,
             "a stopped sender's claims stay its own (its lock is held): no duplicate"),
    POISON_STORM,
    POISON_STORM_REGISTRY,
    BOUNCE_STORM,
]


def run_scenario(base: Settings, scenario: Scenario, log_dir: Path,
                 rng: random.Random) -> Outcome:
    """Run one scenario on fresh topics, schema and groups; always leaves the stack running."""
    check_own_stack(base)
    if scenario.registry:
        base = dataclasses.replace(base, schema_registry_url=registry_url())
    with ChaosMailServer() as mail:
        role_env: dict[str, dict[str, str]] = {}
        for command, key, value in scenario.role_env:
            role_env.setdefault(command, {})[key] = value
        run = Run(base, scenario.name.replace(" ", "_").replace("/", "_").replace("(", "")
                  .replace(")", "").replace("[", "").replace("]", ""), log_dir, mail,
                  dict(scenario.env), role_env, dict(scenario.group_config),
                  bounces=scenario.bounces)
        run.name = scenario.name
        run.prepare()
        try:
            run.start()
            run.wait_assigned()
            run.notes.append(run.group_protocols())
            run.feed(scenario.recipients(scenario.emails, run.tag), scenario.feed_per_s,
                     scenario.backlog, scenario.steady_feed)
            run.wait_until(_progress(run, scenario.start_faults_at), 120,
                           "the pipeline to start delivering")
            try:
                scenario.inject(run, rng)
            finally:
                run.faults_done_at = time.time()
                run.faults_done.set()
            drain_s = run.wait_drained(scenario.drain_timeout_s)
            time.sleep(2.0)  # a duplicate still on its way arrives now
            more = scenario.before_stop(run) if scenario.before_stop else []
            crashed = [n for n in run.roles if n not in run.alive()]
            window = run.sent_mark_window()
            codes = run.stop()
            more += scenario.after_stop(run) if scenario.after_stop else []
            outcome = check(run, drain_s, scenario.exact_attempts,
                            scenario.smtp_timeout_s, scenario.kills_at_full_load,
                            scenario.takeover_limit_s)
            outcome.mark_window = window
            outcome.crashed = crashed + [f"{n} exit {c}" for n, c in codes.items() if c != 0]
            outcome.hostile = more
            outcome.storm = run.storm is not None
        finally:
            run.stop()
            run.drop()
    return outcome
