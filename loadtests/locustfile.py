"""Locust load test of an S3 endpoint (s3lanes or a store directly): dataset reads, checkpoint bursts and
metadata storms, driven by Locust's own ``-u``/``-r``/``-t``. docs/loadtests.md explains everything.

    python -m locust -f loadtests/locustfile.py --host http://127.0.0.1:9000 -u 20 -r 10 -t 5m

``--ckpt-writers`` writers and ``--lister-users`` listers are spawned first; every other user is a
``DatasetReader``. For the training pattern or a step load use ``locustfile_training.py`` or
``locustfile_step.py`` (same users, plus a load shape).
"""

from __future__ import annotations

import sys
from pathlib import Path

# Locust imports a locustfile by path; make the repository importable so that the shared modules are
# imported once, as loadtests.* (their event listeners must register once per process).
_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from loadtests.locust_s3 import CheckpointWriter, DatasetReader, Lister  # noqa: E402

__all__ = ["CheckpointWriter", "DatasetReader", "Lister"]
