"""``python -m loadtests.fuzz_http``: see :mod:`loadtests.fuzz_http.cli`."""

import sys

from loadtests.fuzz_http.cli import main

sys.exit(main())
