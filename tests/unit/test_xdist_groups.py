"""`make test` runs on pytest-xdist with --dist loadgroup: the tests of one xdist_group share a
worker (one console and one browser, one wheel, one stack started at a time). pytest 9.2 with
pytest-xdist 3.8 stopped grouping without a word (pytest-xdist issue 1386); this runs a group of
tests on two workers and asks that they ran on one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

GROUPED = """\
import pytest

pytestmark = pytest.mark.xdist_group("together")


@pytest.mark.parametrize("n", range(6))
def test_where(n):
    pass
"""


def test_the_tests_of_one_group_run_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    # pytest and pytest-xdist alone: each of the three interpreters skips importing the other
    # plugins installed (hypothesis's most of all), which have no part in grouping.
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "xdist", "-n", "2", "--dist", "loadgroup", "-v",
         "-p", "no:cacheprovider", "-c", "/dev/null", "--rootdir", str(tmp_path),
         str(tmp_path / "test_grouped.py")],
        capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path,
        env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
    # "[gw1] [ 16%] PASSED test_grouped.py::test_where[0]@together", a line per test
    ran = [line.split()[0] for line in done.stdout.splitlines() if " PASSED " in line]
    assert len(ran) == 6, done.stdout
    assert len(set(ran)) == 1, done.stdout
