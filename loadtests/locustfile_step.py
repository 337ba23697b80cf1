"""A step load: ``--step-users`` more readers every ``--step-time-s`` up to ``--step-max-users``, with the
fixed ``--ckpt-writers`` writers and ``--lister-users`` listers (``loadtests.locust_shapes.StepLoadShape``).

    python -m locust -f loadtests/locustfile_step.py --headless --host http://127.0.0.1:9000 \\
        --ckpt-writers 0 --lister-users 0 --step-users 8 --step-time-s 30 --step-max-users 64 \\
        --csv results/step

docs/loadtests.md explains the options.
"""

from __future__ import annotations

import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parent.parent)  # see locustfile.py
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from loadtests.locust_s3 import CheckpointWriter, DatasetReader, Lister  # noqa: E402
from loadtests.locust_shapes import StepLoadShape  # noqa: E402

__all__ = ["CheckpointWriter", "DatasetReader", "Lister", "StepLoadShape"]
