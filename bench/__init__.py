"""postroom's benchmarks: figures and ratios measured side by side in one run (`python -m bench`).

Never part of the test suite. They run against the local stack that `scripts/services.sh up` starts,
each in a schema and topic prefix of its own that is removed afterwards.
"""

from __future__ import annotations
