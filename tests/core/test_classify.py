"""Lane classification: hints per tenant, rules in order, and the defaults on what real trainers send."""

from __future__ import annotations

import fnmatch
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from s3lanes.core import s3request
from s3lanes.core.classify import (
    CHECKPOINT,
    DATASET,
    DEFAULT_LANES,
    KNOWN_OPERATIONS,
    LANE_HINT_HEADER,
    METADATA,
    OPERATION_CLASSES,
    RESTORE,
    CheckpointPrefixes,
    Classifier,
    Decision,
    RequestFacts,
    Rule,
    compile_key_glob,
    key_glob_problem,
    looks_like_checkpoint,
    operation_class,
)
from tests.budget import examples

LANES = frozenset(DEFAULT_LANES)
S3TORCH_UA = (
    "s3torchconnector/1.5.0 (md/python#3.11.9, md/pytorch#2.5.1) mountpoint-s3-client/0.14.1"
    " CRTS3NativeClient/0.1.x platform/linux"
)
BOTO_UA = "Boto3/1.40.61 md/Botocore#1.40.61 ua/2.1 os/linux#6.8 md/arch#x86_64 lang/python#3.11.9"


def make(
    *rules: Rule,
    tenants: dict[str, frozenset[str]] | None = None,
    prefixes: CheckpointPrefixes | None = None,
    lanes: frozenset[str] = LANES,
) -> Classifier:
    return Classifier(rules, lanes, tenants, CheckpointPrefixes() if prefixes is None else prefixes)


def facts(
    operation: str = "GetObject",
    key: str | None = "k",
    *,
    bucket: str | None = "b",
    access_key: str | None = "AK",
    user_agent: str = BOTO_UA,
    size_bytes: int | None = None,
    hint: str | None = None,
) -> RequestFacts:
    return RequestFacts(operation, bucket, key, access_key, user_agent, size_bytes, hint)


# --- defaults on realistic traffic --------------------------------------------------------------------------


def test_dcp_save_through_s3torchconnector_is_all_checkpoint_and_the_tmp_delete_is_metadata():
    """DCP's S3 writer: each file is a multipart upload (even tiny ones), then `.metadata.tmp` is renamed to
    `.metadata` with CopyObject + DeleteObject."""
    c = make()
    step = "ckpt/llama-8b/run7/step_1000/"
    writes = []
    for name in ("__0_0.distcp", "__1_0.distcp", ".metadata.tmp"):
        writes += [
            ("CreateMultipartUpload", step + name, None),
            ("UploadPart", step + name, 8 * 1024 * 1024),
            ("UploadPart", step + name, 3),
            ("CompleteMultipartUpload", step + name, 512),
        ]
    writes.append(("CopyObject", step + ".metadata", 0))
    for op, key, size in writes:
        d = c.classify(facts(op, key, bucket="train", user_agent=S3TORCH_UA, size_bytes=size))
        assert d == Decision(CHECKPOINT, "default:write"), (op, key)
    assert c.classify(facts("DeleteObject", step + ".metadata.tmp", user_agent=S3TORCH_UA)) == Decision(
        METADATA, "default:metadata"
    )


def test_dcp_load_reads_metadata_and_shards_in_restore_and_lists_in_metadata():
    c = make()
    step = "ckpt/llama-8b/run7/step_1000/"
    assert c.classify(facts("ListObjectsV2", None, user_agent=S3TORCH_UA)).lane == METADATA
    assert c.classify(facts("HeadObject", step + ".metadata")).lane == METADATA
    for name in (".metadata", "__0_0.distcp", "__17_3.distcp"):
        assert c.classify(facts("GetObject", step + name, user_agent=S3TORCH_UA)) == Decision(
            RESTORE, "default:checkpoint-like-key"
        )


@pytest.mark.parametrize(
    "key",
    [
        "models/resnet50/epoch_90.pt",  # torch.save
        "runs/7/global_step1000/mp_rank_00_model_states.pt",  # DeepSpeed
        "runs/7/global_step1000/zero_pp_rank_0_mp_rank_00_optim_states.pt",
        "weights/vit_b_16-c867db91.pth",  # torchvision-style
        "hf/llama-3-8b/model-00001-of-00004.safetensors",  # sharded save_pretrained
        "hf/tiny/model.safetensors",
        "lightning_logs/version_0/checkpoints/epoch=3-step=1000.ckpt",
        "model.pt",  # at the bucket root
    ],
)
def test_reads_of_checkpoint_formats_go_to_restore(key: str):
    assert make().classify(facts("GetObject", key)) == Decision(RESTORE, "default:checkpoint-like-key")


@pytest.mark.parametrize(
    "key",
    [
        "webdataset/laion400m/train-000123.tar",  # WebDataset shards, read with ranged GETs
        "c4/en/part-00001-of-01024.parquet",
        "imagenet/train/n01440764/n01440764_10026.JPEG",
        "coco/val2017/000000000139.jpg",
        "megatron/gpt2/my-corpus_text_document.bin",  # indexed dataset: .bin/.idx are not checkpoints
        "megatron/gpt2/my-corpus_text_document.idx",
        "features/clip/000001.npy",
        "notes/.metadata.json",  # only the exact DCP name counts
        "slides/talk.ptx",
        "archive/model.pt.gz",
        "hf/llama-3-8b/model.safetensors.index.json",
        "tokenizer.json",
    ],
)
def test_other_reads_go_to_dataset(key: str):
    assert make().classify(facts("GetObject", key)) == Decision(DATASET, "default:read")


@pytest.mark.parametrize(
    ("operation", "key", "lane"),
    [
        ("PutObject", "data/x.tar", CHECKPOINT),  # a plain single-request upload
        ("UploadPartCopy", "ckpt/a.distcp", CHECKPOINT),
        ("AbortMultipartUpload", "ckpt/a.distcp", CHECKPOINT),  # the writer cleaning up its own upload
        ("SelectObjectContent", "c4/part-0.parquet", DATASET),
        ("SelectObjectContent", "ckpt/x.pt", RESTORE),
        ("HeadObject", "ckpt/x.pt", METADATA),
        ("GetObjectAttributes", "ckpt/x.pt", METADATA),
        ("GetObjectTagging", "ckpt/x.pt", METADATA),
        ("PutObjectTagging", "ckpt/x.pt", METADATA),
        ("ListParts", "ckpt/x.pt", METADATA),
        ("DeleteObject", "ckpt/x.pt", METADATA),
        ("DeleteObjects", None, METADATA),
        ("ListBuckets", None, METADATA),
        ("ListObjects", None, METADATA),
        ("ListObjectsV2", None, METADATA),
        ("ListMultipartUploads", None, METADATA),
        ("HeadBucket", None, METADATA),
        ("CreateBucket", None, METADATA),
        ("GetBucketVersioning", None, METADATA),
        ("PutBucketLifecycleConfiguration", None, METADATA),
        ("UnknownPatch", "x", METADATA),
    ],
)
def test_default_lane_of_each_kind_of_operation(operation: str, key: str | None, lane: str):
    assert make().classify(facts(operation, key)).lane == lane


def test_a_read_with_no_key_is_dataset_and_never_consults_prefixes():
    assert make().classify(facts("GetObject", None)) == Decision(DATASET, "default:read")


@pytest.mark.parametrize(
    ("operation", "cls"),
    [
        ("GetObject", "read"),
        ("SelectObjectContent", "read"),
        ("PutObject", "write"),
        ("UploadPart", "write"),
        ("UploadPartCopy", "write"),
        ("CreateMultipartUpload", "write"),
        ("CompleteMultipartUpload", "write"),
        ("AbortMultipartUpload", "write"),
        ("CopyObject", "write"),
        ("DeleteObject", "delete"),
        ("DeleteObjects", "delete"),
        ("ListObjectsV2", "list"),
        ("ListParts", "list"),
        ("HeadObject", "head"),
        ("HeadBucket", "head"),
        ("GetBucketPolicy", "bucket"),
        ("DeleteBucketCors", "bucket"),
        ("GetObjectLockConfiguration", "bucket"),
        ("CreateBucket", "bucket"),
        ("PutObjectAcl", "other"),
        ("RestoreObject", "other"),
        ("UnknownPost", "other"),
        ("NotAnOperation", "other"),
    ],
)
def test_operation_classes(operation: str, cls: str):
    assert operation_class(operation) == cls


def _names_s3request_produces() -> set[str]:
    names = set()
    for method in ("GET", "HEAD", "PUT", "DELETE", "POST"):
        queries: list[dict[str, str]] = [{}, {"list-type": "2"}, {"delete": ""}]
        queries += [{sub: ""} for sub in s3request._BUCKET_GET_SUBRESOURCES]
        for q in queries:
            names.add(s3request.operation_name(method, "b", None, q, {}))
        for q in [{}, {"uploadId": "u"}, {"uploadId": "u", "partNumber": "1"}, {"uploads": ""}]:
            for sub in ("", "tagging", "acl", "attributes", "restore", "select"):
                qq = {**q, sub: ""} if sub else q
                for headers in ({}, {"x-amz-copy-source": "/a/b"}):
                    names.add(s3request.operation_name(method, "b", "k", qq, headers))
        names.add(s3request.operation_name(method, None, None, {}, {}))
    return names


def test_every_operation_s3request_names_is_known_here():
    """Keeps the class table in step with the parser: a new operation must be classified on purpose."""
    produced = _names_s3request_produces()
    # PUT/DELETE with ?uploads or ?versions make no real S3 operation; they stay "other" (metadata lane).
    unknown = {n for n in produced if n not in KNOWN_OPERATIONS}
    assert all(n.startswith(("Unknown", "PutList", "DeleteList")) for n in unknown), sorted(unknown)
    assert {"GetObject", "PutObject", "UploadPart", "CopyObject", "ListObjectsV2"} <= produced


# --- seen checkpoint prefixes -------------------------------------------------------------------------------


def test_files_next_to_a_written_checkpoint_are_read_in_restore():
    """save_pretrained writes config.json and tokenizer files next to the weights; only the weights look
    like a checkpoint, but the gateway saw the directory take checkpoint writes."""
    c = make()
    d = c.classify(facts("CompleteMultipartUpload", "hf/run7/step_100/model.safetensors", bucket="ckpt"))
    assert c.note_write_completed(
        facts("CompleteMultipartUpload", "hf/run7/step_100/model.safetensors", bucket="ckpt"), d
    )
    assert c.classify(facts("GetObject", "hf/run7/step_100/config.json", bucket="ckpt")) == Decision(
        RESTORE, "default:seen-checkpoint-prefix"
    )
    assert (
        c.classify(facts("GetObject", "hf/run7/step_100/sub/tokenizer.json", bucket="ckpt")).lane == RESTORE
    )
    # Not a sibling step, not another bucket, not a key that merely shares the leading characters.
    assert c.classify(facts("GetObject", "hf/run7/step_200/config.json", bucket="ckpt")).lane == DATASET
    assert c.classify(facts("GetObject", "hf/run7/step_100/config.json", bucket="other")).lane == DATASET
    assert c.classify(facts("GetObject", "hf/run7/step_1000/config.json", bucket="ckpt")).lane == DATASET


def test_a_dataset_uploaded_through_the_gateway_does_not_turn_its_reads_into_restores():
    c = make()
    for op in ("PutObject", "CompleteMultipartUpload"):
        f = facts(op, "webdataset/laion/train-000001.tar", bucket="data")
        d = c.classify(f)
        assert d.lane == CHECKPOINT  # every write is checkpoint-lane traffic by default...
        assert not c.note_write_completed(f, d)  # ...but only checkpoint-looking ones teach a prefix
    assert c.classify(facts("GetObject", "webdataset/laion/train-000002.tar", bucket="data")).lane == DATASET
    assert len(c.prefixes) == 0


@pytest.mark.parametrize(
    ("operation", "recorded"),
    [
        ("PutObject", True),
        ("CompleteMultipartUpload", True),
        ("CopyObject", True),  # DCP's .metadata.tmp -> .metadata rename
        ("CreateMultipartUpload", False),  # the object does not exist yet
        ("UploadPart", False),
        ("AbortMultipartUpload", False),
    ],
)
def test_only_requests_that_finish_an_object_are_recorded(operation: str, recorded: bool):
    c = make()
    f = facts(operation, "ckpt/step_1/__0_0.distcp")
    assert c.note_write_completed(f, c.classify(f)) is recorded


def test_explicit_checkpoint_choices_teach_prefixes_for_formats_without_telltale_names():
    """Orbax/TensorStore data files (`d/<hash>`) have no checkpoint-looking names: a rule names the
    prefix for writes, and reads there then go to restore without a second rule."""
    rule = Rule(lane=CHECKPOINT, prefixes=("orbax/",), operations=("write",), name="orbax")
    c = make(rule)
    f = facts("PutObject", "orbax/run1/100/state/d/0a1b2c3d", bucket="jax")
    d = c.classify(f)
    assert d == Decision(CHECKPOINT, "rule:orbax")
    assert c.note_write_completed(f, d)
    assert c.classify(facts("GetObject", "orbax/run1/100/state/d/ffee", bucket="jax")) == Decision(
        RESTORE, "default:seen-checkpoint-prefix"
    )
    # A hint does the same.
    f2 = facts("PutObject", "tf/run2/ckpt-100.index", bucket="jax", hint="checkpoint")
    assert c.note_write_completed(f2, c.classify(f2))
    assert (
        c.classify(facts("GetObject", "tf/run2/ckpt-100.data-00000-of-00001", bucket="jax")).lane == RESTORE
    )


def test_writes_to_other_lanes_are_not_recorded():
    c = make()
    f = facts("PutObject", "scratch/model.pt", hint="dataset")
    d = c.classify(f)
    assert d == Decision(DATASET, "hint")
    assert not c.note_write_completed(f, d)
    assert not c.note_write_completed(
        facts("PutObject", "x/model.pt", bucket=None), Decision(CHECKPOINT, "hint")
    )


@pytest.mark.parametrize(
    ("levels_up", "key", "prefix"),
    [
        (1, "ckpt/run7/step_100/__0_0.distcp", "ckpt/run7/step_100/"),
        (1, "step_100/model.pt", "step_100/"),
        (1, "model.pt", None),  # the bucket root is never remembered
        (1, "/model.pt", None),
        (1, "a//b.pt", "a//"),
        (2, "ckpt/run7/step_100/__0_0.distcp", "ckpt/run7/"),
        (2, "step_100/model.pt", "step_100/"),  # never widened to the root
        (3, "a/b/c/d.pt", "a/"),
        (9, "a/b/c/d.pt", "a/"),
    ],
)
def test_prefix_derivation(levels_up: int, key: str, prefix: str | None):
    assert CheckpointPrefixes(levels_up=levels_up).prefix_of(key) == prefix


def test_prefix_covers_every_key_below_it_and_nothing_else():
    p = CheckpointPrefixes()
    p.record_write("b", "runs/7/step_1/x.pt")
    assert p.covers("b", "runs/7/step_1/x.pt")
    assert p.covers("b", "runs/7/step_1/deeper/y")
    assert not p.covers("b", "runs/7/step_1")  # the "directory" name itself is not under it
    assert not p.covers("b", "runs/7/step_10/x.pt")
    assert not p.covers("b", "runs/7/x.pt")
    assert not p.covers("c", "runs/7/step_1/x.pt")
    p.record_write("b", "root-level.pt")
    assert len(p) == 1


def test_prefixes_are_bounded_and_forget_the_least_recently_used():
    p = CheckpointPrefixes(max_entries=2)
    p.record_write("b", "s1/x.pt")
    p.record_write("b", "s2/x.pt")
    assert p.covers("b", "s1/y")  # a covering read counts as use: s2 is now the oldest
    p.record_write("b", "s3/x.pt")
    assert p.snapshot() == [("b", "s1/"), ("b", "s3/")]
    assert not p.covers("b", "s2/y")
    p.record_write("b", "s1/z.pt")  # re-recording also counts as use, without a duplicate entry
    p.record_write("c", "s4/x.pt")
    assert p.snapshot() == [("b", "s1/"), ("c", "s4/")]
    assert len(p) == 2
    p.record_write("d", "s5/x.pt")
    p.record_write("d", "s6/x.pt")
    assert not p.covers("b", "s1/y") and not p.covers("c", "s4/x.pt")  # whole buckets forgotten
    assert p.covers("d", "s5/a") and p.covers("d", "s6/a")


def test_a_forgotten_prefix_falls_back_to_the_other_defaults():
    c = make(prefixes=CheckpointPrefixes(max_entries=1))
    for step in (1, 2):
        f = facts("PutObject", f"run/step_{step}/model.pt")
        c.note_write_completed(f, c.classify(f))
    assert c.classify(facts("GetObject", "run/step_1/config.json")).lane == DATASET
    assert c.classify(facts("GetObject", "run/step_2/config.json")).lane == RESTORE


def test_checkpoint_prefixes_refuse_nonsense_bounds():
    with pytest.raises(ValueError):
        CheckpointPrefixes(max_entries=0)
    with pytest.raises(ValueError):
        CheckpointPrefixes(levels_up=0)


# --- hints --------------------------------------------------------------------------------------------------


def test_a_hint_wins_for_a_tenant_not_listed():
    c = make(Rule(lane=DATASET, name="everything"), tenants={"OTHER": frozenset({DATASET})})
    assert c.classify(facts("GetObject", "data/train-0.tar", hint="restore")) == Decision(RESTORE, "hint")


def test_a_hint_is_honoured_only_for_lanes_the_tenant_may_use():
    c = make(tenants={"AKLIMITED": frozenset({DATASET, METADATA}), "AKNONE": frozenset()})
    f = facts("GetObject", "data/train-0.tar", access_key="AKLIMITED", hint="restore")
    assert c.classify(f) == Decision(DATASET, "default:read")  # refused: classified as without a hint
    f = facts("PutObject", "ckpt/x.pt", access_key="AKLIMITED", hint="metadata")
    assert c.classify(f) == Decision(METADATA, "hint")
    f = facts("PutObject", "ckpt/x.pt", access_key="AKNONE", hint="metadata")
    assert c.classify(f) == Decision(CHECKPOINT, "default:write")


@pytest.mark.parametrize("hint", ["turbo", "", "   ", "dataset,restore", "restore\x00"])
def test_hints_naming_no_lane_are_ignored(hint: str):
    assert make().classify(facts("GetObject", "ckpt/x.pt", hint=hint)) == Decision(
        RESTORE, "default:checkpoint-like-key"
    )


def test_hints_are_trimmed_and_case_insensitive():
    assert make().classify(facts("GetObject", "x.tar", hint=" Restore ")) == Decision(RESTORE, "hint")


def test_hints_may_name_lanes_added_in_config():
    c = make(lanes=LANES | {"eval"})
    assert c.classify(facts("GetObject", "x.tar", hint="eval")) == Decision("eval", "hint")


def test_an_anonymous_request_is_treated_as_a_tenant_not_listed():
    c = make(tenants={"AK": frozenset()})
    assert c.classify(facts("GetObject", "x.tar", access_key=None, hint="restore")).lane == RESTORE


def test_a_hint_beats_rules():
    c = make(Rule(lane=METADATA, operations=("read",)))
    assert c.classify(facts("GetObject", "x.tar", hint="dataset")) == Decision(DATASET, "hint")


# --- rules --------------------------------------------------------------------------------------------------


def test_rules_apply_in_order_and_the_first_match_wins():
    c = make(
        Rule(lane=DATASET, prefixes=("ckpt/eval/",), name="eval-reads"),
        Rule(lane=RESTORE, prefixes=("ckpt/",)),
        Rule(lane=METADATA, prefixes=("ckpt/",), name="never-reached"),
    )
    assert c.classify(facts("GetObject", "ckpt/eval/x.bin")) == Decision(DATASET, "rule:eval-reads")
    assert c.classify(facts("GetObject", "ckpt/run/x.bin")) == Decision(RESTORE, "rule:1")
    assert c.classify(facts("GetObject", "data/x.bin")) == Decision(DATASET, "default:read")


def test_a_rule_without_conditions_matches_everything():
    c = make(Rule(lane=DATASET))
    for f in (
        facts("PutObject", "x.pt"),
        facts("ListBuckets", None, bucket=None),
        facts("GetObject", "a.pt"),
    ):
        assert c.classify(f) == Decision(DATASET, "rule:0")


@pytest.mark.parametrize(
    ("rule", "matching", "not_matching"),
    [
        (
            Rule(lane=METADATA, buckets=("ckpt-*", "exact")),
            [facts(bucket="ckpt-a"), facts(bucket="exact")],
            [facts(bucket="data"), facts(bucket="exact2"), facts(bucket="Ckpt-a"), facts(bucket=None)],
        ),
        (
            Rule(lane=METADATA, prefixes=("runs/", "tmp")),
            [facts(key="runs/x"), facts(key="tmp"), facts(key="tmpfile")],
            [facts(key="xruns/x"), facts(key="Runs/x"), facts(key=None)],
        ),
        (
            Rule(lane=METADATA, key_globs=("*.distcp", "/top/*.pt")),
            [facts(key="a/b/__0_0.distcp"), facts(key="top/m.pt")],
            [
                facts(key="a/x.distcp.tmp"),
                facts(key="sub/top/m.pt"),
                facts(key="top/a/m.pt"),
                facts(key=None),
            ],
        ),
        (
            Rule(lane=METADATA, operations=("GetObject", "write")),
            [facts("GetObject"), facts("PutObject"), facts("UploadPart"), facts("CopyObject")],
            [facts("HeadObject"), facts("SelectObjectContent"), facts("DeleteObject")],
        ),
        (
            Rule(lane=METADATA, operations=("list", "head", "bucket", "delete", "other")),
            [facts("ListObjectsV2"), facts("HeadBucket"), facts("PutBucketPolicy"), facts("DeleteObjects")],
            [facts("GetObject"), facts("PutObject")],
        ),
        (
            Rule(lane=METADATA, min_size_bytes=100, max_size_bytes=200),
            [facts(size_bytes=100), facts(size_bytes=150), facts(size_bytes=200)],
            [facts(size_bytes=99), facts(size_bytes=201), facts(size_bytes=None)],
        ),
        (
            Rule(lane=METADATA, min_size_bytes=64 * 1024 * 1024),
            [facts(size_bytes=64 * 1024 * 1024), facts(size_bytes=10**12)],
            [facts(size_bytes=0), facts(size_bytes=None)],
        ),
        (
            Rule(lane=METADATA, max_size_bytes=0),
            [facts(size_bytes=0)],
            [facts(size_bytes=1), facts(size_bytes=None)],
        ),
        (
            Rule(lane=METADATA, access_keys=("AKIAEVAL",)),
            [facts(access_key="AKIAEVAL")],
            [facts(access_key="AKIAEVAL2"), facts(access_key="akiaeval"), facts(access_key=None)],
        ),
        (
            Rule(lane=METADATA, user_agents=("S3TorchConnector",)),  # substring, case-insensitive
            [facts(user_agent=S3TORCH_UA)],
            [facts(user_agent=BOTO_UA), facts(user_agent="")],
        ),
        (
            Rule(lane=METADATA, user_agents=("boto3/1.40.*",)),  # glob on the whole value
            [facts(user_agent=BOTO_UA)],
            [facts(user_agent="aiobotocore/2.25.1 " + BOTO_UA), facts(user_agent="Boto3/1.34.0")],
        ),
        (
            Rule(lane=METADATA, user_agents=("*s3torchconnector*", "rclone/")),
            [facts(user_agent=S3TORCH_UA), facts(user_agent="rclone/v1.75.2")],
            [facts(user_agent=BOTO_UA)],
        ),
    ],
)
def test_each_condition(rule: Rule, matching: list[RequestFacts], not_matching: list[RequestFacts]):
    c = make(rule)
    for f in matching:
        assert c.classify(f) == Decision(METADATA, "rule:0"), f
    for f in not_matching:
        assert c.classify(f).reason != "rule:0", f


def test_every_condition_of_a_rule_must_hold():
    rule = Rule(
        lane=RESTORE,
        buckets=("ckpt-*",),
        prefixes=("runs/",),
        key_globs=("*.bin",),
        operations=("read",),
        access_keys=("AKTRAIN",),
        user_agents=("*s3torchconnector*",),
        name="bins",
    )
    c = make(rule)
    good: dict[str, Any] = {
        "bucket": "ckpt-a",
        "key": "runs/7/pytorch_model.bin",
        "access_key": "AKTRAIN",
        "user_agent": S3TORCH_UA,
    }
    assert c.classify(facts("GetObject", **good)) == Decision(RESTORE, "rule:bins")
    for change in (
        {"bucket": "data"},
        {"key": "data/7/pytorch_model.bin"},
        {"key": "runs/7/pytorch_model.safetensors.json"},
        {"access_key": "AKOTHER"},
        {"user_agent": BOTO_UA},
    ):
        f = facts("GetObject", **{**good, **change})
        assert c.classify(f).reason != "rule:bins", change
    assert c.classify(facts("HeadObject", **good)).reason != "rule:bins"


def test_size_rule_sends_small_uploads_to_metadata():
    """s3torchconnector uploads even a 1-byte object as a multipart upload; a size rule can keep tiny
    writes (markers, `latest` pointers) out of the paced checkpoint lane."""
    c = make(Rule(lane=METADATA, operations=("PutObject", "UploadPart"), max_size_bytes=4096, name="tiny"))
    assert c.classify(facts("UploadPart", "ckpt/latest", size_bytes=1)) == Decision(METADATA, "rule:tiny")
    assert c.classify(facts("UploadPart", "ckpt/x.distcp", size_bytes=8 << 20)).lane == CHECKPOINT
    # Create/Complete carry no object size: unknown sizes never satisfy a size bound.
    assert c.classify(facts("CreateMultipartUpload", "ckpt/latest")).lane == CHECKPOINT


def test_classifier_refuses_invalid_rules_and_missing_default_lanes():
    with pytest.raises(ValueError, match="unknown lane 'fast'"):
        make(Rule(lane="fast"))
    with pytest.raises(ValueError, match="rule named: key_globs"):
        make(Rule(lane=DATASET, key_globs=("a**",), name="named"))
    with pytest.raises(ValueError, match="unknown operation 'GetObjects'"):
        make(Rule(lane=DATASET, operations=("GetObjects",)))
    with pytest.raises(ValueError, match="missing"):
        make(lanes=frozenset({DATASET, CHECKPOINT}))


# --- key globs ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("glob", "key", "matches"),
    [
        ("*.safetensors", "model.safetensors", True),
        ("*.safetensors", "hf/llama/model-00001-of-00004.safetensors", True),
        ("*.safetensors", "hf/model.safetensors.index.json", False),
        ("*/.metadata", "ckpt/step_1/.metadata", True),
        ("*/.metadata", ".metadata", False),  # needs a directory
        (".metadata", ".metadata", True),
        (".metadata", "ckpt/.metadata", True),
        (".metadata", "ckpt/x.metadata", False),
        ("**/*.distcp", "__0_0.distcp", True),  # **/ matches zero directories too
        ("**/*.distcp", "a/b/c/__0_0.distcp", True),
        ("step_*/*.distcp", "ckpt/step_10/__0_0.distcp", True),
        ("step_*/*.distcp", "ckpt/step_10/sub/__0_0.distcp", False),  # * stays within a component
        ("/runs/*/model.pt", "runs/7/model.pt", True),
        ("/runs/*/model.pt", "x/runs/7/model.pt", False),  # anchored at the bucket root
        ("/runs/*/model.pt", "runs/7/8/model.pt", False),
        ("/runs/**/model.pt", "runs/7/8/model.pt", True),
        ("/runs/**/model.pt", "runs/model.pt", True),
        ("runs/**", "runs/a/b/c", True),
        ("runs/**", "x/runs/a", True),
        ("runs/**", "xruns/a", False),
        ("train-??????.tar", "wds/train-000123.tar", True),
        ("train-??????.tar", "wds/train-00123.tar", False),
        ("shard-[0-4]*.tar", "wds/shard-3-a.tar", True),
        ("shard-[!0-4]*.tar", "wds/shard-7-a.tar", True),
        ("shard-[!0-4]*.tar", "wds/shard-3-a.tar", False),
        ("a?b", "a/b", False),  # ? never matches /
        ("a[!x]b", "a/b", False),  # neither does a negated class
        ("[]]x", "]x", True),
        ("a.b", "aXb", False),  # . is literal
        ("*.PT", "m.pt", False),  # case-sensitive, like S3 keys
        ("x(y)+", "x(y)+", True),
    ],
)
def test_key_glob_semantics(glob: str, key: str, matches: bool):
    assert (compile_key_glob(glob).search(key) is not None) is matches


@pytest.mark.parametrize(
    ("glob", "problem"),
    [
        ("", "empty"),
        ("/", "matches no key"),
        ("a**", "whole path component"),
        ("**b/c", "whole path component"),
        ("a/***/b", "whole path component"),
        ("x[ab", "unclosed"),
        ("x[a/b]", "cannot match '/'"),
        ("[z-a]", "not a valid glob"),
    ],
)
def test_bad_key_globs(glob: str, problem: str):
    found = key_glob_problem(glob)
    assert found is not None and problem in found
    with pytest.raises(ValueError):
        compile_key_glob(glob)


@given(
    glob=st.text(alphabet="ab.*?", min_size=1, max_size=8).filter(lambda g: "**" not in g),
    key=st.text(alphabet="ab./", max_size=12),
)
def test_a_glob_without_slash_is_fnmatch_on_the_last_component(glob: str, key: str):
    expected = fnmatch.fnmatchcase(key.rpartition("/")[2], glob)
    assert (compile_key_glob(glob).search(key) is not None) is expected


@pytest.mark.parametrize(
    "key",
    [".metadata", "a/.metadata", "x.distcp", "x.pt", "x.pth", "x.safetensors", "a/b/x.ckpt"],
)
def test_looks_like_checkpoint(key: str):
    assert looks_like_checkpoint(key)
    assert not looks_like_checkpoint(key + ".tmp")


# --- facts from a request -----------------------------------------------------------------------------------


def test_facts_from_a_request():
    headers = {
        "host": "127.0.0.1:9000",
        "user-agent": S3TORCH_UA,
        "content-length": "8388693",
        "x-amz-decoded-content-length": "8388608",
        LANE_HINT_HEADER: "restore",
    }
    target = s3request.parse_target("PUT", "/ckpt/run/__0_0.distcp", "partNumber=1&uploadId=u", headers, ())
    f = RequestFacts.from_request(target, headers, "AKTRAIN")
    assert f == RequestFacts(
        operation="UploadPart",
        bucket="ckpt",
        key="run/__0_0.distcp",
        access_key="AKTRAIN",
        user_agent=S3TORCH_UA,
        size_bytes=8388608,  # the payload, not the aws-chunked framing
        hint="restore",
    )


@pytest.mark.parametrize(
    ("headers", "size"),
    [
        ({"content-length": "42"}, 42),
        ({"content-length": " 42 "}, 42),
        ({"content-length": "-1"}, None),
        ({"content-length": "4e3"}, None),
        ({"content-length": "٤٢"}, None),  # Arabic-Indic digits: str.isdigit says yes, HTTP says no
        ({"content-length": "9" * 30}, None),
        ({"x-amz-decoded-content-length": "x", "content-length": "7"}, 7),
        ({}, None),
    ],
)
def test_facts_size_is_unknown_rather_than_an_error_when_malformed(headers: dict[str, str], size: int | None):
    target = s3request.S3Target("b", "k", "PutObject", False)
    f = RequestFacts.from_request(target, headers, None)
    assert f.size_bytes == size
    assert f.user_agent == "" and f.hint is None


# --- never fails --------------------------------------------------------------------------------------------

_FUZZ_LANES = LANES | {"eval", "bulk"}
_FUZZ_RULES = (
    Rule(lane="eval", access_keys=("AKEVAL",), operations=("read",), name="eval"),
    Rule(lane="bulk", buckets=("bulk-*",), min_size_bytes=1 << 30),
    Rule(lane=RESTORE, key_globs=("/ckpt/**/*.bin", "*/[!a-c]?.idx"), user_agents=("torch", "*CRT*")),
    Rule(lane=DATASET, prefixes=("data/",), max_size_bytes=10, operations=("write", "DeleteObject")),
)
_text = st.text(max_size=40)


@settings(max_examples=examples(400), deadline=None)
@given(
    operation=st.one_of(st.sampled_from(sorted(KNOWN_OPERATIONS | {"UnknownPatch"})), _text),
    bucket=st.one_of(st.none(), st.sampled_from(["ckpt", "data", "bulk-1"]), _text),
    key=st.one_of(st.none(), st.sampled_from(["ckpt/a/b.bin", "data/x", "s/.metadata"]), _text),
    access_key=st.one_of(st.none(), st.sampled_from(["AKEVAL", "AKLIMITED", "AK"]), _text),
    user_agent=_text,
    size_bytes=st.one_of(st.none(), st.integers(min_value=-(2**63), max_value=2**64)),
    hint=st.one_of(st.none(), st.sampled_from(sorted(_FUZZ_LANES)), _text),
)
def test_classify_never_raises_and_always_answers_a_configured_lane(
    operation: str,
    bucket: str | None,
    key: str | None,
    access_key: str | None,
    user_agent: str,
    size_bytes: int | None,
    hint: str | None,
):
    prefixes = CheckpointPrefixes(max_entries=8)
    c = Classifier(_FUZZ_RULES, _FUZZ_LANES, {"AKLIMITED": frozenset({DATASET})}, prefixes)
    prefixes.record_write("ckpt", "seen/dir/x.pt")
    f = RequestFacts(operation, bucket, key, access_key, user_agent, size_bytes, hint)
    d = c.classify(f)
    assert d.lane in _FUZZ_LANES
    assert d.reason == "hint" or d.reason.startswith(("rule:", "default:"))
    c.note_write_completed(f, d)
    assert len(prefixes) <= 8
    assert c.classify(f).lane in _FUZZ_LANES


def test_operation_classes_listed_match_the_table():
    assert {operation_class(op) for op in KNOWN_OPERATIONS} <= set(OPERATION_CLASSES)
