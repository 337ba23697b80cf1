"""The spool journal's records: one frozen class per kind, each with a table of its map keys. Pure.

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
Both are driven by each class's ``KEYS`` table (:class:`_Key`: the map key, the attribute, how it is written
and read back, when it is left out); the table's order is the order written.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Final, get_args

if TYPE_CHECKING:
    from typing import Self

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

_REQUIRED: Final = object()  # a key every journal holds: its absence is a KeyError


def _meta(raw: Any) -> Meta:
    return tuple((str(k), str(v)) for k, v in raw)


def _meta_out(meta: Meta) -> list[list[str]]:
    return [list(kv) for kv in meta]


def _ints(raw: Any) -> tuple[int, ...]:
    return tuple(int(n) for n in raw)


def _strs(raw: Any) -> tuple[str, ...]:
    return tuple(str(s) for s in raw)


def _as_is(value: Any) -> Any:
    return value


def _always(record: Any) -> bool:
    return True


@dataclass(frozen=True, slots=True)
class _Key:
    """One key of a record's map: the attribute it holds, how it is written and read back.

    ``missing`` is what a map without the key decodes to (older journals, keys written only when set);
    ``present`` names the key whose absence means that (this one if empty). ``written`` says, given the
    record, whether :meth:`_Coded.encode` writes the key at all.
    """

    name: str
    attr: str
    read: Callable[[Any], Any]
    write: Callable[[Any], Any] = _as_is
    missing: Any = _REQUIRED
    present: str = ""
    written: Callable[[Any], bool] = _always

    def decode(self, rec: Mapping[str, Any]) -> Any:
        if self.missing is not _REQUIRED and (self.present or self.name) not in rec:
            return self.missing
        return self.read(rec[self.name])


_SEQ = _Key("seq", "seq", int)
_SEQ_OR_0 = _Key("seq", "seq", int, missing=0)
_BUCKET = _Key("b", "bucket", str)
_KEY = _Key("k", "key", str)
_ACCESS_KEY = _Key("ak", "access_key", str)
_LANE = _Key("ln", "lane", str, missing=DEFAULT_LANE)
_AT = _Key("at", "at", float)
_UPLOAD = _Key("u", "upload_id", str)
_ETAG = _Key("etag", "etag", str)
_META = _Key("m", "meta", _meta, _meta_out, missing=())
_TOKEN = _Key("i", "token", str)
_S = _Key("s", "seq", int)
_TARGET = (_BUCKET, _KEY, _ACCESS_KEY, _LANE)  # a key, whose request wrote it, in which lane
_HEAD = (*_TARGET, _AT)  # after the seq, in every record of a client request


class _Coded:
    """What every record class shares: :meth:`encode` and :meth:`from_map`, driven by ``KEYS``."""

    __slots__ = ()
    KIND: ClassVar[str]  # the map's "t"
    KEYS: ClassVar[tuple[_Key, ...]]

    if TYPE_CHECKING:

        def __init__(self, **values: Any) -> None: ...

    def encode(self) -> dict[str, Any]:
        rec: dict[str, Any] = {"t": self.KIND}
        for k in self.KEYS:
            if k.written(self):
                rec[k.name] = k.write(getattr(self, k.attr))
        return rec

    @classmethod
    def from_map(cls, rec: Mapping[str, Any]) -> Self:
        return cls(**{k.attr: k.decode(rec) for k in cls.KEYS})


@dataclass(frozen=True, slots=True)
class _Acked(_Coded):
    """What a record of an acknowledged client request opens with. Not a record itself: :class:`Put`,
    :class:`Delete` and :class:`CreateUpload` are."""

    KEYS: ClassVar[tuple[_Key, ...]] = (_SEQ_OR_0, *_HEAD)

    seq: int
    bucket: str
    key: str
    access_key: str
    lane: str
    at: float


def _is_multipart(put: Put) -> bool:
    return bool(put.part_sizes)


def _has_part_checksums(put: Put) -> bool:
    return bool(put.part_sizes and put.part_checksums)


@dataclass(frozen=True, slots=True)
class Put(_Acked):
    """An object acknowledged: its data files (one, or one per part for a compacted multipart object)."""

    KIND: ClassVar[str] = "put"
    KEYS: ClassVar[tuple[_Key, ...]] = (
        _SEQ,
        *_HEAD,
        _Key("f", "files", _strs, list),
        _Key("sz", "size", int),
        _ETAG,
        _META,
        _Key("ps", "part_sizes", _ints, list, missing=(), written=_is_multipart),
        _Key("pm", "part_md5s", _strs, list, missing=(), written=_is_multipart),
        _Key("pc", "part_checksums", _strs, list, missing=(), written=_has_part_checksums),
    )

    files: tuple[str, ...]
    size: int
    etag: str  # quoted
    meta: Meta = ()
    part_sizes: tuple[int, ...] = ()
    part_md5s: tuple[str, ...] = ()
    part_checksums: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Complete(_Coded):
    """A client multipart upload completed from the parts numbered ``part_numbers``; ``older``: numbers
    completed with the part their latest upload replaced. Journaled as a ``put`` with an upload id."""

    KIND: ClassVar[str] = "put"
    KEYS: ClassVar[tuple[_Key, ...]] = (
        _SEQ,
        _UPLOAD,
        _Key("pn", "part_numbers", _ints, list),
        _BUCKET,
        _KEY,
        _ETAG,
        _ACCESS_KEY,
        _LANE,
        _AT,
        _Key("po", "older", _ints, list, missing=(), written=lambda r: bool(r.older)),
    )

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


@dataclass(frozen=True, slots=True)
class Delete(_Acked):
    KIND: ClassVar[str] = "del"


@dataclass(frozen=True, slots=True)
class CreateUpload(_Acked):
    KIND: ClassVar[str] = "mpu"
    KEYS: ClassVar[tuple[_Key, ...]] = (*_Acked.KEYS, _UPLOAD, _META)

    upload_id: str
    meta: Meta = ()


@dataclass(frozen=True, slots=True)
class Part(_Coded):
    KIND: ClassVar[str] = "part"
    KEYS: ClassVar[tuple[_Key, ...]] = (
        _UPLOAD,
        _Key("n", "number", int),
        _Key("f", "file", str),
        _Key("sz", "size", int),
        _Key("md5", "md5", str),
        _Key("ck", "checksum", str, missing="", written=lambda r: bool(r.checksum)),
    )

    upload_id: str
    number: int
    file: str
    size: int
    md5: str  # hex
    checksum: str = ""  # base64, in the upload's checksum algorithm


@dataclass(frozen=True, slots=True)
class _UploadEnd(_Coded):
    """An upload that ended, by its id. Not a record itself: :class:`Abort` (a client's upload) and
    :class:`BackendUploadEnd` (a drain's) are."""

    KEYS: ClassVar[tuple[_Key, ...]] = (_UPLOAD,)

    upload_id: str


@dataclass(frozen=True, slots=True)
class Abort(_UploadEnd):
    KIND: ClassVar[str] = "abort"


def _names_key(done: Done) -> bool:
    return done.bucket is not None and done.key is not None


@dataclass(frozen=True, slots=True)
class Done(_Coded):
    """Entry ``seq`` is on the store. ``bucket``/``key`` (None in older journals) name its key, so that
    the key's wires are settled even if replay no longer holds the entry."""

    KIND: ClassVar[str] = "done"
    KEYS: ClassVar[tuple[_Key, ...]] = (
        _S,
        _Key("b", "bucket", str, missing=None, present="k", written=_names_key),
        _Key("k", "key", str, missing=None, written=_names_key),
    )

    seq: int
    bucket: str | None = None
    key: str | None = None


@dataclass(frozen=True, slots=True)
class _EntryMark(_Coded):
    """A mark on entry ``seq`` of a key. Not a record itself: :class:`Wire` and :class:`Unwire` are."""

    KEYS: ClassVar[tuple[_Key, ...]] = (_BUCKET, _KEY, _S)

    bucket: str
    key: str
    seq: int


@dataclass(frozen=True, slots=True)
class Wire(_EntryMark):
    KIND: ClassVar[str] = "wire"


@dataclass(frozen=True, slots=True)
class Unwire(_EntryMark):
    KIND: ClassVar[str] = "unwire"


@dataclass(frozen=True, slots=True)
class _DrainUpload(_Coded):
    """The key a drain multipart upload writes, and in which lane. Not a record itself: :class:`BackendUpload`
    and :class:`BackendIntent` are (their ``KEYS`` put these after the upload id or token)."""

    bucket: str
    key: str
    access_key: str
    lane: str


@dataclass(frozen=True, slots=True)
class BackendUpload(_DrainUpload):
    KIND: ClassVar[str] = "bmpu"
    KEYS: ClassVar[tuple[_Key, ...]] = (_UPLOAD, *_TARGET)

    upload_id: str


@dataclass(frozen=True, slots=True)
class BackendUploadEnd(_UploadEnd):
    KIND: ClassVar[str] = "bmpu_end"


@dataclass(frozen=True, slots=True)
class BackendIntent(_DrainUpload):
    KIND: ClassVar[str] = "bmpi"
    KEYS: ClassVar[tuple[_Key, ...]] = (_TOKEN, *_TARGET, _Key("nb", "not_before", float))

    token: str
    not_before: float  # wall clock


@dataclass(frozen=True, slots=True)
class BackendIntentEnd(_Coded):
    KIND: ClassVar[str] = "bmpi_end"
    KEYS: ClassVar[tuple[_Key, ...]] = (_TOKEN,)

    token: str


@dataclass(frozen=True, slots=True)
class SeqMark(_Coded):
    KIND: ClassVar[str] = "seq"
    KEYS: ClassVar[tuple[_Key, ...]] = (_SEQ_OR_0,)

    seq: int


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

# Every kind but Complete, which shares Put's "put" and is told apart by its upload id.
_BY_KIND: Final[dict[str, type[Record]]] = {cls.KIND: cls for cls in get_args(Record) if cls is not Complete}


def decode(rec: Mapping[str, Any]) -> Record:
    """The record a journal map holds. Raises KeyError (a key missing), ValueError (an unknown kind, a
    value of the wrong shape) or TypeError."""
    kind = rec["t"]
    cls = _BY_KIND.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ValueError(f"unknown journal record type {kind!r}")
    if cls is Put and rec.get("u") is not None:
        return Complete.from_map(rec)
    return cls.from_map(rec)
