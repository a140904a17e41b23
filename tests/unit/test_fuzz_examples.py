"""support.fuzz.examples: a property test's own count, raised by `make fuzz`, capped by
`make test-unit`."""

from __future__ import annotations

import pytest

from support.fuzz import examples


@pytest.mark.parametrize(("fuzz", "quick", "bounded", "runs"), [
    ("", "", 300, 300),        # make test: the test's own count
    ("2000", "", 300, 2000),   # make fuzz: more
    ("20", "", 300, 300),      # ... never fewer
    ("", "30", 300, 30),       # make test-unit: at most its cap
    ("", "30", 20, 20),        # ... never more than the test's own
    ("2000", "30", 300, 30),   # the cap holds over fuzz's count
])
def test_the_count_is_the_tests_own_raised_by_fuzz_capped_by_quick(
        monkeypatch: pytest.MonkeyPatch, fuzz: str, quick: str, bounded: int, runs: int) -> None:
    monkeypatch.setenv("POSTROOM_FUZZ_EXAMPLES", fuzz)
    monkeypatch.setenv("POSTROOM_QUICK_EXAMPLES", quick)
    assert examples(bounded) == runs
