"""``python -m loadtests.contention``: run the contention benchmark (see :mod:`loadtests.contention.run`)."""

import sys

from loadtests.contention.run import main

if __name__ == "__main__":
    sys.exit(main())
