"""The deployment files agree with the compose spec and with each other.

No Docker engine runs here, so docker-compose.yml is validated offline against the compose
spec that check-jsonschema vendors, and the topology (commands, addresses, ports,
healthchecks) is checked by reading the files.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import grpc
import pytest
import yaml
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"

TIERMESH_SERVICES = ("gateway", "router", "worker", "postprocess")

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
    "gateway": ("TIERMESH_GATEWAY_HOST", "TIERMESH_DELIVERY_HOST"),
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


def _dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs with comments dropped and continuations joined."""
    lines: list[str] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        lines.append(pending + stripped)
        pending = ""
    if pending:
        lines.append(pending)
    out = []
    for line in lines:
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def _stages() -> list[list[tuple[str, str]]]:
    stages: list[list[tuple[str, str]]] = []
    for ins in _dockerfile_instructions():
        if ins[0] == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(ins)
    return stages


def _dockerfile_env(instructions: list[tuple[str, str]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for word, args in instructions:
        if word == "ENV":
            for token in shlex.split(args):
                key, sep, value = token.partition("=")
                if sep:
                    env[key] = value
    return env


def _exec_form(args: str) -> list[str]:
    value = json.loads(args) if args.startswith("[") else shlex.split(args)
    return [str(v) for v in value]


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
    for name in ("redis", "jaeger", *TIERMESH_SERVICES):
        assert name in services, f"docker-compose.yml has no {name!r} service"


def test_each_tiermesh_service_runs_its_own_module(services: dict[str, dict[str, Any]]) -> None:
    for name in TIERMESH_SERVICES:
        assert _module(services[name]) == f"tiermesh.{name}", (
            f"{name} runs {_command(services[name])}"
        )
    for name, (kind, _) in _tiermesh(services).items():
        assert kind in TIERMESH_SERVICES, f"{name} runs unknown module tiermesh.{kind}"


def test_tiermesh_services_are_built_from_the_deploy_dockerfile(
    services: dict[str, dict[str, Any]],
) -> None:
    images = set()
    for name, (_, svc) in _tiermesh(services).items():
        build = svc.get("build")
        assert isinstance(build, dict), f"{name} has no build section"
        context = ROOT / build.get("context", ".")
        assert (context / build.get("dockerfile", "Dockerfile")).resolve() == DOCKERFILE
        images.add(svc.get("image"))
    assert len(images) == 1, f"tiermesh services use different images: {images}"


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
    assert str(redis["image"]).startswith("redis:7")
    cmd = _command(redis)
    assert cmd[cmd.index("--appendonly") + 1] == "yes"
    volume = str(redis["volumes"][0]).split(":")[0]
    assert volume in (compose.get("volumes") or {}), "redis data is not on a named volume"
    assert "redis-cli" in redis["healthcheck"]["test"]


def test_gateway_publishes_its_public_port(services: dict[str, dict[str, Any]]) -> None:
    gateway = services["gateway"]
    assert int(_env(gateway)["TIERMESH_GATEWAY_PORT"]) in _published_container_ports(gateway)
    assert 16686 in _published_container_ports(services["jaeger"])


def test_healthchecks_probe_each_service_on_its_own_port(
    services: dict[str, dict[str, Any]],
) -> None:
    for name, (kind, svc) in _tiermesh(services).items():
        test = [str(part) for part in svc["healthcheck"]["test"]]
        assert test[:3] == ["CMD", "python", "-c"], f"{name}: {test}"
        assert "grpc_health" in test[3]
        assert test[4:] == [_env(svc)[HEALTH_PORT_VAR[kind]]], f"{name} probes {test[4:]}"


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
    assert _depends_on(services["gateway"])["router"]["condition"] == "service_healthy"
    assert _depends_on(services["worker"])["postprocess"]["condition"] == "service_healthy"


def test_stop_grace_period_outlasts_the_drain(services: dict[str, dict[str, Any]]) -> None:
    for name, (_, svc) in _tiermesh(services).items():
        drain = float(_env(svc).get("TIERMESH_SHUTDOWN_GRACE_S", "10"))
        grace = _duration_s(str(svc.get("stop_grace_period", "10s")))
        assert grace > drain, f"{name}: stop_grace_period {grace}s <= drain {drain}s"


def test_services_listen_on_all_interfaces(services: dict[str, dict[str, Any]]) -> None:
    image_env = _dockerfile_env(_stages()[-1])
    for name, (kind, svc) in _tiermesh(services).items():
        env = {**image_env, **_env(svc)}
        for var in BIND_HOSTS[kind]:
            assert env.get(var) == "0.0.0.0", f"{name}: {var}={env.get(var)!r}"


# ------------------------------------------------------------------ healthcheck probe


@pytest.fixture
def health_server() -> Iterator[tuple[int, health.HealthServicer]]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield port, servicer
    finally:
        server.stop(grace=None)


def test_healthcheck_probe_follows_the_serving_status(
    services: dict[str, dict[str, Any]],
    health_server: tuple[int, health.HealthServicer],
) -> None:
    port, servicer = health_server
    probe = str(services["router"]["healthcheck"]["test"][3])

    def run_probe() -> int:
        cmd = [sys.executable, "-c", probe, str(port)]
        return subprocess.run(cmd, capture_output=True, timeout=30, check=False).returncode

    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    assert run_probe() == 0
    servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    assert run_probe() != 0


# ------------------------------------------------------------------- Dockerfile


def test_dockerfile_builds_the_package_and_models_and_runs_a_service() -> None:
    stages = _stages()
    assert stages, "deploy/Dockerfile has no FROM"
    # Build arguments declared before the first FROM may name the base image.
    build_args: dict[str, str] = {}
    for word, args in _dockerfile_instructions():
        if word == "FROM":
            break
        if word == "ARG":
            key, _, value = args.partition("=")
            build_args[key] = value
    for stage in stages:
        base = stage[0][1].split()[0]
        base = re.sub(r"\$\{(\w+)\}", lambda m: build_args.get(m.group(1), m.group(0)), base)
        assert base == "python:3.11-slim", f"stage based on {base}"

    runs = " ".join(args for stage in stages for word, args in stage if word == "RUN")
    assert re.search(r"pip install\b[^&]*\s\.(\s|$)", runs), "the package is not pip installed"
    assert "tiermesh models build" in runs

    final = stages[-1]
    users = [args for word, args in final if word == "USER"]
    assert users, "the final stage runs as root"
    assert users[-1].split(":")[0] not in ("root", "0")

    start = [_exec_form(args) for word, args in final if word in ("CMD", "ENTRYPOINT")]
    assert start, "no CMD or ENTRYPOINT"
    assert any(part.startswith("tiermesh") for cmd in start for part in cmd), start
    assert start[-1][-2:] == ["-m", "tiermesh.gateway"]


def test_dockerignore_keeps_local_state_out_and_build_inputs_in() -> None:
    patterns = [
        line.strip()
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for needed in (".venv", ".git", ".tiermesh", "**/__pycache__"):
        assert needed in patterns, f".dockerignore does not exclude {needed}"

    sources = []
    for word, args in _dockerfile_instructions():
        if word == "COPY" and "--from=" not in args:
            parts = [p for p in _exec_form(args) if not p.startswith("--")]
            sources += [p for p in parts[:-1] if "*" not in p]
    assert {"pyproject.toml", "services", "models"} <= set(sources), sources
    for source in sources:
        assert (ROOT / source).exists() or source == "models", f"COPY {source} is missing"
        for pattern in patterns:
            if pattern.startswith("!"):
                continue
            assert not fnmatch.fnmatch(source, pattern.removeprefix("/")), (
                f"COPY {source} is excluded by .dockerignore {pattern!r}"
            )
