"""Lane hints and write-through, as request headers added by botocore event hooks.

A hint travels to the hooks as an extra API parameter (``S3LanesLane``, ``S3LanesWriteThrough``) that a
``before-parameter-build`` hook pops into the request context before botocore validates the parameters, and a
``before-call`` hook turns into a header. ``before-call`` runs before the request is signed, so the header is
inside the SigV4 signature (the gateway verifies it; a plain S3 store ignores unknown ``x-*`` headers). The
same parameters therefore work on the raw client:
``client.s3.get_object(Bucket=b, Key=k, S3LanesLane="restore")``.

This is not the gateway's classifier: the gateway decides, and ignores a hint the tenant may not use
(docs/lanes.md). A response tells the lane used in its ``x-s3lanes-lane`` header.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Any

LANE_HEADER = "x-s3lanes-lane"
WRITE_THROUGH_HEADER = "x-s3lanes-write-through"
LANE_PARAM = "S3LanesLane"
WRITE_THROUGH_PARAM = "S3LanesWriteThrough"
_CTX_LANE = "s3lanes_lane"
_CTX_WRITE_THROUGH = "s3lanes_write_through"
_LANE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")


class Lane(StrEnum):
    """The gateway's built-in lanes. Any other lane name configured on the gateway can be passed as a str."""

    DATASET = "dataset"
    CHECKPOINT = "checkpoint"
    RESTORE = "restore"
    METADATA = "metadata"


def check_lane(lane: str | None) -> str | None:
    """Validate a lane name. None and ``""`` both mean "send no hint"; the result is None for them."""
    if lane is None or lane == "":
        return None
    if not _LANE_NAME.fullmatch(lane):
        raise ValueError(f"not a lane name: {lane!r}")
    return str(lane)


class HintHooks:
    """The two hooks for one client; ``default_lane`` is sent when a call names none."""

    def __init__(self, default_lane: str | None) -> None:
        self.default_lane = check_lane(default_lane)

    def register(self, events: Any) -> None:
        events.register("before-parameter-build.s3", self.pop_params, unique_id="s3lanes-hint-params")
        events.register("before-call.s3", self.add_headers, unique_id="s3lanes-hint-headers")

    def pop_params(self, params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        if LANE_PARAM in params:
            lane = params.pop(LANE_PARAM)
            context[_CTX_LANE] = check_lane(lane)  # "" or None: explicitly no hint
        if WRITE_THROUGH_PARAM in params:
            context[_CTX_WRITE_THROUGH] = bool(params.pop(WRITE_THROUGH_PARAM))

    def add_headers(self, params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        headers = params.setdefault("headers", {})
        lane = context.get(_CTX_LANE, self.default_lane)
        if lane is not None:
            headers[LANE_HEADER] = lane
        if context.get(_CTX_WRITE_THROUGH):
            headers[WRITE_THROUGH_HEADER] = "true"
