"""Spool recovery at start-up, before the listener opens: replay the journal into the state, cut a torn tail,
remove data files no record refers to (never acknowledged), and find acknowledged data that is missing or
short (reported, and dropped by the caller with ``done`` records). Blocking: runs on an I/O thread.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from s3lanes.core.journal import BATCH_KEY, JournalCorrupt, replay
from s3lanes.core.spool_state import SpoolState
from s3lanes.runtime.spool.journal import JournalFile

log = logging.getLogger("s3lanes.spool")


@dataclass(slots=True)
class RecoveryReport:
    journal_bytes: int = 0
    records: int = 0
    torn_bytes: int = 0
    entries: int = 0
    uploads: int = 0
    bytes: int = 0
    orphans_removed: int = 0
    lost_entries: list[str] = field(default_factory=list)
    compacted: bool = False
    direct_io: bool = False
    in_doubt: int = 0  # keys whose drain request may still be on its way to the store (fenced on drain)

    def summary(self) -> str:
        text = (
            f"spool recovery: {self.records} journal records ({self.journal_bytes} bytes), "
            f"{self.entries} objects ({self.bytes} bytes) to drain, {self.uploads} open multipart uploads, "
            f"{self.orphans_removed} unacknowledged files removed; data files written "
            + ("with O_DIRECT" if self.direct_io else "through the page cache")
        )
        if self.in_doubt:
            text += f", {self.in_doubt} keys in doubt (a drain request may still be on the wire: fenced)"
        if self.torn_bytes:
            text += f", torn journal tail of {self.torn_bytes} bytes truncated"
        if self.lost_entries:
            text += f", {len(self.lost_entries)} entries LOST (data file missing or short)"
        return text


def recover(
    state: SpoolState, journal: JournalFile, data_dir: Path, compact_bytes: int
) -> tuple[RecoveryReport, int]:
    """Rebuild ``state`` from the journal and check the data files; the journal is left open for appends.
    Returns the report and the number of the last batch in the journal."""
    report = RecoveryReport()
    batch_no = 0
    journal.root.mkdir(parents=True, exist_ok=True)
    data_dir.mkdir(exist_ok=True)
    data = journal.read()
    report.journal_bytes = len(data)
    result = replay(data)  # JournalCorrupt propagates: a loud startup error
    report.records = len(result.records)
    report.torn_bytes = result.torn_bytes
    for rec in result.records:
        batch = rec.get(BATCH_KEY)
        if isinstance(batch, int):
            batch_no = max(batch_no, batch)
        try:
            state.apply(rec)
        except (KeyError, ValueError, TypeError) as exc:
            raise JournalCorrupt(0, f"record {rec!r} does not apply: {exc}") from exc
    journal.repair(result.valid_bytes, result.torn_bytes)
    # Files no record refers to were never acknowledged.
    referenced = state.referenced_files()
    for name in os.listdir(data_dir):
        if name not in referenced:
            os.unlink(data_dir / name)
            report.orphans_removed += 1
    for entry in list(state.entries.values()):
        if entry.kind == "del":
            continue  # a tombstone has no data
        expected = entry.part_sizes or (entry.size,)
        for file_id, size in zip(entry.files, expected, strict=True):
            try:
                actual = os.stat(data_dir / file_id).st_size
            except FileNotFoundError:
                actual = -1
            if actual != size:
                log.error(
                    "spool: acknowledged data of %s/%s (entry %d) is missing or short: file %s has %d of"
                    " %d bytes",
                    entry.bucket,
                    entry.key,
                    entry.seq,
                    file_id,
                    actual,
                    size,
                )
                report.lost_entries.append(str(entry.seq))
                break
    report.in_doubt = state.recovered()
    report.entries = len(state.entries)
    report.uploads = len(state.uploads)
    report.bytes = state.bytes_on_disk
    if journal.nbytes > compact_bytes:
        journal.rewrite(state.snapshot_records())  # nothing else runs yet
        report.compacted = True
    journal.open_append()
    return report, batch_no
