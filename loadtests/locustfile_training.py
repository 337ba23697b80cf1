"""The training pattern: ``--readers`` steady readers, ``--lister-users`` listers, and ``--ckpt-writers``
writers that burst every ``--ckpt-period-s`` (``loadtests.locust_shapes.TrainingShape``).

    python -m locust -f loadtests/locustfile_training.py --headless --host http://127.0.0.1:9000 \\
        -t 10m --readers 16 --ckpt-writers 4 --ckpt-size 2GiB --ckpt-period-s 60 --csv results/run

docs/loadtests.md explains the options and the ``_phases.csv`` this writes.
"""

from __future__ import annotations

import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parent.parent)  # see locustfile.py
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from loadtests.locust_s3 import CheckpointWriter, DatasetReader, Lister  # noqa: E402
from loadtests.locust_shapes import TrainingShape  # noqa: E402

__all__ = ["CheckpointWriter", "DatasetReader", "Lister", "TrainingShape"]
