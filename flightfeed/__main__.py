"""`python -m flightfeed ...`: the `flightfeed` command, for an environment whose scripts are not
on PATH (or to pick the interpreter)."""

import sys

from .cli import main

sys.exit(main())
