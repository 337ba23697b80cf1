"""Lane, rule and tenant config: defaults, merging, and every mistake reported at once with its place."""

from __future__ import annotations

import tomllib
from typing import Any

import pytest

from s3lanes.core.classify import (
    CHECKPOINT,
    DATASET,
    DEFAULT_LANES,
    METADATA,
    RESTORE,
    CheckpointPrefixes,
    Classifier,
    Decision,
    RequestFacts,
    Rule,
)
from s3lanes.core.lanes_config import (
    default_lanes,
    parse_lanes,
    parse_rules,
    parse_tenants,
)
from s3lanes.core.scheduler import LaneSpec

SRC = "s3lanes.toml"
LANES = frozenset(DEFAULT_LANES)


def lanes_of(raw: Any) -> tuple[dict[str, LaneSpec], list[str]]:
    problems: list[str] = []
    return parse_lanes(raw, SRC, problems), problems


def rules_of(raw: Any, lanes: frozenset[str] = LANES) -> tuple[tuple[Rule, ...], list[str]]:
    problems: list[str] = []
    return parse_rules(raw, lanes, SRC, problems), problems


def tenants_of(raw: Any) -> tuple[dict[str, frozenset[str]], list[str]]:
    problems: list[str] = []
    return parse_tenants(raw, LANES, SRC, problems), problems


MISSPELT = "weigth"  # codespell:ignore (a misspelt setting name, on purpose)


# --- lanes --------------------------------------------------------------------------------------------------


def test_default_lanes():
    lanes = default_lanes()
    assert list(lanes) == [DATASET, CHECKPOINT, RESTORE, METADATA]
    assert lanes[DATASET] == LaneSpec(
        DATASET, reservation=0.70, weight=7.0, read_protected=True, paced_by_guard=False
    )
    assert lanes[CHECKPOINT] == LaneSpec(
        CHECKPOINT,
        reservation=0.0,
        weight=3.0,
        limit_while_reads_active=0.30,
        floor=0.02,
        paced_by_guard=True,
    )
    assert lanes[RESTORE] == LaneSpec(RESTORE, weight=2.0, limit_while_reads_active=0.30, paced_by_guard=True)
    assert lanes[METADATA] == LaneSpec(METADATA, reservation=0.02, weight=1.0, paced_by_guard=False)
    assert sum(lane.guaranteed for lane in lanes.values()) == pytest.approx(0.74)


def test_no_lanes_table_means_the_defaults_without_problems():
    assert lanes_of(None) == (default_lanes(), [])
    assert lanes_of({}) == (default_lanes(), [])


def test_defaults_are_a_fresh_dict_each_time():
    default_lanes().pop(DATASET)
    assert DATASET in default_lanes()


def test_a_lane_table_changes_only_what_it_names():
    lanes, problems = lanes_of({"dataset": {"weight": 5, "max_concurrency": 64}})
    assert problems == []
    assert lanes[DATASET] == LaneSpec(
        DATASET, reservation=0.70, weight=5.0, max_concurrency=64, read_protected=True, paced_by_guard=False
    )
    assert lanes[CHECKPOINT] == default_lanes()[CHECKPOINT]


def test_a_new_lane_starts_unguaranteed_and_paced():
    lanes, problems = lanes_of({"eval": {"reservation": 0.1, "weight": 2}})
    assert problems == []
    assert list(lanes) == [DATASET, CHECKPOINT, RESTORE, METADATA, "eval"]
    assert lanes["eval"] == LaneSpec("eval", reservation=0.1, weight=2.0, paced_by_guard=True)
    assert isinstance(lanes["eval"].weight, float)


def test_a_full_example_parses_and_its_one_contradiction_is_named():
    doc = tomllib.loads(
        """
[lanes.dataset]
reservation = 0.70
weight = 7
limit = 1.0
limit_while_reads_active = 0.30
floor = 0.0
max_concurrency = 64
read_protected = true
paced_by_guard = false
"""
    )
    lanes, problems = lanes_of(doc["lanes"])
    # The issue lists every key once to show the schema; on one lane, a 0.70 guarantee and a 0.30 cap clash.
    assert problems == ["s3lanes.toml [lanes.dataset]: reservation 0.7 is above limit_while_reads_active 0.3"]
    assert lanes[DATASET].limit == 1.0 and lanes[DATASET].max_concurrency == 64
    del doc["lanes"]["dataset"]["limit_while_reads_active"]
    assert lanes_of(doc["lanes"])[1] == []


def test_every_lane_mistake_is_reported_at_once_with_its_place():
    lanes, problems = lanes_of(
        {
            "dataset": {MISSPELT: 5, "reservation": "70%"},
            "checkpoint": {"limit": 0, "floor": -0.1, "max_concurrency": 2.5, "paced_by_guard": "yes"},
            "restore": {"weight": 0, "reservation": True, "limit_while_reads_active": float("nan")},
            "metadata": {"reservation": 1.5, "max_concurrency": 0},
            "Bad Lane": {"weight": 1},
            "broken": 3,
        }
    )
    assert problems == [
        f"s3lanes.toml [lanes.dataset].{MISSPELT}: unknown setting (known: floor, limit,"
        " limit_while_reads_active, max_concurrency, paced_by_guard, read_protected, reservation, weight)",
        "s3lanes.toml [lanes.dataset].reservation: expected a fraction of backend capacity between 0 and 1"
        " (got '70%')",
        "s3lanes.toml [lanes.checkpoint].limit: expected a fraction of backend capacity greater than 0 and at"
        " most 1 (got 0)",
        "s3lanes.toml [lanes.checkpoint].floor: expected a fraction of backend capacity between 0 and 1"
        " (got -0.1)",
        "s3lanes.toml [lanes.checkpoint].max_concurrency: expected a whole number of at least 1 (got 2.5)",
        "s3lanes.toml [lanes.checkpoint].paced_by_guard: expected true or false (got 'yes')",
        "s3lanes.toml [lanes.restore].weight: expected a number greater than 0 (got 0)",
        "s3lanes.toml [lanes.restore].reservation: expected a fraction of backend capacity between 0 and 1"
        " (got True)",
        "s3lanes.toml [lanes.restore].limit_while_reads_active: expected a fraction of backend capacity"
        " greater than 0 and at most 1 (got nan)",
        "s3lanes.toml [lanes.metadata].reservation: expected a fraction of backend capacity between 0 and 1"
        " (got 1.5)",
        "s3lanes.toml [lanes.metadata].max_concurrency: expected a whole number of at least 1 (got 0)",
        "s3lanes.toml [lanes.Bad Lane]: lane names are 1-32 characters of a-z, 0-9, '_' and '-', starting"
        " with a letter",
        "s3lanes.toml [lanes.broken]: expected a table of lane settings (got 3)",
    ]
    assert lanes == default_lanes()  # nothing bad was applied


def test_reservations_may_not_promise_more_than_the_backend():
    _, problems = lanes_of({"restore": {"reservation": 0.2}, "eval": {"reservation": 0.1}})
    assert problems == [
        "s3lanes.toml [lanes]: reservations (a lane's reservation or floor, whichever is larger) sum to 1.04,"
        " more than the whole backend (1): dataset 0.7, checkpoint 0.02, restore 0.2, metadata 0.02, eval 0.1"
    ]
    _, problems = lanes_of({"dataset": {"reservation": 0.96}})  # 0.96 + 0.02 + 0.02 = 1: fine
    assert problems == []


def test_exactly_one_lane_is_read_protected():
    _, problems = lanes_of({"eval": {"read_protected": True, "paced_by_guard": False}})
    assert problems == [
        "s3lanes.toml [lanes]: exactly one lane must be read_protected, found 2: dataset, eval"
        " (set read_protected = false on all but one)"
    ]
    _, problems = lanes_of({"dataset": {"read_protected": False}})
    assert problems == [
        "s3lanes.toml [lanes]: exactly one lane must be read_protected, found none"
        " (set read_protected = true on the lane whose reads the guard protects)"
    ]
    _, problems = lanes_of(
        {"dataset": {"read_protected": False, "paced_by_guard": True}, "eval": {"read_protected": True}}
    )
    assert problems == [
        "s3lanes.toml [lanes.eval]: the read-protected lane cannot be paced by the guard that protects it"
        " (set paced_by_guard = false)"
    ]


def test_guarantees_must_fit_under_the_lane_caps():
    _, problems = lanes_of({"checkpoint": {"reservation": 0.25, "floor": 0.4, "limit": 0.35}})
    assert problems == [
        "s3lanes.toml [lanes.checkpoint]: floor 0.4 is above limit 0.35",
        "s3lanes.toml [lanes.checkpoint]: floor 0.4 is above limit_while_reads_active 0.3",
        # 0.7 + 0.4 + 0.02 > 1 as well
        "s3lanes.toml [lanes]: reservations (a lane's reservation or floor, whichever is larger) sum to 1.12,"
        " more than the whole backend (1): dataset 0.7, checkpoint 0.4, metadata 0.02",
    ]
    _, problems = lanes_of({"dataset": {"limit": 0.5}})
    assert problems == ["s3lanes.toml [lanes.dataset]: reservation 0.7 is above limit 0.5"]


def test_lanes_that_is_not_a_table():
    lanes, problems = lanes_of([1, 2])
    assert lanes == default_lanes()
    assert problems == ["s3lanes.toml [lanes]: expected a table of lane tables, like [lanes.dataset]"]


# --- rules --------------------------------------------------------------------------------------------------


def test_the_rule_from_the_issue_parses_into_a_rule():
    doc = tomllib.loads(
        """
[[rules]]
lane = "restore"
name = "dcp-files"
buckets = ["ckpt-*"]
prefixes = ["runs/"]
key_globs = ["*.distcp"]
operations = ["read"]
min_size_bytes = 0
max_size_bytes = 1073741824
access_keys = ["AKIAEXAMPLE"]
user_agents = ["*s3torchconnector*"]

[[rules]]
lane = "dataset"
key_globs = "*.bin"
"""
    )
    rules, problems = rules_of(doc["rules"])
    assert problems == []
    assert rules == (
        Rule(
            lane=RESTORE,
            name="dcp-files",
            buckets=("ckpt-*",),
            prefixes=("runs/",),
            key_globs=("*.distcp",),
            operations=("read",),
            min_size_bytes=0,
            max_size_bytes=1073741824,
            access_keys=("AKIAEXAMPLE",),
            user_agents=("*s3torchconnector*",),
        ),
        Rule(lane=DATASET, key_globs=("*.bin",)),  # a lone string is a one-item list
    )


def test_no_rules_is_no_rules():
    assert rules_of(None) == ((), [])
    assert rules_of([]) == ((), [])


def test_every_rule_mistake_is_reported_at_once_and_bad_rules_are_left_out():
    rules, problems = rules_of(
        [
            {"lane": "restore", "name": "ok-1", "key_globs": ["*.pt"]},
            {"lane": "fast", "bucket": ["x"]},
            {"name": "no-lane", "key_globs": ["a**"]},
            {"lane": "dataset", "operations": ["GetObjects", "reads"], "prefixes": ["/runs/"]},
            {"lane": "dataset", "min_size_bytes": 10, "max_size_bytes": 5, "user_agents": [1]},
            {"lane": "dataset", "max_size_bytes": "1GiB", "min_size_bytes": -1},
            {"lane": "dataset", "name": "ok-1", "buckets": ["a/b", ""], "access_keys": [""]},
            {"lane": "dataset", "name": "7", "key_globs": ["x[ab"], "user_agents": [""]},
            "lane = dataset",
            {"lane": "metadata", "operations": ["list", "HeadObject"]},
        ]
    )
    assert rules == (
        Rule(lane=RESTORE, name="ok-1", key_globs=("*.pt",)),
        Rule(lane=METADATA, operations=("list", "HeadObject")),
    )
    lanes = "checkpoint, dataset, metadata, restore"
    known_keys = (
        "lane, name, buckets, prefixes, key_globs, operations, access_keys, user_agents, min_size_bytes,"
        " max_size_bytes"
    )
    ops_hint = (
        "(use a class: read, write, delete, list, head, bucket, other; or an S3 operation name such as"
        " GetObject, PutObject, UploadPart)"
    )
    assert problems == [
        f"s3lanes.toml rules[1].bucket: unknown rule key (known: {known_keys})",
        f"s3lanes.toml rules[1].lane: unknown lane 'fast' (lanes: {lanes})",
        f"s3lanes.toml rules[2].lane: required, the name of a lane (lanes: {lanes})",
        "s3lanes.toml rules[2].key_globs: 'a**': '**' must be a whole path component (like 'a/**/b' or"
        " 'runs/**')",
        "s3lanes.toml rules[3].prefixes: '/runs/': keys do not start with '/' (write 'runs/')",
        f"s3lanes.toml rules[3].operations: unknown operation 'GetObjects' {ops_hint}",
        f"s3lanes.toml rules[3].operations: unknown operation 'reads' {ops_hint}",
        "s3lanes.toml rules[4].user_agents: expected a list of strings (got [1])",
        "s3lanes.toml rules[4].max_size_bytes: smaller than min_size_bytes (10)",
        "s3lanes.toml rules[5].max_size_bytes: expected a whole number of bytes (got '1GiB')",
        "s3lanes.toml rules[5].min_size_bytes: must not be negative",
        "s3lanes.toml rules[6].name: 'ok-1' is already the name of rules[0]",
        "s3lanes.toml rules[6].buckets: 'a/b': bucket names contain no '/'",
        "s3lanes.toml rules[6].buckets: empty bucket glob",
        "s3lanes.toml rules[6].access_keys: empty access key",
        "s3lanes.toml rules[7].name: '7' would read as a rule index; use a word",
        "s3lanes.toml rules[7].key_globs: 'x[ab': unclosed '['",
        "s3lanes.toml rules[7].user_agents: empty pattern (it would match every User-Agent)",
        "s3lanes.toml rules[8]: expected a table with at least lane = ... (got 'lane = dataset')",
    ]


def test_rules_may_use_lanes_added_in_config():
    rules, problems = rules_of([{"lane": "eval", "access_keys": ["AKEVAL"]}], LANES | {"eval"})
    assert problems == [] and rules == (Rule(lane="eval", access_keys=("AKEVAL",)),)


def test_rules_that_are_not_an_array():
    assert rules_of({"lane": "dataset"}) == (
        (),
        ["s3lanes.toml rules: expected an array of tables ([[rules]] blocks) (got {'lane': 'dataset'})"],
    )


# --- tenants ------------------------------------------------------------------------------------------------


def test_tenants_parse():
    doc = tomllib.loads(
        """
[tenants.AKIAEXAMPLE]
lanes = ["dataset", "metadata"]
[tenants.AKIANOHINTS]
lanes = []
"""
    )
    assert tenants_of(doc["tenants"]) == (
        {"AKIAEXAMPLE": frozenset({DATASET, METADATA}), "AKIANOHINTS": frozenset()},
        [],
    )
    assert tenants_of(None) == ({}, [])


def test_every_tenant_mistake_is_reported_at_once():
    tenants, problems = tenants_of(
        {
            "AKGOOD": {"lanes": ["restore"]},
            "AKTYPO": {"lanes": ["restor", "fast"]},  # codespell:ignore
            "AKEXTRA": {"lanes": ["dataset"], "buckets": ["x"]},
            "AKNOLANES": {},
            "AKSTRING": {"lanes": "dataset"},
            "AKFLAT": ["dataset"],
        }
    )
    assert tenants == {"AKGOOD": frozenset({RESTORE}), "AKEXTRA": frozenset({DATASET})}
    assert problems == [
        "s3lanes.toml [tenants.AKTYPO].lanes: unknown lane(s) 'restor', 'fast'"
        " (lanes: checkpoint, dataset, metadata, restore)",
        "s3lanes.toml [tenants.AKEXTRA].buckets: unknown tenant setting"
        " (known: lanes, read, write, list_buckets)",
        "s3lanes.toml [tenants.AKNOLANES].lanes: required: the lanes this tenant may ask for ([] for none)",
        "s3lanes.toml [tenants.AKSTRING].lanes: expected a list of lane names (got 'dataset')",
        "s3lanes.toml [tenants.AKFLAT]: expected a table with lanes = [...] (got ['dataset'])",
    ]


def test_tenants_that_is_not_a_table():
    assert tenants_of(["AK"]) == (
        {},
        ["s3lanes.toml [tenants]: expected a table of tenant tables, like [tenants.AKIAEXAMPLE]"],
    )


# --- together -----------------------------------------------------------------------------------------------


def test_a_config_file_drives_the_classifier():
    doc = tomllib.loads(
        """
[lanes.eval]
reservation = 0.05
weight = 2

[[rules]]
lane = "eval"
name = "eval-job"
access_keys = ["AKEVAL"]
operations = ["read"]

[[rules]]
lane = "restore"
name = "orbax"
prefixes = ["orbax/"]
operations = ["read"]

[tenants.AKTRAIN]
lanes = ["dataset", "checkpoint", "metadata"]
"""
    )
    problems: list[str] = []
    lanes = parse_lanes(doc.get("lanes"), SRC, problems)
    rules = parse_rules(doc.get("rules"), lanes, SRC, problems)
    tenants = parse_tenants(doc.get("tenants"), lanes, SRC, problems)
    assert problems == []
    c = Classifier(rules, frozenset(lanes), tenants, CheckpointPrefixes())

    def lane(op: str, key: str, ak: str, hint: str | None = None) -> Decision:
        return c.classify(RequestFacts(op, "b", key, ak, "ua", None, hint))

    assert lane("GetObject", "val/x.tar", "AKEVAL") == Decision("eval", "rule:eval-job")
    assert lane("GetObject", "orbax/1/d/abc", "AKTRAIN") == Decision(RESTORE, "rule:orbax")
    assert lane("GetObject", "train/x.tar", "AKTRAIN", hint="restore") == Decision(DATASET, "default:read")
    assert lane("GetObject", "train/x.tar", "AKEVAL", hint="restore") == Decision(RESTORE, "hint")


def test_mistakes_in_all_three_sections_land_in_one_list():
    problems: list[str] = []
    lanes = parse_lanes({"dataset": {"weight": -1}}, SRC, problems)
    parse_rules([{"lane": "nope"}], lanes, SRC, problems)
    parse_tenants({"AK": {"lanes": ["nope"]}}, lanes, SRC, problems)
    assert [p.split(":")[0] for p in problems] == [
        "s3lanes.toml [lanes.dataset].weight",
        "s3lanes.toml rules[0].lane",
        "s3lanes.toml [tenants.AK].lanes",
    ]
