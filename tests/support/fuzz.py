"""How many examples a property test runs: its own bounded count in `make test`,
POSTROOM_FUZZ_EXAMPLES when `make fuzz` asks for more (a hypothesis profile cannot lengthen a test
that pins its own max_examples), or at most POSTROOM_QUICK_EXAMPLES when `make test-unit` asks
for fewer (nor shorten one)."""

from __future__ import annotations

import os


def examples(bounded: int) -> int:
    """``bounded``, or POSTROOM_FUZZ_EXAMPLES when that is larger; at most
    POSTROOM_QUICK_EXAMPLES when that is set."""
    count = max(bounded, int(os.environ.get("POSTROOM_FUZZ_EXAMPLES") or 0))
    quick = int(os.environ.get("POSTROOM_QUICK_EXAMPLES") or 0)
    return min(count, quick) if quick > 0 else count
