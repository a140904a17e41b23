"""Log lines cannot be forged: every value in a message is escaped onto its one line."""

from __future__ import annotations

import io
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from postroom.logs import LOG_FORMAT, EscapingFilter, SecondCachingFormatter, escape_unprintable

FORGED = "k\n2026-10-02 07:00:00,000 INFO sender.service: key=k attempt=1 sent"


@pytest.mark.parametrize(("text", "expected"), [
    ("plain key=k|a@example.com", "plain key=k|a@example.com"),
    ("Grüße — 日本", "Grüße — 日本"),
    ("a\nb", "a\\nb"),
    ("a\r\nb", "a\\r\\nb"),
    ("a\x85b\u2028c\u2029d", "a\\x85b\\u2028c\\u2029d"),
    ("tab\tand\x00nul\x1b[31m", "tab\\tand\\x00nul\\x1b[31m"),
])
def test_escape_unprintable(text: str, expected: str) -> None:
    assert escape_unprintable(text) == expected


def test_a_value_with_a_line_break_stays_on_its_line() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(EscapingFilter())
    logger = logging.getLogger("test.logs.escaping")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("key=%s domain=%s", FORGED, "evil.example\r\nX")
    finally:
        logger.removeHandler(handler)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("key=k\\n2026-10-02")


def test_the_cli_logging_escapes_every_record() -> None:
    """configure_logging, as postroom's commands call it, in a process of its own."""
    code = ("import logging; from postroom.logs import configure_logging; "
            "configure_logging('INFO'); "
            f"logging.getLogger('postroom.sender.service').info('key=%s attempt=%d', {FORGED!r}, 1)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=60)
    assert len(done.stderr.splitlines()) == 1
    assert "INFO postroom.sender.service: key=k\\n2026-10-02" in done.stderr



@pytest.mark.parametrize(("fmt", "gathered"), [
    (None, "(unknown file) 0 None None"),  # the default format shows none of them
    ("%(filename)s:%(lineno)d %(threadName)s %(process)d %(message)s", "probe.py 4 MainThread pid"),
])
def test_a_record_gathers_only_what_the_format_shows(tmp_path: Path, fmt: str | None,
                                                     gathered: str) -> None:
    probe = tmp_path / "probe.py"
    configure = "configure_logging('INFO')" if fmt is None else f"configure_logging('INFO', {fmt!r})"
    probe.write_text(
        f"import logging, os; from postroom.logs import configure_logging; {configure}\n"
        "seen = []; logging.getLogger().handlers[0].addFilter(lambda r: seen.append(r) or True)\n"
        "log = logging.getLogger('probe')\n"
        "log.info('probe')\n"
        "r = seen[0]; pid = 'pid' if r.process == os.getpid() else r.process\n"
        "print(os.path.basename(r.pathname), r.lineno, r.threadName, pid)\n")
    done = subprocess.run([sys.executable, str(probe)], capture_output=True, text=True,
                          check=False, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == gathered


def test_the_second_caching_formatter_writes_what_logging_writes() -> None:
    ours, stock = SecondCachingFormatter(LOG_FORMAT), logging.Formatter(LOG_FORMAT)
    # Within one second, across seconds, and back to an earlier one (another thread's record).
    for created in (1_790_000_000.0, 1_790_000_000.123, 1_790_000_000.999, 1_790_000_001.5,
                    1_790_000_000.25, 1_790_086_400.001, 0.5):
        record = logging.LogRecord("postroom", logging.INFO, __file__, 1, "key=%s", ("k",), None)
        record.created, record.msecs = created, int((created - int(created)) * 1000) + 0.0
        assert ours.format(record) == stock.format(record)
        assert ours.formatTime(record, "%H:%M") == stock.formatTime(record, "%H:%M")
