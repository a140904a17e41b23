"""How many examples a property test runs: its own bounded count in `make test`, or
POSTROOM_FUZZ_EXAMPLES when `make fuzz` asks for more (a hypothesis profile cannot lengthen a test
that pins its own max_examples)."""

from __future__ import annotations

import os


def examples(bounded: int) -> int:
    """``bounded``, or POSTROOM_FUZZ_EXAMPLES when that is larger."""
    return max(bounded, int(os.environ.get("POSTROOM_FUZZ_EXAMPLES") or 0))
