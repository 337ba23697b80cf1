"""One Prometheus exposition for a node of several workers: the workers' texts merged, family by family.

Each worker renders its own registry (Prometheus text format 0.0.4). The merge keeps every family once
(its ``# HELP`` and ``# TYPE`` from the first worker that has it, families in first-seen order) followed by
the samples of every worker, each given a ``worker="<index>"`` label. Nothing is summed here: counters and
gauges of different workers stay apart, and ``sum without (worker) (...)`` adds them up in PromQL (a
histogram's buckets too: they share their ``le`` values). Pure text handling, no I/O.
"""

from __future__ import annotations

from collections.abc import Container

WORKER_LABEL = "worker"


def with_worker_label(line: str, worker: int) -> str:
    """``name{a="b"} 1`` -> ``name{worker="3",a="b"} 1``; ``name 1`` -> ``name{worker="3"} 1``."""
    label = f'{WORKER_LABEL}="{worker}"'
    brace = line.find("{")
    space = line.find(" ")
    if brace != -1 and (space == -1 or brace < space):
        rest = line[brace + 1 :]
        sep = "" if rest.startswith("}") else ","
        return f"{line[:brace]}{{{label}{sep}{rest}"
    if space == -1:
        return line
    return f"{line[:space]}{{{label}}}{line[space:]}"


def _family_of(sample_name: str, families: Container[str]) -> str:
    """The family a sample belongs to: its name, or its name without a histogram/summary/counter suffix."""
    if sample_name in families:
        return sample_name
    for suffix in ("_bucket", "_count", "_sum", "_total", "_created", "_info"):
        if sample_name.endswith(suffix) and sample_name[: -len(suffix)] in families:
            return sample_name[: -len(suffix)]
    return sample_name


def merge_expositions(texts: dict[int, str]) -> str:
    """The workers' expositions (worker index -> text) as one, every sample labelled with its worker."""
    heads: dict[str, list[str]] = {}  # family -> its HELP/TYPE lines (first worker's)
    samples: dict[str, list[str]] = {}
    for worker in sorted(texts):
        family = ""
        for line in texts[worker].splitlines():
            if not line.strip():
                continue
            if line.startswith("#"):
                parts = line.split(None, 3)
                if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                    family = parts[2]
                    samples.setdefault(family, [])
                    head = heads.setdefault(family, [])
                    if not any(h.split(None, 3)[1] == parts[1] for h in head):
                        head.append(line)
                continue
            name = line.split("{", 1)[0].split(" ", 1)[0]
            fam = family if family and name.startswith(family) else _family_of(name, samples)
            samples.setdefault(fam, []).append(with_worker_label(line, worker))
    out: list[str] = []
    for fam, lines in samples.items():
        out += heads.get(fam, [])
        out += lines
    return "\n".join(out) + "\n"
