"""The `flightfeed` command's entry point, outside the package on purpose.

Importing flightfeed (pyarrow, grpclib, the generated protocols) takes a second or more, and
a script importing `flightfeed.cli` does it before any of flightfeed's code runs: a Ctrl-C in
that second printed a KeyboardInterrupt traceback instead of `flightfeed: interrupted` and
status 130, which the command gives once it runs. A module of the package would run the
package's import first, so this one is not in it.
"""

from __future__ import annotations

import sys

INTERRUPTED = 130  # (flightfeed.cli's, which cannot be imported before the import it guards)


def main() -> int:
    try:
        from flightfeed.cli import main as run
    except KeyboardInterrupt:
        print("flightfeed: interrupted", file=sys.stderr)
        return INTERRUPTED
    return run()


if __name__ == "__main__":
    sys.exit(main())
