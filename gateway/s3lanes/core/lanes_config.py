"""Lane, rule and tenant configuration, parsed from already-loaded TOML tables. Pure; no I/O.

Theory of operation
-------------------
``s3lanes.config`` reads the TOML file and hands this module the raw ``[lanes]``, ``[[rules]]`` and
``[tenants]`` values together with its list of problems. Each ``parse_*`` function returns the best value it
can build and appends every mistake it finds to ``problems`` as ``"<where>: <what>"``, naming the source
(``where``, e.g. the file path) and the place inside it (``[lanes.dataset].weight``, ``rules[2].lane``,
``[tenants.AKIA...].lanes``). It never raises for bad input, so the loader reports a whole file's mistakes in
one round, the way ``s3lanes.config`` does for its own sections. Invalid rules are left out of the returned
tuple (the Classifier refuses them); invalid lane settings keep their defaults. Either way the loader must
not start with a non-empty problem list.

Lanes merge over :func:`default_lanes`: the four default lanes always exist, a ``[lanes.<name>]``
table changes only the settings it names, and a table for a new name adds a lane starting from
``LaneSpec(name)``'s defaults. Cross-lane checks run on the merged result: reservations (a lane's
guarantee is the larger of its reservation and its floor) sum to at most 1, and exactly one lane is
``read_protected`` (the lane the read-latency guard protects; it is never paced by that guard itself).

Settings are fractions of the backend's capacity (``reservation``, ``limit``, ``limit_while_reads_active``,
``floor``), a unitless relative ``weight``, and a count (``max_concurrency``). The scheduler gives them
meaning; this module only checks that they are consistent.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import replace
from typing import Any

from s3lanes.core.access import Grant, TenantPolicy
from s3lanes.core.classify import (
    CHECKPOINT,
    DATASET,
    LANE_NAME_RE,
    METADATA,
    RESTORE,
    Rule,
    rule_problems,
)
from s3lanes.core.scheduler import LaneSpec


def default_lanes() -> dict[str, LaneSpec]:
    """The four built-in lanes, what the gateway runs without a ``[lanes]`` table (and what the simulations
    in tests/sim check). Guarantees (``max(reservation, floor)``) sum to 0.74. A fresh dict each call."""
    return {
        DATASET: LaneSpec(DATASET, reservation=0.70, weight=7.0, read_protected=True, paced_by_guard=False),
        CHECKPOINT: LaneSpec(
            CHECKPOINT,
            reservation=0.0,
            weight=3.0,
            limit_while_reads_active=0.30,
            floor=0.02,
            paced_by_guard=True,
        ),
        RESTORE: LaneSpec(
            RESTORE, reservation=0.0, weight=2.0, limit_while_reads_active=0.30, paced_by_guard=True
        ),
        # Not paced by the guard: LIST and HEAD are small and dataset loaders issue them (s3fs HEADs before a
        # GET, shard lists at epoch start), so slowing them would add latency to the reads being protected.
        METADATA: LaneSpec(METADATA, reservation=0.02, weight=1.0, paced_by_guard=False),
    }


# --- lanes --------------------------------------------------------------------------------------------------

_FRACTION = "a fraction of backend capacity between 0 and 1"
_POSITIVE_FRACTION = "a fraction of backend capacity greater than 0 and at most 1"

# key -> kind of value
_LANE_SCHEMA: dict[str, str] = {
    "reservation": "fraction",
    "weight": "weight",
    "limit": "positive_fraction",
    "limit_while_reads_active": "positive_fraction",
    "floor": "fraction",
    "max_concurrency": "count",
    "read_protected": "bool",
    "paced_by_guard": "bool",
}


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    out = float(value)
    return out if math.isfinite(out) else None


def _lane_value(kind: str, value: Any) -> tuple[Any, str | None]:
    """(converted value, None) or (None, what is wrong)."""
    got = f" (got {value!r})"
    if kind == "bool":
        return (value, None) if isinstance(value, bool) else (None, "expected true or false" + got)
    if kind == "count":
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            return None, "expected a whole number of at least 1" + got
        return value, None
    number = _number(value)
    if kind == "weight":
        if number is None or number <= 0:
            return None, "expected a number greater than 0" + got
        return number, None
    if kind == "fraction":
        if number is None or not 0.0 <= number <= 1.0:
            return None, f"expected {_FRACTION}" + got
        return number, None
    if kind == "positive_fraction":
        if number is None or not 0.0 < number <= 1.0:
            return None, f"expected {_POSITIVE_FRACTION}" + got
        return number, None
    raise AssertionError(kind)  # pragma: no cover - every kind of _LANE_SCHEMA is handled above


def parse_lanes(raw: Mapping[str, Any] | None, where: str, problems: list[str]) -> dict[str, LaneSpec]:
    """The ``[lanes]`` table merged over the defaults. Problems are appended to ``problems``."""
    lanes = default_lanes()
    if raw is not None and not isinstance(raw, Mapping):
        problems.append(f"{where} [lanes]: expected a table of lane tables, like [lanes.dataset]")
        raw = None
    for name, table in (raw or {}).items():
        place = f"{where} [lanes.{name}]"
        if not isinstance(name, str) or not LANE_NAME_RE.match(name):
            problems.append(
                f"{place}: lane names are 1-32 characters of a-z, 0-9, '_' and '-', starting with a letter"
            )
            continue
        if not isinstance(table, Mapping):
            problems.append(f"{place}: expected a table of lane settings (got {table!r})")
            continue
        values: dict[str, Any] = {}
        for key, value in table.items():
            kind = _LANE_SCHEMA.get(key)
            if kind is None:
                problems.append(f"{place}.{key}: unknown setting (known: {', '.join(sorted(_LANE_SCHEMA))})")
                continue
            converted, what = _lane_value(kind, value)
            if what is not None:
                problems.append(f"{place}.{key}: {what}")
                continue
            values[key] = converted
        lanes[name] = replace(lanes.get(name) or LaneSpec(name), **values)
    _check_lanes(lanes, where, problems)
    return lanes


def _check_lanes(lanes: Mapping[str, LaneSpec], where: str, problems: list[str]) -> None:
    for lane in lanes.values():
        problems.extend(f"{where} [lanes.{lane.name}]: {problem}" for problem in lane.problems())
    total = sum(lane.guaranteed for lane in lanes.values())
    if total > 1.0 + 1e-9:
        parts = ", ".join(f"{lane.name} {lane.guaranteed:g}" for lane in lanes.values() if lane.guaranteed)
        problems.append(
            f"{where} [lanes]: reservations (a lane's reservation or floor, whichever is larger) sum to"
            f" {total:g}, more than the whole backend (1): {parts}"
        )
    protected = [lane.name for lane in lanes.values() if lane.read_protected]
    if len(protected) > 1:
        problems.append(
            f"{where} [lanes]: exactly one lane must be read_protected, found {len(protected)}:"
            f" {', '.join(protected)} (set read_protected = false on all but one)"
        )
    elif not protected:
        problems.append(
            f"{where} [lanes]: exactly one lane must be read_protected, found none"
            " (set read_protected = true on the lane whose reads the guard protects)"
        )


# --- rules --------------------------------------------------------------------------------------------------

_RULE_LIST_FIELDS = ("buckets", "prefixes", "key_globs", "operations", "access_keys", "user_agents")
_RULE_SIZE_FIELDS = ("min_size_bytes", "max_size_bytes")
_RULE_KEYS = ("lane", "name", *_RULE_LIST_FIELDS, *_RULE_SIZE_FIELDS)


def parse_rules(raw: Any, lanes: Collection[str], where: str, problems: list[str]) -> tuple[Rule, ...]:
    """The ``[[rules]]`` array, in order. Rules with any problem are reported and left out."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        problems.append(f"{where} rules: expected an array of tables ([[rules]] blocks) (got {raw!r})")
        return ()
    rules: list[Rule] = []
    names: dict[str, int] = {}
    for i, item in enumerate(raw):
        place = f"{where} rules[{i}]"
        if not isinstance(item, Mapping):
            problems.append(f"{place}: expected a table with at least lane = ... (got {item!r})")
            continue
        before = len(problems)
        for key in item:
            if key not in _RULE_KEYS:
                problems.append(f"{place}.{key}: unknown rule key (known: {', '.join(_RULE_KEYS)})")
        lane = item.get("lane")
        lane_given = isinstance(lane, str) and bool(lane)
        if not lane_given:
            problems.append(f"{place}.lane: required, the name of a lane (lanes: {', '.join(sorted(lanes))})")
        name = item.get("name", "")
        if not isinstance(name, str):
            problems.append(f"{place}.name: expected a string (got {name!r})")
            name = ""
        elif name.isdigit():
            problems.append(f"{place}.name: {name!r} would read as a rule index; use a word")
        elif name and name in names:
            problems.append(f"{place}.name: {name!r} is already the name of rules[{names[name]}]")
        elif name:
            names[name] = i
        fields: dict[str, Any] = {}
        for key in _RULE_LIST_FIELDS:
            if key in item:
                value = _string_list(item[key])
                if value is None:
                    problems.append(f"{place}.{key}: expected a list of strings (got {item[key]!r})")
                else:
                    fields[key] = value
        for key in _RULE_SIZE_FIELDS:
            if key in item:
                value = item[key]
                if isinstance(value, bool) or not isinstance(value, int):
                    problems.append(f"{place}.{key}: expected a whole number of bytes (got {value!r})")
                else:
                    fields[key] = value
        rule = Rule(lane=lane if isinstance(lane, str) else "", name=name, **fields)
        for field_name, what in rule_problems(rule, lanes):
            if field_name != "lane" or lane_given:  # a missing lane is reported above
                problems.append(f"{place}.{field_name}: {what}")
        if len(problems) == before:
            rules.append(rule)
    return tuple(rules)


def _string_list(value: Any) -> tuple[str, ...] | None:
    """A list of strings, or one string standing for a one-item list; None if neither."""
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    return None


# --- tenants ------------------------------------------------------------------------------------------------

_TENANT_KEYS = ("lanes", "read", "write", "list_buckets")


def parse_tenants(
    raw: Any, lanes: Collection[str], where: str, problems: list[str]
) -> dict[str, frozenset[str]]:
    """``[tenants.<access key>]`` tables: the lanes each listed tenant may ask for with a hint.

    A tenant not listed may use every lane. ``lanes = []`` lists a tenant whose hints are all ignored.
    """
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        problems.append(f"{where} [tenants]: expected a table of tenant tables, like [tenants.AKIAEXAMPLE]")
        return {}
    known = ", ".join(sorted(lanes))
    out: dict[str, frozenset[str]] = {}
    for access_key, table in raw.items():
        place = f"{where} [tenants.{access_key}]"
        if not isinstance(access_key, str) or not access_key:
            problems.append(f"{place}: the table name must be an access key")
            continue
        if not isinstance(table, Mapping):
            problems.append(f"{place}: expected a table with lanes = [...] (got {table!r})")
            continue
        for key in table:
            if key not in _TENANT_KEYS:
                problems.append(f"{place}.{key}: unknown tenant setting (known: {', '.join(_TENANT_KEYS)})")
        if "lanes" not in table:
            problems.append(f"{place}.lanes: required: the lanes this tenant may ask for ([] for none)")
            continue
        value = table["lanes"]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            problems.append(f"{place}.lanes: expected a list of lane names (got {value!r})")
            continue
        unknown = [v for v in value if v not in lanes]
        if unknown:
            problems.append(
                f"{place}.lanes: unknown lane(s) {', '.join(map(repr, unknown))} (lanes: {known})"
            )
            continue
        out[access_key] = frozenset(value)
    return out


def parse_tenant_policies(raw: Any, where: str, problems: list[str]) -> dict[str, TenantPolicy]:
    """Access policies of the ``[tenants.<access key>]`` tables that have ``read`` or ``write`` grants
    (:mod:`s3lanes.core.access`). Their ``lanes`` (checked by :func:`parse_tenants`) become the lanes the
    tenant may use."""
    out: dict[str, TenantPolicy] = {}
    if not isinstance(raw, Mapping):
        return out
    for access_key, table in raw.items():
        if not isinstance(table, Mapping) or not ("read" in table or "write" in table):
            continue
        place = f"{where} [tenants.{access_key}]"
        grants: dict[str, tuple[Grant, ...]] = {}
        for name in ("read", "write"):
            value = table.get(name, [])
            if isinstance(value, str):
                value = [value]
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                problems.append(
                    f"{place}.{name}: expected a list of 'bucket' or 'bucket/prefix' (got {value!r})"
                )
                continue
            try:
                grants[name] = tuple(Grant.parse(v) for v in value)
            except ValueError as exc:
                problems.append(f"{place}.{name}: {exc}")
        list_buckets = table.get("list_buckets", False)
        if not isinstance(list_buckets, bool):
            problems.append(f"{place}.list_buckets: expected true or false")
            list_buckets = False
        lanes = table.get("lanes")
        out[str(access_key)] = TenantPolicy(
            read=grants.get("read", ()),
            write=grants.get("write", ()),
            lanes=frozenset(lanes) if isinstance(lanes, list) else None,
            list_buckets=list_buckets,
        )
    return out
