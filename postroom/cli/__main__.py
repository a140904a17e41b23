"""`python -m postroom.cli`: the `postroom` command of this interpreter."""

from __future__ import annotations

import sys

from postroom.cli import main

sys.exit(main())
