"""The chaos scenarios: each a known input set and the faults injected while it flows, run by
``run_scenario``; ``SHORT`` runs in `make test`, ``FULL`` (plus a seeded random mix) in `make chaos`.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable
from pathlib import Path

from chaos.checks import Outcome, check
from chaos.harness import Run, check_own_stack, recipients_for
from chaos.mailserver import ChaosMailServer
from postroom.settings import Settings, parse_duration_s

Inject = Callable[[Run, random.Random], None]


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

    @property
    def smtp_timeout_s(self) -> float:
        return parse_duration_s(dict(self.env).get("POSTROOM_SMTP_TIMEOUT", "60s"))


def _progress(run: Run, share: float) -> Callable[[], bool]:
    return lambda: run.accepted() >= share * len(run.expected)


def kill_senders(times: int, gap_s: tuple[float, float]) -> Inject:
    def inject(run: Run, rng: random.Random) -> None:
        for _ in range(times):
            time.sleep(rng.uniform(*gap_s))
            run.kill(rng.choice(["sender1", "sender2"]))
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
    Scenario("sender SIGKILL x10, 12-14 s apart", 10000, kill_senders(10, (12.0, 14.0)),
             "ten kills under a backlog, each on a group settled since the last: in-flight keys "
             "resent within seconds, duplicates only from the killed sender's window",
             feed_per_s=1000.0, start_faults_at=0.02, drain_timeout_s=240),
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
]


def run_scenario(base: Settings, scenario: Scenario, log_dir: Path,
                 rng: random.Random) -> Outcome:
    """Run one scenario on fresh topics, schema and groups; always leaves the stack running."""
    check_own_stack(base)
    with ChaosMailServer() as mail:
        run = Run(base, scenario.name.replace(" ", "_").replace("/", "_"), log_dir, mail,
                  dict(scenario.env))
        run.name = scenario.name
        run.prepare()
        try:
            run.start()
            run.wait_assigned()
            run.feed(recipients_for(scenario.emails, run.tag), scenario.feed_per_s)
            run.wait_until(_progress(run, scenario.start_faults_at), 120,
                           "the pipeline to start delivering")
            scenario.inject(run, rng)
            drain_s = run.wait_drained(scenario.drain_timeout_s)
            time.sleep(2.0)  # a duplicate still on its way arrives now
            crashed = [n for n in run.roles if n not in run.alive()]
            marks = run.sent_mark_summaries()
            codes = run.stop()
            outcome = check(run, drain_s, scenario.exact_attempts,
                            scenario.smtp_timeout_s)
            outcome.mark_in_process = marks
            outcome.crashed = crashed + [f"{n} exit {c}" for n, c in codes.items() if c != 0]
        finally:
            run.stop()
            run.drop()
    return outcome
