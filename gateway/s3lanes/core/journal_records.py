"""The spool journal's records: one frozen class per kind, each with its encoding, and :func:`decode`. Pure.

A record is what the spool journals before it acknowledges (or, for the drain's bookkeeping, before or after
it acts on the store); :class:`~s3lanes.core.spool_state.SpoolState` applies records, and only records, in
journal order, live and on replay. On disk each record is one msgpack map (framed by
:mod:`s3lanes.core.journal`) whose ``"t"`` names its kind. Every kind, with its map keys::

    kind      class             keys (in the order written; [optional])       meaning
    put       Put               seq b k ak ln at f sz etag m [ps pm [pc]]    an object acknowledged (single
                                                                              PUT, CopyObject; with ps/pm/pc:
                                                                              a compacted multipart object)
    put       Complete          seq u pn b k etag ak ln at [po]              a client multipart upload
                                                                              completed (pn: its part numbers;
                                                                              po: those completed with the
                                                                              part they replaced)
    del       Delete            seq b k ak ln at                             a DELETE of a spooled key
                                                                              (a tombstone)
    mpu       CreateUpload      seq b k ak ln at u m                         a client multipart upload created
    part      Part              u n f sz md5 [ck]                            one part of it (ck: its checksum)
    abort     Abort             u                                            the upload aborted
    done      Done              s [b k]                                      entry ``s`` is on the store;
                                                                              settles the key's wires up to s
    wire      Wire              b k s                                        a drain request completing entry
                                                                              s may be on its way to the store
    unwire    Unwire            b k s                                        none of its requests can still
                                                                              be applied
    bmpu      BackendUpload     u b k ak ln                                  a drain multipart upload opened
                                                                              on the store
    bmpu_end  BackendUploadEnd  u                                            ... completed or aborted
    bmpi      BackendIntent     i b k ak ln nb                               a drain upload about to be
                                                                              created (nb: not before, wall)
    bmpi_end  BackendIntentEnd  i                                            ... its id is journaled, or none
                                                                              was created
    seq       SeqMark           seq                                          written by compaction: keeps
                                                                              seqs growing across rewrites

Key names: seq/s sequence number, b bucket, k key, ak access key, ln lane (absent in older journals:
``checkpoint``), at acknowledged at (wall clock), f file id(s), sz size, m headers ([name, value] pairs),
u upload id, n part number, i intent token. The shell adds ``_b`` (:data:`s3lanes.core.journal.BATCH_KEY`),
the append batch, to every map it writes; it is not part of a record.

The encoding is a compatibility promise: :meth:`encode` writes exactly the keys, in the order, that journals
on disk hold (``tests/core/test_journal_fixture.py`` replays journals written by earlier builds and checks
their bytes again), and :func:`decode` reads every journal ever written, older optional keys included.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Abort",
    "BackendIntent",
    "BackendIntentEnd",
    "BackendUpload",
    "BackendUploadEnd",
    "Complete",
    "CreateUpload",
    "Delete",
    "Done",
    "Part",
    "Put",
    "Record",
    "SeqMark",
    "Unwire",
    "Wire",
    "decode",
]

DEFAULT_LANE = "checkpoint"

Meta = tuple[tuple[str, str], ...]


def _meta(raw: Any) -> Meta:
    return tuple((str(k), str(v)) for k, v in raw)


def _meta_out(meta: Meta) -> list[list[str]]:
    return [list(kv) for kv in meta]


def _head(t: str, seq: int, bucket: str, key: str, access_key: str, lane: str, at: float) -> dict[str, Any]:
    return {"t": t, "seq": seq, "b": bucket, "k": key, "ak": access_key, "ln": lane, "at": at}


@dataclass(frozen=True, slots=True)
class Put:
    """An object acknowledged: its data files (one, or one per part for a compacted multipart object)."""

    seq: int
    bucket: str
    key: str
    access_key: str
    lane: str
    at: float
    files: tuple[str, ...]
    size: int
    etag: str  # quoted
    meta: Meta = ()
    part_sizes: tuple[int, ...] = ()
    part_md5s: tuple[str, ...] = ()
    part_checksums: tuple[str, ...] = ()

    def encode(self) -> dict[str, Any]:
        rec = _head("put", self.seq, self.bucket, self.key, self.access_key, self.lane, self.at)
        rec.update(f=list(self.files), sz=self.size, etag=self.etag, m=_meta_out(self.meta))
        if self.part_sizes:
            rec.update(ps=list(self.part_sizes), pm=list(self.part_md5s))
            if self.part_checksums:
                rec.update(pc=list(self.part_checksums))
        return rec


@dataclass(frozen=True, slots=True)
class Complete:
    """A client multipart upload completed from the parts numbered ``part_numbers``; ``older``: numbers
    completed with the part their latest upload replaced."""

    seq: int
    upload_id: str
    part_numbers: tuple[int, ...]
    bucket: str
    key: str
    etag: str  # quoted
    access_key: str
    lane: str
    at: float
    older: tuple[int, ...] = ()

    def encode(self) -> dict[str, Any]:
        rec: dict[str, Any] = {
            "t": "put",
            "seq": self.seq,
            "u": self.upload_id,
            "pn": list(self.part_numbers),
            "b": self.bucket,
            "k": self.key,
            "etag": self.etag,
            "ak": self.access_key,
            "ln": self.lane,
            "at": self.at,
        }
        if self.older:
            rec["po"] = list(self.older)
        return rec


@dataclass(frozen=True, slots=True)
class Delete:
    seq: int
    bucket: str
    key: str
    access_key: str
    lane: str
    at: float

    def encode(self) -> dict[str, Any]:
        return _head("del", self.seq, self.bucket, self.key, self.access_key, self.lane, self.at)


@dataclass(frozen=True, slots=True)
class CreateUpload:
    seq: int
    bucket: str
    key: str
    access_key: str
    lane: str
    at: float
    upload_id: str
    meta: Meta = ()

    def encode(self) -> dict[str, Any]:
        rec = _head("mpu", self.seq, self.bucket, self.key, self.access_key, self.lane, self.at)
        rec.update(u=self.upload_id, m=_meta_out(self.meta))
        return rec


@dataclass(frozen=True, slots=True)
class Part:
    upload_id: str
    number: int
    file: str
    size: int
    md5: str  # hex
    checksum: str = ""  # base64, in the upload's checksum algorithm

    def encode(self) -> dict[str, Any]:
        rec: dict[str, Any] = {
            "t": "part",
            "u": self.upload_id,
            "n": self.number,
            "f": self.file,
            "sz": self.size,
            "md5": self.md5,
        }
        if self.checksum:
            rec["ck"] = self.checksum
        return rec


@dataclass(frozen=True, slots=True)
class Abort:
    upload_id: str

    def encode(self) -> dict[str, Any]:
        return {"t": "abort", "u": self.upload_id}


@dataclass(frozen=True, slots=True)
class Done:
    """Entry ``seq`` is on the store. ``bucket``/``key`` (None in older journals) name its key, so that
    the key's wires are settled even if replay no longer holds the entry."""

    seq: int
    bucket: str | None = None
    key: str | None = None

    def encode(self) -> dict[str, Any]:
        if self.bucket is None or self.key is None:
            return {"t": "done", "s": self.seq}
        return {"t": "done", "s": self.seq, "b": self.bucket, "k": self.key}


@dataclass(frozen=True, slots=True)
class Wire:
    bucket: str
    key: str
    seq: int

    def encode(self) -> dict[str, Any]:
        return {"t": "wire", "b": self.bucket, "k": self.key, "s": self.seq}


@dataclass(frozen=True, slots=True)
class Unwire:
    bucket: str
    key: str
    seq: int

    def encode(self) -> dict[str, Any]:
        return {"t": "unwire", "b": self.bucket, "k": self.key, "s": self.seq}


@dataclass(frozen=True, slots=True)
class BackendUpload:
    upload_id: str
    bucket: str
    key: str
    access_key: str
    lane: str

    def encode(self) -> dict[str, Any]:
        return {
            "t": "bmpu",
            "u": self.upload_id,
            "b": self.bucket,
            "k": self.key,
            "ak": self.access_key,
            "ln": self.lane,
        }


@dataclass(frozen=True, slots=True)
class BackendUploadEnd:
    upload_id: str

    def encode(self) -> dict[str, Any]:
        return {"t": "bmpu_end", "u": self.upload_id}


@dataclass(frozen=True, slots=True)
class BackendIntent:
    token: str
    bucket: str
    key: str
    access_key: str
    lane: str
    not_before: float  # wall clock

    def encode(self) -> dict[str, Any]:
        return {
            "t": "bmpi",
            "i": self.token,
            "b": self.bucket,
            "k": self.key,
            "ak": self.access_key,
            "ln": self.lane,
            "nb": self.not_before,
        }


@dataclass(frozen=True, slots=True)
class BackendIntentEnd:
    token: str

    def encode(self) -> dict[str, Any]:
        return {"t": "bmpi_end", "i": self.token}


@dataclass(frozen=True, slots=True)
class SeqMark:
    seq: int

    def encode(self) -> dict[str, Any]:
        return {"t": "seq", "seq": self.seq}


Record = (
    Put
    | Complete
    | Delete
    | CreateUpload
    | Part
    | Abort
    | Done
    | Wire
    | Unwire
    | BackendUpload
    | BackendUploadEnd
    | BackendIntent
    | BackendIntentEnd
    | SeqMark
)


def decode(rec: Mapping[str, Any]) -> Record:
    """The record a journal map holds. Raises KeyError (a key missing), ValueError (an unknown kind, a
    value of the wrong shape) or TypeError."""
    kind = rec["t"]
    if kind == "put":
        head = (str(rec["b"]), str(rec["k"]), str(rec["ak"]), str(rec.get("ln", DEFAULT_LANE)))
        if rec.get("u") is not None:
            return Complete(
                seq=int(rec["seq"]),
                upload_id=str(rec["u"]),
                part_numbers=tuple(int(n) for n in rec["pn"]),
                bucket=head[0],
                key=head[1],
                etag=str(rec["etag"]),
                access_key=head[2],
                lane=head[3],
                at=float(rec["at"]),
                older=tuple(int(n) for n in rec.get("po", ())),
            )
        return Put(
            int(rec["seq"]),
            *head,
            at=float(rec["at"]),
            files=tuple(str(f) for f in rec["f"]),
            size=int(rec["sz"]),
            etag=str(rec["etag"]),
            meta=_meta(rec.get("m", ())),
            part_sizes=tuple(int(n) for n in rec.get("ps", ())),
            part_md5s=tuple(str(m) for m in rec.get("pm", ())),
            part_checksums=tuple(str(c) for c in rec.get("pc", ())),
        )
    if kind == "del":
        return Delete(
            int(rec.get("seq", 0)),
            str(rec["b"]),
            str(rec["k"]),
            str(rec["ak"]),
            str(rec.get("ln", DEFAULT_LANE)),
            float(rec["at"]),
        )
    if kind == "mpu":
        return CreateUpload(
            int(rec.get("seq", 0)),
            str(rec["b"]),
            str(rec["k"]),
            str(rec["ak"]),
            str(rec.get("ln", DEFAULT_LANE)),
            float(rec["at"]),
            upload_id=str(rec["u"]),
            meta=_meta(rec.get("m", ())),
        )
    if kind == "part":
        return Part(
            str(rec["u"]),
            int(rec["n"]),
            str(rec["f"]),
            int(rec["sz"]),
            str(rec["md5"]),
            str(rec.get("ck", "")),
        )
    if kind == "abort":
        return Abort(str(rec["u"]))
    if kind == "done":
        if "k" in rec:
            return Done(int(rec["s"]), str(rec["b"]), str(rec["k"]))
        return Done(int(rec["s"]))
    if kind == "wire":
        return Wire(str(rec["b"]), str(rec["k"]), int(rec["s"]))
    if kind == "unwire":
        return Unwire(str(rec["b"]), str(rec["k"]), int(rec["s"]))
    if kind == "bmpu":
        return BackendUpload(
            str(rec["u"]), str(rec["b"]), str(rec["k"]), str(rec["ak"]), str(rec.get("ln", DEFAULT_LANE))
        )
    if kind == "bmpu_end":
        return BackendUploadEnd(str(rec["u"]))
    if kind == "bmpi":
        return BackendIntent(
            str(rec["i"]),
            str(rec["b"]),
            str(rec["k"]),
            str(rec["ak"]),
            str(rec.get("ln", DEFAULT_LANE)),
            float(rec["nb"]),
        )
    if kind == "bmpi_end":
        return BackendIntentEnd(str(rec["i"]))
    if kind == "seq":
        return SeqMark(int(rec.get("seq", 0)))
    raise ValueError(f"unknown journal record type {kind!r}")
