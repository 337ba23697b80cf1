"""Which lane a request travels in: hint, then configured rules, then built-in defaults. Pure; no I/O.

Theory of operation
-------------------
Every request is classified once, before any backend I/O, into a *lane* (``dataset``, ``checkpoint``,
``restore``, ``metadata`` or a lane added in config); the scheduler then orders backend I/O per lane. The
classifier sees only :class:`RequestFacts` (operation, bucket, key, tenant, User-Agent, upload size, hint) and
answers a :class:`Decision`: the lane and a short machine-readable reason for logs, metrics and the
``x-s3lanes-lane`` response header. Three stages, first answer wins:

1. **Hint.** A client may name its lane in the ``x-s3lanes-lane`` request header. It is honoured only if the
   lane exists and the tenant (access key) may use it: a tenant listed in ``[tenants]`` may use the lanes
   listed there, any other tenant every lane. A hint that is refused or names no lane is ignored, never an
   error: the request is classified as if it had none.
2. **Rules**, configured as data and evaluated in order. Every condition a rule gives must hold; a rule with
   no conditions matches everything. Glob semantics are documented on :func:`compile_key_glob`.
3. **Defaults**, sensible with no configuration at all (the table is in ``docs/lanes.md``):

   =====================================================  ==========  ==================================
   request                                                lane        reason
   =====================================================  ==========  ==================================
   write (PutObject, multipart, CopyObject, ...)          checkpoint  ``default:write``
   read of a checkpoint-looking key                       restore     ``default:checkpoint-like-key``
   read under a prefix seen taking checkpoint writes      restore     ``default:seen-checkpoint-prefix``
   any other read (GetObject, SelectObjectContent)        dataset     ``default:read``
   list, head, delete, bucket and everything else         metadata    ``default:metadata``
   =====================================================  ==========  ==================================

Seen checkpoint prefixes. Some checkpoint files do not look like checkpoints (``config.json`` next to
``model.safetensors``, tokenizer files, a framework's own metadata). :class:`CheckpointPrefixes`
remembers the directories that took checkpoint writes through this gateway (bounded, LRU), so later reads
there go to ``restore``. What is recorded is deliberately narrower than "every write": with no config every
write lands in the checkpoint lane, so recording all of them would turn a dataset uploaded through the
gateway (``train-00001.tar`` ...) into "checkpoint data" and send the training job's reads to the wrong lane.
:meth:`Classifier.note_write_completed` records a write only when the lane is checkpoint **and** the
choice was explicit (hint or rule) or the key itself looks like a checkpoint. The shell calls it after the
backend acknowledged the write, so refused and failed writes teach nothing.

Deletes go to ``metadata``: they move no object data through the gateway, they are small and frequent
(DCP deletes ``.metadata.tmp``; checkpoint rotation deletes whole steps), and the metadata lane's per-request
cost is what they weigh on the store. ``AbortMultipartUpload`` counts as a write: it is the writer cleaning up
its own upload and belongs with that upload's other requests.

What this module is *not*: it does not parse HTTP (see :meth:`RequestFacts.from_request`, which takes
already-lower-cased headers), it does not validate configuration files (``lanes_config`` does, reporting every
problem with its place; here a bad rule is a bug and raises ``ValueError``), and it keeps no clock.

Speed: ``classify`` runs on every request. Globs are compiled once in the constructor (one regular
expression per rule and field), the operation class is a dict lookup, and the seen-prefix check costs one
dict lookup per ``/`` in the key up to the deepest remembered prefix, and none for a bucket with no
remembered prefix. Decisions are built once and reused (constructing a frozen dataclass costs ~1 us here).
Measured with timeit on the development VM (2-core AMD EPYC, Python 3.11): a read classified by the
defaults takes ~1.5 us, a write ~0.3 us, a read checked against 4,000 remembered prefixes in its own bucket
~5 us; each non-matching rule adds ~0.5 us.
"""

from __future__ import annotations

import fnmatch
import re
from collections import OrderedDict
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from s3lanes.core.s3request import S3Target

DATASET = "dataset"
CHECKPOINT = "checkpoint"
RESTORE = "restore"
METADATA = "metadata"
DEFAULT_LANES: tuple[str, ...] = (DATASET, CHECKPOINT, RESTORE, METADATA)

LANE_HINT_HEADER = "x-s3lanes-lane"  # request header a client may send (lower case, as the shell passes them)
LANE_RESPONSE_HEADER = "x-s3lanes-lane"  # response header reporting the lane used
LANE_REASON_RESPONSE_HEADER = "x-s3lanes-lane-reason"  # optional: why (Decision.reason)

# Lane names appear in metric labels, headers and config table names: keep them plain.
LANE_NAME_RE = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")

# --- operation classes --------------------------------------------------------------------------------------
# Every operation name belongs to exactly one class. Rules may name classes or operations; the defaults work
# on classes. Names are those s3lanes.core.s3request produces.

READ = "read"  # object data flows from the store to the client
WRITE = "write"  # object data (or a multipart upload's lifecycle) flows to the store
DELETE = "delete"
LIST = "list"
HEAD = "head"  # object or bucket metadata only, no data: HEAD and the object attribute reads
BUCKET = "bucket"  # bucket creation, deletion and configuration
OTHER = "other"  # object tagging/ACL writes, RestoreObject, anything unnamed (Unknown<Method>)
OPERATION_CLASSES: tuple[str, ...] = (READ, WRITE, DELETE, LIST, HEAD, BUCKET, OTHER)

_BUCKET_CONFIG_SUFFIXES = (
    "BucketAcl",
    "BucketCors",
    "BucketLifecycleConfiguration",
    "BucketLocation",
    "BucketLogging",
    "BucketNotificationConfiguration",
    "BucketPolicy",
    "BucketTagging",
    "BucketVersioning",
    "BucketWebsite",
    "BucketEncryption",
    "ObjectLockConfiguration",
    "BucketOwnershipControls",
    "BucketReplication",
    "BucketRequestPayment",
    "BucketAccelerateConfiguration",
    "BucketPolicyStatus",
)

_OPERATION_CLASS: dict[str, str] = {
    "GetObject": READ,
    "SelectObjectContent": READ,
    "PutObject": WRITE,
    "UploadPart": WRITE,
    "UploadPartCopy": WRITE,
    "CreateMultipartUpload": WRITE,
    "CompleteMultipartUpload": WRITE,
    "AbortMultipartUpload": WRITE,
    "CopyObject": WRITE,
    "DeleteObject": DELETE,
    "DeleteObjects": DELETE,
    "ListBuckets": LIST,
    "ListObjects": LIST,
    "ListObjectsV2": LIST,
    "ListObjectVersions": LIST,
    "ListMultipartUploads": LIST,
    "ListParts": LIST,
    "HeadObject": HEAD,
    "HeadBucket": HEAD,
    "GetObjectAttributes": HEAD,
    "GetObjectTagging": HEAD,
    "GetObjectAcl": HEAD,
    "PutObjectTagging": OTHER,
    "PutObjectAcl": OTHER,
    "DeleteObjectTagging": OTHER,
    "RestoreObject": OTHER,
    "CreateBucket": BUCKET,
    "DeleteBucket": BUCKET,
    **{verb + suffix: BUCKET for verb in ("Get", "Put", "Delete") for suffix in _BUCKET_CONFIG_SUFFIXES},
}

# Names a rule may use in `operations` (a typo there would silently never match, so config rejects others).
KNOWN_OPERATIONS: frozenset[str] = frozenset(_OPERATION_CLASS)

# What the defaults record in CheckpointPrefixes: requests that finish an object (not parts, not aborts).
_OBJECT_COMPLETING_WRITES = frozenset({"PutObject", "CompleteMultipartUpload", "CopyObject"})


def operation_class(operation: str) -> str:
    """The class of an operation name; ``other`` for names this module does not know."""
    return _OPERATION_CLASS.get(operation, OTHER)


# --- checkpoint-looking keys --------------------------------------------------------------------------------

# PyTorch DCP writes `<dir>/.metadata` and `<dir>/__<rank>_<n>.distcp`; torch.save files are .pt/.pth;
# Hugging Face weights .safetensors (also sharded: model-00001-of-00004.safetensors); Lightning .ckpt.
# Matched on the key's last path component, case-sensitively (S3 keys are). Deliberately absent: `.bin`
# (Megatron's indexed datasets are .bin/.idx), `.npy`/`.npz`, `.h5` (common dataset formats).
CHECKPOINT_FILE_NAMES: frozenset[str] = frozenset({".metadata"})
CHECKPOINT_SUFFIXES: tuple[str, ...] = (".distcp", ".pt", ".pth", ".safetensors", ".ckpt")


def looks_like_checkpoint(key: str) -> bool:
    """True if the key's file name is a known checkpoint format (see CHECKPOINT_FILE_NAMES/_SUFFIXES)."""
    name = key.rpartition("/")[2]
    return name in CHECKPOINT_FILE_NAMES or name.endswith(CHECKPOINT_SUFFIXES)


# --- facts and decisions ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RequestFacts:
    """What the classifier may look at. Nothing here is verified beyond what the shell already checked."""

    operation: str  # S3Target.operation
    bucket: str | None
    key: str | None
    access_key: str | None  # the authenticated tenant; None if the request carries none
    user_agent: str
    size_bytes: int | None  # upload body size (decoded length for aws-chunked); None if unknown
    hint: str | None  # value of the x-s3lanes-lane header, if any

    @classmethod
    def from_request(
        cls, target: S3Target, headers: Mapping[str, str], access_key: str | None
    ) -> RequestFacts:
        """Facts of a request. ``headers`` has lower-case names. The size is the payload the request carries:
        ``x-amz-decoded-content-length`` (aws-chunked) or else ``content-length``; a malformed value is
        unknown (None), not an error, since classification must never fail a request."""
        size = _parse_size(headers.get("x-amz-decoded-content-length"))
        if size is None:
            size = _parse_size(headers.get("content-length"))
        return cls(
            operation=target.operation,
            bucket=target.bucket,
            key=target.key,
            access_key=access_key,
            user_agent=headers.get("user-agent", ""),
            size_bytes=size,
            hint=headers.get(LANE_HINT_HEADER),
        )


def _parse_size(value: str | None) -> int | None:
    if value is None:
        return None
    value = value.strip()
    if not value.isascii() or not value.isdigit() or len(value) > 20:
        return None
    return int(value)


@dataclass(frozen=True, slots=True)
class Rule:
    """One classification rule: data, evaluated in order, first match wins.

    Every condition given (non-empty tuple, non-None bound) must hold; within one condition any listed value
    may match. A rule with no condition at all matches every request.
    """

    lane: str
    buckets: tuple[str, ...] = ()  # fnmatch globs on the bucket name, case-sensitive
    prefixes: tuple[str, ...] = ()  # plain key prefixes, case-sensitive
    key_globs: tuple[str, ...] = ()  # path globs on the key: see compile_key_glob
    operations: tuple[str, ...] = ()  # operation names (GetObject...) or classes (read, write, ...)
    min_size_bytes: int | None = None  # inclusive; an unknown size never satisfies a size bound
    max_size_bytes: int | None = None  # inclusive
    access_keys: tuple[str, ...] = ()  # exact access keys (tenants)
    user_agents: tuple[str, ...] = ()  # case-insensitive: substring, or a whole-string glob if it has * ? [
    name: str = ""  # for logs, metrics and docs; the rule's index is used when empty

    def label(self, index: int) -> str:
        return self.name or str(index)


@dataclass(frozen=True, slots=True)
class Decision:
    lane: str
    # "hint", "rule:<name or index>", "default:write", "default:checkpoint-like-key",
    # "default:seen-checkpoint-prefix", "default:read" or "default:metadata".
    reason: str


_DEFAULT_WRITE = Decision(CHECKPOINT, "default:write")
_DEFAULT_CHECKPOINT_LIKE_KEY = Decision(RESTORE, "default:checkpoint-like-key")
_DEFAULT_SEEN_PREFIX = Decision(RESTORE, "default:seen-checkpoint-prefix")
_DEFAULT_READ = Decision(DATASET, "default:read")
_DEFAULT_METADATA = Decision(METADATA, "default:metadata")


# --- globs --------------------------------------------------------------------------------------------------


def _class_end(glob: str, i: int) -> int:
    """Index of the ``]`` closing the ``[`` at ``i`` (fnmatch rules: a leading ``]`` or ``!]`` is literal),
    or -1 if it is never closed."""
    j = i + 1
    if j < len(glob) and glob[j] == "!":
        j += 1
    if j < len(glob) and glob[j] == "]":
        j += 1
    return glob.find("]", j)


def _translate_path_glob(glob: str) -> str:
    """Regex body for a path glob: ``*``/``?``/``[...]`` stay within one path component, ``**`` crosses.
    Assumes :func:`key_glob_problem` found nothing wrong with the glob."""
    out: list[str] = []
    i, n = 0, len(glob)
    while i < n:
        c = glob[i]
        if c == "*":
            if glob.startswith("**", i):
                if i + 2 < n:  # "**/" (validated: a whole component): zero or more whole directories
                    out.append("(?:.*/)?")
                    i += 3
                else:  # trailing "**": everything below
                    out.append(".*")
                    i += 2
                continue
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            j = _class_end(glob, i)
            body = glob[i + 1 : j]
            negate = body.startswith("!")
            if negate:
                body = body[1:]
            # Escape everything but range dashes, so no character is special to re (^, \\, [, &&, ~~, ||).
            escaped = "".join(ch if ch == "-" else re.escape(ch) for ch in body)
            out.append(f"(?!/)[{'^' if negate else ''}{escaped}]")
            i = j + 1
            continue
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def key_glob_problem(glob: str) -> str | None:
    """Why a key glob is not acceptable, or None. Config reports these; the Classifier raises on them."""
    if not glob:
        return "empty glob"
    if glob == "/":
        return "'/' alone matches no key"
    for m in re.finditer(r"\*{2,}", glob):
        before_ok = m.start() == 0 or glob[m.start() - 1] == "/"
        after_ok = m.end() == len(glob) or glob[m.end()] == "/"
        if m.group() != "**" or not before_ok or not after_ok:
            return "'**' must be a whole path component (like 'a/**/b' or 'runs/**')"
    i = 0
    while (i := glob.find("[", i)) != -1:
        j = _class_end(glob, i)
        if j == -1:
            return "unclosed '['"
        if "/" in glob[i:j]:
            return "a [...] class cannot match '/'"
        i = j + 1
    try:
        re.compile(_translate_path_glob(glob.removeprefix("/")))
    except re.error as exc:  # e.g. a reversed range [z-a]
        return f"not a valid glob ({exc})"
    return None


def compile_key_glob(glob: str) -> re.Pattern[str]:
    """Compile a key glob (gitignore/rclone style; case-sensitive, as S3 keys are).

    - ``*`` matches any run of characters except ``/``; ``?`` one character except ``/``; ``[abc]``,
      ``[a-z]``, ``[!abc]`` one character of (not of) a set.
    - ``**`` as a whole path component matches anything, ``/`` included: ``runs/**`` is everything under
      ``runs/``; ``**/`` also matches zero directories, so ``**/*.distcp`` matches ``a.distcp`` too.
    - A glob starting with ``/`` is anchored at the bucket root and must match the whole key
      (``/runs/*/model.pt`` matches ``runs/7/model.pt`` but not ``x/runs/7/model.pt``).
    - Any other glob is matched against the end of the key at a ``/`` boundary: ``*.safetensors`` matches
      ``model.safetensors`` at any depth; ``*/.metadata`` matches ``.metadata`` one or more directories down;
      ``step_*/*.distcp`` the last two components.

    Use the returned pattern with ``search``. Raises ValueError for globs :func:`key_glob_problem` rejects.
    """
    problem = key_glob_problem(glob)
    if problem is not None:
        raise ValueError(f"bad key glob {glob!r}: {problem}")
    if glob.startswith("/"):
        return re.compile(r"\A" + _translate_path_glob(glob[1:]) + r"\Z", re.DOTALL)
    return re.compile(r"(?:\A|/)" + _translate_path_glob(glob) + r"\Z", re.DOTALL)


def _is_glob(pattern: str) -> bool:
    return any(c in pattern for c in "*?[")


def _compile_alternatives(bodies: list[str], flags: int = 0) -> re.Pattern[str] | None:
    if not bodies:
        return None
    return re.compile("|".join(f"(?:{b})" for b in bodies), flags | re.DOTALL)


def rule_problems(rule: Rule, lanes: Collection[str]) -> list[tuple[str, str]]:
    """Everything wrong with a rule, as (field, what) pairs. Empty when the Classifier will accept it."""
    out: list[tuple[str, str]] = []
    if rule.lane not in lanes:
        out.append(("lane", f"unknown lane {rule.lane!r} (lanes: {', '.join(sorted(lanes))})"))
    for b in rule.buckets:
        if not b:
            out.append(("buckets", "empty bucket glob"))
        elif "/" in b:
            out.append(("buckets", f"{b!r}: bucket names contain no '/'"))
    for p in rule.prefixes:
        if not p:
            out.append(("prefixes", "empty prefix (omit prefixes to match every key)"))
        elif p.startswith("/"):
            out.append(("prefixes", f"{p!r}: keys do not start with '/' (write {p.lstrip('/')!r})"))
    for g in rule.key_globs:
        problem = key_glob_problem(g)
        if problem is not None:
            out.append(("key_globs", f"{g!r}: {problem}"))
    for op in rule.operations:
        if op not in KNOWN_OPERATIONS and op not in OPERATION_CLASSES:
            out.append(
                (
                    "operations",
                    f"unknown operation {op!r} (use a class: {', '.join(OPERATION_CLASSES)};"
                    " or an S3 operation name such as GetObject, PutObject, UploadPart)",
                )
            )
    for field_name in ("min_size_bytes", "max_size_bytes"):
        value = getattr(rule, field_name)
        if value is not None and value < 0:
            out.append((field_name, "must not be negative"))
    if (
        rule.min_size_bytes is not None
        and rule.max_size_bytes is not None
        and rule.min_size_bytes > rule.max_size_bytes
    ):
        out.append(("max_size_bytes", f"smaller than min_size_bytes ({rule.min_size_bytes})"))
    for a in rule.access_keys:
        if not a:
            out.append(("access_keys", "empty access key"))
    for u in rule.user_agents:
        if not u:
            out.append(("user_agents", "empty pattern (it would match every User-Agent)"))
    return out


# --- compiled rules -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _CompiledRule:
    decision: Decision
    has_ops: bool
    op_names: frozenset[str]
    op_classes: frozenset[str]
    access_keys: frozenset[str] | None
    buckets: re.Pattern[str] | None
    prefixes: tuple[str, ...] | None
    key_globs: re.Pattern[str] | None
    min_size_bytes: int | None
    max_size_bytes: int | None
    ua_substrings: tuple[str, ...]  # lower-cased
    ua_globs: re.Pattern[str] | None
    has_ua: bool

    @classmethod
    def compile(cls, index: int, rule: Rule) -> _CompiledRule:
        ops = rule.operations
        key_bodies = [compile_key_glob(g).pattern for g in rule.key_globs]
        bucket_bodies = [fnmatch.translate(b) for b in rule.buckets]
        ua_globs = [fnmatch.translate(u) for u in rule.user_agents if _is_glob(u)]
        return cls(
            decision=Decision(rule.lane, f"rule:{rule.label(index)}"),
            has_ops=bool(ops),
            op_names=frozenset(o for o in ops if o not in OPERATION_CLASSES),
            op_classes=frozenset(o for o in ops if o in OPERATION_CLASSES),
            access_keys=frozenset(rule.access_keys) if rule.access_keys else None,
            buckets=_compile_alternatives(bucket_bodies),
            prefixes=rule.prefixes or None,
            key_globs=_compile_alternatives(key_bodies),
            min_size_bytes=rule.min_size_bytes,
            max_size_bytes=rule.max_size_bytes,
            ua_substrings=tuple(u.lower() for u in rule.user_agents if not _is_glob(u)),
            ua_globs=_compile_alternatives(ua_globs, re.IGNORECASE),
            has_ua=bool(rule.user_agents),
        )

    def matches(self, facts: RequestFacts, op_class: str) -> bool:
        # Cheapest and most selective conditions first.
        if self.has_ops and facts.operation not in self.op_names and op_class not in self.op_classes:
            return False
        if self.access_keys is not None and facts.access_key not in self.access_keys:
            return False
        if self.buckets is not None and (facts.bucket is None or self.buckets.match(facts.bucket) is None):
            return False
        key = facts.key
        if self.prefixes is not None and (key is None or not key.startswith(self.prefixes)):
            return False
        if self.min_size_bytes is not None and (
            facts.size_bytes is None or facts.size_bytes < self.min_size_bytes
        ):
            return False
        if self.max_size_bytes is not None and (
            facts.size_bytes is None or facts.size_bytes > self.max_size_bytes
        ):
            return False
        if self.key_globs is not None and (key is None or self.key_globs.search(key) is None):
            return False
        if self.has_ua:
            ua = facts.user_agent
            lowered = ua.lower()
            if not any(s in lowered for s in self.ua_substrings) and (
                self.ua_globs is None or self.ua_globs.match(ua) is None
            ):
                return False
        return True


# --- seen checkpoint prefixes -------------------------------------------------------------------------------


class CheckpointPrefixes:
    """Remembers key prefixes this gateway has seen checkpoint writes to (bounded, LRU), so later reads of
    them go to restore.

    The prefix of a written key is its directory: the key up to and including its last ``/``
    (``ckpt/run7/step_100/__0_0.distcp`` -> ``ckpt/run7/step_100/``). Checkpointing libraries write one
    directory per checkpoint (DCP, ``save_pretrained``, DeepSpeed's ``global_step<N>/``), so the directory
    names exactly the files a restore will read, and nothing of a sibling run or dataset. ``levels_up`` > 1
    widens it to an ancestor (2: ``ckpt/run7/``, covering every step and a ``latest`` pointer file), but
    never to the bucket root: a key with no ``/`` (or too few) records its top directory at most, and a
    key at the root records nothing, since "the whole bucket is checkpoint data" is never a safe guess.

    A prefix covers every key that starts with it, at any depth. Both recording and a covering lookup count
    as use for the LRU order; beyond ``max_entries`` the least recently used prefix is forgotten (after
    which reads there fall back to the other defaults: a slower lane, never a failure).

    Not persisted: a restarted gateway relearns from new writes; a restore right after a gateway restart
    is covered by the key-name defaults, by rules or by hints.
    """

    def __init__(self, max_entries: int = 4096, levels_up: int = 1) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        if levels_up < 1:
            raise ValueError("levels_up must be at least 1")
        self.max_entries = max_entries
        self.levels_up = levels_up
        self._entries: OrderedDict[tuple[str, str], None] = OrderedDict()
        # Remembered prefixes per bucket: a read from a bucket with none is answered without scanning its key.
        self._per_bucket: dict[str, int] = {}
        # Deepest remembered prefix, in "/" count: covers() looks no deeper. Never decreases (only a bound).
        self._max_slashes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def prefix_of(self, key: str) -> str | None:
        """The prefix a write to ``key`` records, or None for a key at the bucket root."""
        parts = key.split("/")
        directories = len(parts) - 1
        if directories == 0:
            return None
        prefix = "/".join(parts[: max(1, directories - self.levels_up + 1)]) + "/"
        return None if prefix == "/" else prefix

    def record_write(self, bucket: str, key: str) -> None:
        prefix = self.prefix_of(key)
        if prefix is None:
            return
        entry = (bucket, prefix)
        if entry in self._entries:
            self._entries.move_to_end(entry)
            return
        self._entries[entry] = None
        self._per_bucket[bucket] = self._per_bucket.get(bucket, 0) + 1
        self._max_slashes = max(self._max_slashes, prefix.count("/"))
        while len(self._entries) > self.max_entries:
            (old_bucket, _), _ = self._entries.popitem(last=False)
            left = self._per_bucket[old_bucket] - 1
            if left:
                self._per_bucket[old_bucket] = left
            else:
                del self._per_bucket[old_bucket]

    def covers(self, bucket: str, key: str) -> bool:
        if bucket not in self._per_bucket:
            return False
        entries = self._entries
        end = -1
        for _ in range(self._max_slashes):
            end = key.find("/", end + 1)
            if end == -1:
                return False
            entry = (bucket, key[: end + 1])
            if entry in entries:
                entries.move_to_end(entry)
                return True
        return False

    def snapshot(self) -> list[tuple[str, str]]:
        """(bucket, prefix) pairs, least recently used first. For status pages and tests."""
        return list(self._entries)


# --- the classifier -----------------------------------------------------------------------------------------


class Classifier:
    """Classifies requests into lanes (see the module docstring). Owns its CheckpointPrefixes' use.

    ``tenant_lanes`` maps an access key to the lanes it may request by hint; a key not in it (and every key
    when it is None) may request any lane. ``lanes`` must contain the four default lanes (the defaults need
    them; ``lanes_config.parse_lanes`` always provides them) and every rule's lane. Invalid rules raise
    ValueError: configuration is validated, with readable messages, before a Classifier is built.
    """

    def __init__(
        self,
        rules: tuple[Rule, ...],
        lanes: frozenset[str],
        tenant_lanes: Mapping[str, frozenset[str]] | None,
        prefixes: CheckpointPrefixes,
    ) -> None:
        missing = [lane for lane in DEFAULT_LANES if lane not in lanes]
        if missing:
            raise ValueError(f"lanes must include the default lanes; missing {missing}")
        for i, rule in enumerate(rules):
            problems = rule_problems(rule, lanes)
            if problems:
                raise ValueError(
                    f"rule {rule.label(i)}: " + "; ".join(f"{field}: {what}" for field, what in problems)
                )
        self.rules = rules
        self.lanes = lanes
        self.tenant_lanes: Mapping[str, frozenset[str]] = dict(tenant_lanes or {})
        self.prefixes = prefixes
        self._compiled = tuple(_CompiledRule.compile(i, r) for i, r in enumerate(rules))
        # Decisions are immutable: build each once (a frozen dataclass costs ~1 us to construct).
        self._hint_decisions = {lane: Decision(lane, "hint") for lane in lanes}

    def allowed_hint(self, hint: str | None, access_key: str | None) -> str | None:
        """The lane a hint names if it is honoured for this tenant, else None."""
        if not hint:
            return None
        lane = hint.strip().lower()
        if lane not in self.lanes:
            return None
        if access_key is not None:
            allowed = self.tenant_lanes.get(access_key)
            if allowed is not None and lane not in allowed:
                return None
        return lane

    def classify(self, facts: RequestFacts) -> Decision:
        if facts.hint:
            lane = self.allowed_hint(facts.hint, facts.access_key)
            if lane is not None:
                return self._hint_decisions[lane]
        op_class = _OPERATION_CLASS.get(facts.operation, OTHER)
        for rule in self._compiled:
            if rule.matches(facts, op_class):
                return rule.decision
        return self._default(facts, op_class)

    def _default(self, facts: RequestFacts, op_class: str) -> Decision:
        if op_class == WRITE:
            return _DEFAULT_WRITE
        if op_class == READ:
            key = facts.key
            if key is not None:
                if looks_like_checkpoint(key):
                    return _DEFAULT_CHECKPOINT_LIKE_KEY
                if facts.bucket is not None and self.prefixes.covers(facts.bucket, key):
                    return _DEFAULT_SEEN_PREFIX
            return _DEFAULT_READ
        return _DEFAULT_METADATA

    def note_write_completed(self, facts: RequestFacts, decision: Decision) -> bool:
        """Called by the shell once the backend acknowledged a request; records checkpoint writes.

        Records the key's prefix when the request finished an object (PutObject, CompleteMultipartUpload,
        CopyObject: parts and aborts add nothing new), went to the checkpoint lane, and either the lane was
        chosen explicitly (hint or rule) or the key looks like a checkpoint. Returns whether it recorded.
        """
        if (
            decision.lane != CHECKPOINT
            or facts.operation not in _OBJECT_COMPLETING_WRITES
            or facts.bucket is None
            or facts.key is None
        ):
            return False
        if decision.reason == _DEFAULT_WRITE.reason and not looks_like_checkpoint(facts.key):
            return False
        self.prefixes.record_write(facts.bucket, facts.key)
        return True
