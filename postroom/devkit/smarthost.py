"""A throwaway Postfix instance of the project's own, the smarthost of the tests and the demo: its
own config, queue, data and log directories under one directory, loopback ports, short queue
lifetimes. It relays each domain to a next hop of the caller's (the devsmtp server, the bounce
intake) and turns that next hop's refusals into real DSNs to the envelope sender.

Postfix runs as root (``postfix -c DIR start``); every parent directory of ``directory`` must be
reachable by the postfix user (pytest's tmp_path is not: the tests use the dev dir).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from postroom.devkit.ports import listening

log = logging.getLogger(__name__)

POSTFIX = "/usr/sbin/postfix"
POSTFIX_USER = "postfix"
HOSTNAME = "smarthost.postroom.test"  # never a next hop's greeting (Postfix calls that a loop)
START_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 10.0
COMMAND_TIMEOUT_S = 60.0
INSTALL_TIMEOUT_S = 600.0
# Postfix refuses timers under a second; 10 s of queue lifetime ends a deferred recipient in a
# bounce about 10 s after it was accepted.
QUEUE_LIFETIME_S = 10
DELAY_WARNING_S = 3

_MASTER_CF = """\
{listen} inet n - n - - smtpd
pickup    unix  n       -       n       60      1       pickup
cleanup   unix  n       -       n       -       0       cleanup
qmgr      unix  n       -       n       300     1       qmgr
rewrite   unix  -       -       n       -       -       trivial-rewrite
bounce    unix  -       -       n       -       0       bounce
defer     unix  -       -       n       -       0       bounce
trace     unix  -       -       n       -       0       bounce
verify    unix  -       -       n       -       1       verify
flush     unix  n       -       n       1000?   0       flush
proxymap  unix  -       -       n       -       -       proxymap
smtp      unix  -       -       n       -       -       smtp
relay     unix  -       -       n       -       -       smtp
showq     unix  n       -       n       -       -       showq
error     unix  -       -       n       -       -       error
retry     unix  -       -       n       -       -       error
discard   unix  -       -       n       -       -       discard
anvil     unix  -       -       n       -       1       anvil
scache    unix  -       -       n       -       1       scache
postlog   unix-dgram n  -       n       -       1       postlogd
"""

_MAIN_CF = """\
compatibility_level = 3.6
queue_directory = {dir}/queue
data_directory = {dir}/data
# Inside maillog_file_prefixes, or every postfix command exits 1 without a word.
maillog_file = {dir}/log/postfix.log
maillog_file_prefixes = {dir}
myhostname = {hostname}
mydomain = postroom.test
myorigin = $myhostname
mydestination =
inet_interfaces = 127.0.0.1
inet_protocols = ipv4
mynetworks = 127.0.0.0/8
alias_maps =
alias_database =
local_recipient_maps =
smtp_dns_support_level = disabled
transport_maps = texthash:{dir}/etc/transport
default_transport = error:5.1.2 no route in the postroom smarthost
notify_classes =
smtpd_tls_security_level = none
smtp_tls_security_level = none
queue_run_delay = 1s
minimal_backoff_time = 1s
maximal_backoff_time = 1s
maximal_queue_lifetime = {lifetime}s
bounce_queue_lifetime = {lifetime}s
delay_warning_time = {delay_warning}
"""


class SmarthostError(RuntimeError):
    """The throwaway Postfix could not be installed, configured or started."""


def _run(argv: Sequence[str], what: str, timeout_s: float = COMMAND_TIMEOUT_S,
         env: Mapping[str, str] | None = None) -> None:
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s,  # noqa: S603 - fixed argv
                              check=False, stdin=subprocess.DEVNULL,
                              env=None if env is None else {**os.environ, **env})
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SmarthostError(f"{what}: {exc}") from exc
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise SmarthostError(f"{what} exited {done.returncode}: {' / '.join(tail) or 'no output'}")


def ensure_postfix(say: Callable[[str], None] = log.info) -> None:
    """Install Debian's postfix package when /usr/sbin/postfix is missing (as root, no prompts,
    "No configuration": nothing of the system's own mail is set up or started)."""
    if Path(POSTFIX).exists():
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise SmarthostError("Postfix is not installed and cannot be installed here "
                             "(needs root and apt-get): apt-get install postfix")
    say("installing Postfix for the smarthost: apt-get install postfix (No configuration)")
    preseed = "postfix postfix/main_mailer_type select No configuration\n"
    subprocess.run(["debconf-set-selections"], input=preseed, text=True, check=False,  # noqa: S607
                   capture_output=True, timeout=COMMAND_TIMEOUT_S)
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    _run(["apt-get", "update", "-q"], "apt-get update", INSTALL_TIMEOUT_S, env)
    _run(["apt-get", "install", "-y", "-q", "--no-install-recommends", "postfix"],
         "apt-get install postfix", INSTALL_TIMEOUT_S, env)


class Smarthost:
    """One Postfix instance in ``directory`` listening on 127.0.0.1:``port`` and relaying each
    domain of ``routes`` (domain -> (host, port)) there; anything else it bounces."""

    def __init__(self, directory: Path, port: int, routes: Mapping[str, tuple[str, int]], *,
                 queue_lifetime_s: int = QUEUE_LIFETIME_S,
                 delay_warning_s: int | None = DELAY_WARNING_S,
                 say: Callable[[str], None] = log.info) -> None:
        self.directory = directory.resolve()
        self.port = port
        self.routes = dict(routes)
        self.queue_lifetime_s = queue_lifetime_s
        self.delay_warning_s = delay_warning_s
        self._say = say
        self._started = False

    @property
    def config_dir(self) -> Path:
        return self.directory / "etc"

    @property
    def log_path(self) -> Path:
        return self.directory / "log" / "postfix.log"

    def _write_config(self) -> None:
        for sub in ("etc", "queue", "data", "log"):
            (self.directory / sub).mkdir(parents=True, exist_ok=True)
        shutil.chown(self.directory / "data", POSTFIX_USER, POSTFIX_USER)
        warning = "0h" if self.delay_warning_s is None else f"{self.delay_warning_s}s"
        (self.config_dir / "main.cf").write_text(_MAIN_CF.format(
            dir=self.directory, hostname=HOSTNAME, lifetime=self.queue_lifetime_s,
            delay_warning=warning))
        (self.config_dir / "master.cf").write_text(_MASTER_CF.format(
            listen=f"127.0.0.1:{self.port}"))
        (self.config_dir / "transport").write_text("".join(
            f"{domain} smtp:[{host}]:{port}\n" for domain, (host, port) in self.routes.items()))

    def start(self) -> Smarthost:
        """Install Postfix if need be, write the instance's files and start it; returns once it
        answers on its port."""
        ensure_postfix(self._say)
        self._write_config()
        self._say(f"starting a Postfix smarthost on 127.0.0.1:{self.port} ({self.directory}), "
                  "relaying " + ", ".join(f"{d} to {h}:{p}" for d, (h, p) in self.routes.items()))
        _run([POSTFIX, "-c", str(self.config_dir), "start"], "postfix start")
        self._started = True
        deadline = time.monotonic() + START_TIMEOUT_S
        while not listening(self.port, timeout_s=0.2):
            if time.monotonic() > deadline:
                self.stop()
                raise SmarthostError(f"postfix did not listen on 127.0.0.1:{self.port} within "
                                     f"{START_TIMEOUT_S:.0f}s; see {self.log_path}")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        """Stop the instance at once (its queue is thrown away with the directory)."""
        if not self._started:
            return
        self._started = False
        with contextlib.suppress(SmarthostError):
            _run([POSTFIX, "-c", str(self.config_dir), "abort"], "postfix abort", STOP_TIMEOUT_S)
        pid_file = self.directory / "queue" / "pid" / "master.pid"
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while pid_file.exists() and time.monotonic() < deadline:
            with contextlib.suppress(ValueError, OSError):
                os.kill(int(pid_file.read_text().split()[0]), 0)
                time.sleep(0.05)
                continue
            break

    def log(self) -> str:
        """What Postfix logged so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def __enter__(self) -> Smarthost:
        return self.start()

    def __exit__(self, *_exc_info: object) -> None:
        self.stop()


@contextlib.contextmanager
def smarthost(directory: Path, port: int, routes: Mapping[str, tuple[str, int]], *,
              queue_lifetime_s: int = QUEUE_LIFETIME_S,
              delay_warning_s: int | None = DELAY_WARNING_S,
              say: Callable[[str], None] = log.info) -> Iterator[Smarthost]:
    """A started Smarthost, stopped and its directory removed on exit."""
    host = Smarthost(directory, port, routes, queue_lifetime_s=queue_lifetime_s,
                     delay_warning_s=delay_warning_s, say=say)
    try:
        yield host.start()
    finally:
        host.stop()
        shutil.rmtree(directory, ignore_errors=True)


def _route(text: str) -> tuple[str, tuple[str, int]]:
    domain, _, hop = text.partition("=")
    host, _, port = hop.rpartition(":")
    if not (domain and host and port.isdigit() and 0 < int(port) < 65536):
        raise argparse.ArgumentTypeError(f"not DOMAIN=HOST:PORT: {text!r}")
    return domain, (host.strip("[]"), int(port))


class _Stopped(Exception):
    """SIGTERM: stop as Ctrl-C does."""


def _stop_on_sigterm(_signum: int, _frame: object) -> None:
    raise _Stopped


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m postroom.devkit.smarthost DIR --port P --route DOMAIN=HOST:PORT ...``: run a
    smarthost until Ctrl-C or SIGTERM (both stop Postfix), for trying a relay by hand."""
    parser = argparse.ArgumentParser(
        prog="python -m postroom.devkit.smarthost",
        description="Run a throwaway Postfix smarthost until Ctrl-C or SIGTERM (either stops "
                    "Postfix), for trying a relay by hand.",
        epilog="Postfix runs as root; every parent of DIR must be reachable by the postfix user. "
               "Mail to a domain with no --route is bounced to its envelope sender.")
    parser.add_argument("directory", type=Path, metavar="DIR",
                        help="the instance's own directory: its config (etc), queue, data and "
                             "log (log/postfix.log); made if missing")
    parser.add_argument("--port", type=int, default=2525,
                        help="listen on 127.0.0.1:PORT for the mail to relay (default 2525)")
    parser.add_argument("--route", action="append", default=[], type=_route,
                        metavar="DOMAIN=HOST:PORT",
                        help="relay mail for DOMAIN to HOST:PORT (the devsmtp server, say), "
                             "turning its refusals into DSNs; repeat for several domains")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    host = Smarthost(args.directory, args.port, dict(args.route))
    # Python's default SIGTERM ends the process without its finally: Postfix would run on.
    previous = signal.signal(signal.SIGTERM, _stop_on_sigterm)
    try:
        host.start()
        log.info("running; Ctrl-C or SIGTERM stops it (log: %s)", host.log_path)
        while True:
            time.sleep(3600)
    except (KeyboardInterrupt, _Stopped):
        return 0
    except SmarthostError as exc:
        log.error("smarthost: %s", exc)  # noqa: TRY400 - one line, no traceback
        return 1
    finally:
        host.stop()
        signal.signal(signal.SIGTERM, previous)
        log.info("stopped")


if __name__ == "__main__":
    raise SystemExit(main())
