"""docker-compose.yml agrees with the compose spec, with itself and with the Dockerfile.

No Docker engine runs here, so the file is validated offline against the compose spec that
check-jsonschema vendors, and the topology (commands, addresses, ports, healthchecks,
profiles, depends_on conditions, Prometheus targets) is checked by reading the files.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from cryptography import x509

from tests.unit.test_deploy_dockerfile import DOCKERFILE, final_image_env, gateway_binds
from tiermesh.up.certs import identities_in

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
PROMETHEUS = ROOT / "deploy" / "prometheus" / "prometheus.yml"
GRAFANA = ROOT / "deploy" / "grafana"

# compose service -> the tiermesh module it runs.
TIERMESH_SERVICES = {
    "gateway": "gateway",
    "router": "router",
    "postprocess": "postprocess",
    "worker-center": "worker",
    "worker-edge": "worker",
}
# Which profile starts each worker tier; everything else starts without one.
WORKER_PROFILES = {"worker-center": "center", "worker-edge": "edge"}
# Scrape job (the names the Grafana dashboard filters on) -> the kind of service it scrapes.
SCRAPE_JOBS = {
    "tiermesh-gateway": "gateway",
    "tiermesh-router": "router",
    "tiermesh-worker": "worker",
    "tiermesh-postprocess": "postprocess",
}

# Which env variable holds the port a service serves grpc.health.v1 on.
HEALTH_PORT_VAR = {
    "gateway": "TIERMESH_GATEWAY_PORT",
    "router": "TIERMESH_ROUTER_PORT",
    "worker": "TIERMESH_WORKER_HEALTH_PORT",
    "postprocess": "TIERMESH_POSTPROCESS_PORT",
}

# An address variable -> (the tiermesh service it must reach, that service's port variable).
ADDRESS_TARGETS = {
    "TIERMESH_ROUTER_ADDRESS": ("router", "TIERMESH_ROUTER_PORT"),
    "TIERMESH_POSTPROCESS_ADDRESS": ("postprocess", "TIERMESH_POSTPROCESS_PORT"),
    "TIERMESH_DELIVERY_ADVERTISE": ("gateway", "TIERMESH_DELIVERY_PORT"),
}

# Which address variables each kind of service needs to take part in the mesh.
REQUIRED_ADDRESSES = {
    "gateway": {"TIERMESH_ROUTER_ADDRESS", "TIERMESH_DELIVERY_ADVERTISE"},
    "router": set(),
    "worker": {"TIERMESH_POSTPROCESS_ADDRESS"},
    "postprocess": set(),
}

# Bind-host variables each kind of service reads; in a container they must be 0.0.0.0.
BIND_HOSTS = {
    "gateway": ("TIERMESH_GATEWAY_HOST", "TIERMESH_HTTP_HOST", "TIERMESH_DELIVERY_HOST"),
    "router": ("TIERMESH_ROUTER_HOST",),
    "worker": ("TIERMESH_WORKER_HOST",),
    "postprocess": ("TIERMESH_POSTPROCESS_HOST",),
}


# ---------------------------------------------------------------------------- helpers


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict), "docker-compose.yml is not a mapping"
    return data


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    found = compose.get("services")
    assert isinstance(found, dict) and found, "docker-compose.yml has no services"
    return found


def _env(service: dict[str, Any]) -> dict[str, str]:
    """The service's environment as a mapping, whichever of the two compose forms it uses."""
    raw = service.get("environment") or {}
    if isinstance(raw, list):
        pairs = (item.split("=", 1) if "=" in item else (item, "") for item in raw)
        return {k: v for k, v in pairs}
    return {str(k): "" if v is None else str(v) for k, v in raw.items()}


def _command(service: dict[str, Any]) -> list[str]:
    raw = service.get("command")
    if raw is None:
        return []
    return shlex.split(raw) if isinstance(raw, str) else [str(part) for part in raw]


def _module(service: dict[str, Any]) -> str | None:
    """The module a service runs with `python -m`, or None."""
    cmd = _command(service)
    if "-m" in cmd and cmd.index("-m") + 1 < len(cmd):
        return cmd[cmd.index("-m") + 1]
    return None


def _kind(service: dict[str, Any]) -> str | None:
    """Which tiermesh service (gateway, router, ...) a compose service runs, if any."""
    module = _module(service)
    if module and module.startswith("tiermesh."):
        return module.removeprefix("tiermesh.")
    return None


def _tiermesh(services: dict[str, dict[str, Any]]) -> dict[str, tuple[str, dict[str, Any]]]:
    """Compose services that run a tiermesh module: name -> (kind, service)."""
    found = {}
    for name, svc in services.items():
        kind = _kind(svc)
        if kind is not None:
            found[name] = (kind, svc)
    return found


def _split_host_port(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    assert sep and host and port.isdigit(), f"{address!r} is not host:port"
    return host, int(port)


def _depends_on(service: dict[str, Any]) -> dict[str, dict[str, Any]]:
    raw = service.get("depends_on") or {}
    if isinstance(raw, list):
        return {name: {"condition": "service_started"} for name in raw}
    return {name: spec or {"condition": "service_started"} for name, spec in raw.items()}


def _duration_s(text: str) -> float:
    """A compose duration ("1m30s", "45s", "500ms") in seconds."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, "us": 1e-6}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", text)
    assert parts and "".join(n + u for n, u in parts) == text, f"bad duration {text!r}"
    return sum(float(n) * units[u] for n, u in parts)


def _published_container_ports(service: dict[str, Any]) -> set[int]:
    ports = set()
    for entry in service.get("ports") or []:
        if isinstance(entry, dict):
            ports.add(int(entry["target"]))
        else:
            ports.add(int(str(entry).split("/")[0].rsplit(":", 1)[-1]))
    return ports


# ---------------------------------------------------------------------- compose schema


def _check_jsonschema() -> list[str]:
    script = Path(sys.executable).with_name("check-jsonschema")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "check_jsonschema"]


def test_compose_file_validates_against_the_compose_spec_offline() -> None:
    # The schema is vendored inside check-jsonschema: nothing is fetched.
    result = subprocess.run(
        [*_check_jsonschema(), "--builtin-schema", "vendor.compose-spec", str(COMPOSE)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_schema_check_rejects_a_broken_compose_file(tmp_path: Path) -> None:
    # Guards the test above against a validator that accepts anything.
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(
        "services:\n  a:\n    image: x\n    depends_on:\n      b:\n        condition: whenever\n"
    )
    result = subprocess.run(
        [*_check_jsonschema(), "--builtin-schema", "vendor.compose-spec", str(broken)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode != 0


# ------------------------------------------------------------------- compose topology


def test_compose_names_every_service(services: dict[str, dict[str, Any]]) -> None:
    for name in ("redis", "jaeger", "prometheus", "grafana", "models", *TIERMESH_SERVICES):
        assert name in services, f"docker-compose.yml has no {name!r} service"


def test_each_tiermesh_service_runs_its_own_module(services: dict[str, dict[str, Any]]) -> None:
    for name, kind in TIERMESH_SERVICES.items():
        assert _module(services[name]) == f"tiermesh.{kind}", (
            f"{name} runs {_command(services[name])}"
        )
    assert set(_tiermesh(services)) == set(TIERMESH_SERVICES)


def test_workers_come_by_tier_profile_and_the_rest_without_one(
    services: dict[str, dict[str, Any]],
) -> None:
    for name, svc in services.items():
        if name in WORKER_PROFILES:
            assert svc.get("profiles") == [WORKER_PROFILES[name]], name
            tier = _env(svc)["TIERMESH_WORKER_TIER"]
            assert tier == WORKER_PROFILES[name], f"{name} serves tier {tier}"
        else:
            assert not svc.get("profiles"), f"{name} would not start without a profile"


def test_tiermesh_services_are_built_from_the_deploy_dockerfile(
    services: dict[str, dict[str, Any]],
) -> None:
    images = set()
    for name, (_, svc) in _tiermesh(services).items():
        build = svc.get("build")
        assert isinstance(build, dict), f"{name} has no build section"
        context = ROOT / build.get("context", ".")
        assert (context / build.get("dockerfile", "Dockerfile")).resolve() == DOCKERFILE
        assert build.get("target") == "runtime", f"{name} builds {build.get('target')!r}"
        images.add(svc.get("image"))
    assert len(images) == 1, f"tiermesh services use different images: {images}"
    models = services["models"]["build"]
    assert (ROOT / models["context"] / models["dockerfile"]).resolve() == DOCKERFILE
    assert models["target"] == "models"


def test_models_are_mounted_read_only_from_the_filled_volume(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    assert "models" in compose["volumes"]
    assert services["models"]["volumes"] == ["models:/models"]
    for name, (_, svc) in _tiermesh(services).items():
        assert "models:/models:ro" in svc["volumes"], f"{name} does not mount models read-only"
        assert _env(svc)["TIERMESH_MODEL_REPOSITORY"] == "/models"
        deps = _depends_on(svc)
        assert deps["models"]["condition"] == "service_completed_successfully", name
        assert svc.get("read_only") is True, f"{name} has a writable root filesystem"
        assert svc.get("cap_drop") == ["ALL"], name


def test_addresses_point_at_services_listening_on_that_port(
    services: dict[str, dict[str, Any]],
) -> None:
    mesh = _tiermesh(services)
    for name, (kind, svc) in mesh.items():
        env = _env(svc)
        missing = REQUIRED_ADDRESSES[kind] - env.keys()
        assert not missing, f"{name} does not set {sorted(missing)}"
        for var, (target_kind, port_var) in ADDRESS_TARGETS.items():
            if var not in env:
                continue
            host, port = _split_host_port(env[var])
            assert host in services, f"{name}: {var}={env[var]} names no compose service"
            assert host in mesh and mesh[host][0] == target_kind, (
                f"{name}: {var}={env[var]} does not reach a {target_kind}"
            )
            target_env = _env(services[host])
            assert port_var in target_env, f"{host} does not set {port_var}"
            assert port == int(target_env[port_var]), (
                f"{name}: {var}={env[var]} but {host} has {port_var}={target_env[port_var]}"
            )


def test_redis_and_otlp_endpoints_reach_their_services(
    services: dict[str, dict[str, Any]],
) -> None:
    redis_cmd = _command(services["redis"])
    redis_port = int(redis_cmd[redis_cmd.index("--port") + 1]) if "--port" in redis_cmd else 6379
    for name, (_, svc) in _tiermesh(services).items():
        env = _env(svc)
        url = urlsplit(env.get("TIERMESH_REDIS_URL", ""))
        assert url.scheme == "redis" and url.hostname == "redis", f"{name}: {url.geturl()!r}"
        assert (url.port or 6379) == redis_port
        otlp = urlsplit(env.get("OTEL_EXPORTER_OTLP_ENDPOINT", ""))
        assert otlp.hostname == "jaeger" and otlp.port == 4317, f"{name}: {otlp.geturl()!r}"
        assert env.get("OTEL_SERVICE_NAME"), f"{name} has no OTEL_SERVICE_NAME"
    names = [_env(svc)["OTEL_SERVICE_NAME"] for _, svc in _tiermesh(services).values()]
    assert len(names) == len(set(names)), f"OTEL_SERVICE_NAME repeats: {names}"
    assert str(_env(services["jaeger"]).get("COLLECTOR_OTLP_ENABLED")).lower() == "true"


def test_redis_is_durable_and_checked(compose: dict[str, Any]) -> None:
    redis = compose["services"]["redis"]
    assert re.fullmatch(r"redis:7\.\d+", str(redis["image"])), redis["image"]
    cmd = _command(redis)
    assert cmd[cmd.index("--appendonly") + 1] == "yes"
    volume = str(redis["volumes"][0]).split(":")[0]
    assert volume in (compose.get("volumes") or {}), "redis data is not on a named volume"
    assert any("redis-cli ping" in str(part) for part in redis["healthcheck"]["test"])


def test_gateway_publishes_its_public_port(services: dict[str, dict[str, Any]]) -> None:
    gateway = services["gateway"]
    assert int(_env(gateway)["TIERMESH_GATEWAY_PORT"]) in _published_container_ports(gateway)
    assert int(_env(gateway)["TIERMESH_HTTP_PORT"]) in _published_container_ports(gateway)
    assert 16686 in _published_container_ports(services["jaeger"])
    assert "4317" in [str(p) for p in services["jaeger"]["expose"]]
    assert 9090 in _published_container_ports(services["prometheus"])
    assert 3000 in _published_container_ports(services["grafana"])


def test_the_published_public_ports_reach_the_gateway(services: dict[str, dict[str, Any]]) -> None:
    """Each host port compose publishes for the gateway lands on a door the gateway binds
    on 0.0.0.0 in its container (the image's environment, then the service's): gRPC and
    REST, nothing else."""
    gateway = services["gateway"]
    binds = gateway_binds({**final_image_env(), **_env(gateway)})
    published = _published_container_ports(gateway)
    doors = {door for door, (_, port) in binds.items() if port in published}
    assert doors == {"gRPC", "REST"}, f"published {published}, gateway binds {binds}"
    for door in doors:
        assert binds[door][0] == "0.0.0.0", f"{door} binds {binds[door][0]}: unreachable"


def test_the_gateway_requires_api_keys_from_a_file_the_user_names(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    """The gateway reads its tenants file from a compose secret whose file is the required
    variable TIERMESH_TENANTS_FILE: no default ships, and compose stops with the message
    after `:?` when it is unset."""
    gateway = services["gateway"]
    path = _env(gateway)["TIERMESH_TENANTS_FILE"]
    mounted = {}
    for entry in gateway.get("secrets") or []:
        source = entry if isinstance(entry, str) else entry["source"]
        target = source if isinstance(entry, str) else entry.get("target", source)
        mounted[target if target.startswith("/") else f"/run/secrets/{target}"] = source
    assert path in mounted, f"TIERMESH_TENANTS_FILE={path} is not a mounted secret: {mounted}"
    file = compose["secrets"][mounted[path]]["file"]
    required = re.fullmatch(r"\$\{TIERMESH_TENANTS_FILE:\?([^}]+)\}", file)
    assert required, f"the tenants secret's file {file!r} is not the required variable"
    assert "tenants file" in required.group(1)


def test_healthchecks_probe_each_service_on_its_own_port(
    services: dict[str, dict[str, Any]],
) -> None:
    for name, (kind, svc) in _tiermesh(services).items():
        test = [str(part) for part in svc["healthcheck"]["test"]]
        assert test[:4] == ["CMD", "python", "-m", "tiermesh.cli.probe"], f"{name}: {test}"
        port = _env(svc)[HEALTH_PORT_VAR[kind]]
        # Internal ports speak mutual TLS: the probe presents the service's own certificate.
        internal = ["--internal-tls"] if kind != "gateway" else []
        assert test[4:] == [*internal, f"127.0.0.1:{port}"], f"{name} probes {test[4:]}"


def test_depends_on_names_existing_services_without_cycles(
    services: dict[str, dict[str, Any]],
) -> None:
    graph = {name: _depends_on(svc) for name, svc in services.items()}
    for name, deps in graph.items():
        for dep, spec in deps.items():
            assert dep in services, f"{name} depends on missing service {dep!r}"
            if spec.get("condition") == "service_healthy":
                assert "healthcheck" in services[dep], f"{name} waits on {dep}'s missing check"

    visiting: set[str] = set()
    done: set[str] = set()

    def visit(node: str) -> None:
        assert node not in visiting, f"depends_on cycle through {node}"
        if node in done:
            return
        visiting.add(node)
        for dep in graph[node]:
            visit(dep)
        visiting.remove(node)
        done.add(node)

    for node in graph:
        visit(node)

    for name, (_, svc) in _tiermesh(services).items():
        assert _depends_on(svc).get("redis", {}).get("condition") == "service_healthy", name
    for hop in ("router", "postprocess"):
        assert _depends_on(services["gateway"])[hop]["condition"] == "service_healthy"
    for worker in WORKER_PROFILES:
        assert _depends_on(services[worker])["postprocess"]["condition"] == "service_healthy"
    assert _depends_on(services["grafana"])["prometheus"]["condition"] == "service_healthy"


def test_stop_grace_period_outlasts_the_drain(services: dict[str, dict[str, Any]]) -> None:
    for name, (_, svc) in _tiermesh(services).items():
        drain = float(_env(svc).get("TIERMESH_SHUTDOWN_GRACE_S", "10"))
        grace = _duration_s(str(svc.get("stop_grace_period", "10s")))
        assert grace > drain, f"{name}: stop_grace_period {grace}s <= drain {drain}s"


def test_services_listen_on_all_interfaces(services: dict[str, dict[str, Any]]) -> None:
    image_env = final_image_env()
    for name, (kind, svc) in _tiermesh(services).items():
        env = {**image_env, **_env(svc)}
        for var in BIND_HOSTS[kind]:
            assert env.get(var) == "0.0.0.0", f"{name}: {var}={env.get(var)!r}"


# ------------------------------------------------------------------ prometheus, grafana


def test_prometheus_scrapes_every_tiermesh_service_on_its_metrics_port(
    services: dict[str, dict[str, Any]],
) -> None:
    mount = "./deploy/prometheus/prometheus.yml:/etc/prometheus/prometheus.yml:ro"
    assert mount in services["prometheus"]["volumes"]
    config = yaml.safe_load(PROMETHEUS.read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(SCRAPE_JOBS) <= set(jobs), sorted(jobs)
    scraped: set[str] = set()
    for job_name, kind in SCRAPE_JOBS.items():
        for sd in jobs[job_name]["dns_sd_configs"]:
            for host in sd["names"]:
                assert host in services, f"{job_name} scrapes unknown service {host!r}"
                assert TIERMESH_SERVICES.get(host) == kind, f"{job_name} scrapes {host}"
                env = _env(services[host])
                assert int(env["TIERMESH_METRICS_PORT"]) == sd["port"], (job_name, host)
                assert env["TIERMESH_METRICS_HOST"] == "0.0.0.0", host
                scraped.add(host)
    assert scraped == set(TIERMESH_SERVICES), f"not scraped: {set(TIERMESH_SERVICES) - scraped}"


def test_grafana_is_provisioned_with_prometheus_and_the_dashboard(
    services: dict[str, dict[str, Any]],
) -> None:
    grafana = services["grafana"]
    mounts = {str(v).split(":")[0]: str(v).split(":")[1] for v in grafana["volumes"]}
    assert mounts["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"
    dashboard_in = mounts["./deploy/grafana/tiermesh-dashboard.json"]
    sources = yaml.safe_load((GRAFANA / "provisioning/datasources/prometheus.yml").read_text())
    (source,) = sources["datasources"]
    assert source["type"] == "prometheus" and source["isDefault"] is True
    url = urlsplit(source["url"])
    assert url.hostname == "prometheus"
    assert url.port in _published_container_ports(services["prometheus"])
    providers = yaml.safe_load((GRAFANA / "provisioning/dashboards/tiermesh.yml").read_text())
    (provider,) = providers["providers"]
    assert dashboard_in.startswith(provider["options"]["path"].rstrip("/") + "/")


# ------------------------------------------------------------- secrets and internal mTLS


def _as_run(text: str) -> str:
    """A command as the container gets it: compose turns `$$` into `$`."""
    return text.replace("$$", "$")


def _secrets_of(service: dict[str, Any]) -> dict[str, str]:
    """Where each compose secret a service mounts appears in it: path -> secret name."""
    mounted = {}
    for entry in service.get("secrets") or []:
        source = entry if isinstance(entry, str) else entry["source"]
        target = source if isinstance(entry, str) else entry.get("target", source)
        mounted[target if target.startswith("/") else f"/run/secrets/{target}"] = source
    return mounted


def test_redis_wants_a_password_from_a_secret_the_user_names(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    """Redis's password is the compose secret redis_password, from the required variable
    TIERMESH_REDIS_PASSWORD_FILE: redis-server reads it into a config file on a tmpfs (not
    its command line), every tiermesh service's entrypoint puts it into TIERMESH_REDIS_URL,
    and no environment value in the file carries a password."""
    file = compose["secrets"]["redis_password"]["file"]
    required = re.fullmatch(r"\$\{TIERMESH_REDIS_PASSWORD_FILE:\?([^}]+)\}", file)
    assert required and "openssl rand" in required.group(1), file
    redis = services["redis"]
    assert "/run/secrets/redis_password" in _secrets_of(redis)
    script = _as_run(_command(redis)[2])
    assert 'requirepass %s\\n" "$(cat /run/secrets/redis_password)" > /tmp/secret.conf' in script
    assert "exec redis-server /tmp/secret.conf" in script and "/tmp" in redis["tmpfs"]
    check = _as_run(" ".join(str(p) for p in redis["healthcheck"]["test"]))
    assert 'REDISCLI_AUTH="$(cat /run/secrets/redis_password)"' in check
    for name, (_, svc) in _tiermesh(services).items():
        assert "/run/secrets/redis_password" in _secrets_of(svc), name
        entry = [_as_run(str(part)) for part in svc["entrypoint"]]
        assert entry[:2] == ["sh", "-c"] and entry[2].endswith('exec "$@"'), name
        assert 'TIERMESH_REDIS_URL="redis://:$(cat /run/secrets/redis_password)@' in entry[2]
        assert urlsplit(_env(svc)["TIERMESH_REDIS_URL"]).password is None, name
    for name, svc in services.items():
        for key, value in _env(svc).items():
            assert "PASSWORD" not in key or key.endswith("_FILE"), (name, key)
            assert urlsplit(value).password is None if "://" in value else True, (name, key)


def test_redis_refuses_writes_past_its_bound_rather_than_evicting(
    services: dict[str, dict[str, Any]],
) -> None:
    cmd = _command(services["redis"])
    assert cmd[cmd.index("--maxmemory") + 1] == "1gb"
    assert cmd[cmd.index("--maxmemory-policy") + 1] == "noeviction"


# compose service -> the identity (core/callers.py) its certificate must name.
IDENTITY = {
    "gateway": "gateway",
    "router": "router",
    "postprocess": "postprocess",
    "worker-center": "worker",
    "worker-edge": "worker",
}


def test_internal_mtls_with_a_certificate_per_service(
    services: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    """The one-shot internal-tls service makes the certificates (its command run here, into
    a folder of this test's own); each tiermesh service trusts the CA and presents the
    certificate naming its identity; each address a service dials is a name in the
    certificate of the service it reaches; every service waits for internal-tls."""
    maker = services["internal-tls"]
    script = _command(maker)[2]
    folder = "/etc/tiermesh/tls"
    assert f"internal-tls:{folder}" in maker["volumes"]
    assert script.startswith(f"test -f {folder}/ca.pem || exec python -m tiermesh.cli.main")
    argv = shlex.split(script.split("exec ", 1)[1])
    made = tmp_path / "tls"
    argv[argv.index(folder)] = str(made)  # the container's folder: this test's own instead
    subprocess.run([sys.executable, *argv[1:]], capture_output=True, timeout=60, check=True)
    for name, (_, svc) in _tiermesh(services).items():
        env = _env(svc)
        assert f"internal-tls:{folder}:ro" in svc["volumes"], name
        assert env["TIERMESH_INTERNAL_TLS_CA_FILE"] == f"{folder}/ca.pem", name
        identity = IDENTITY[name]
        assert env["TIERMESH_INTERNAL_TLS_CERT_FILE"] == f"{folder}/{identity}.pem", name
        assert env["TIERMESH_INTERNAL_TLS_KEY_FILE"] == f"{folder}/{identity}.key", name
        assert identities_in(made / f"{identity}.pem") == {identity}, name
        condition = _depends_on(svc)["internal-tls"]["condition"]
        assert condition == "service_completed_successfully", name
        for var, (target, _) in ADDRESS_TARGETS.items():
            if var in env:
                host = env[var].rpartition(":")[0]
                cert = x509.load_pem_x509_certificate(
                    (made / f"{IDENTITY[target]}.pem").read_bytes()
                )
                san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
                assert host in san.get_values_for_type(x509.DNSName), (name, var, host)
