"""The Go front door's build (tiermesh/frontdoor/build.py) and `tiermesh up`'s choice of
front door: a clear refusal without Debian's Go toolchain or for a mesh the door cannot
front yet, a binary cached by the digest of its sources, nothing left of a failed build."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import door_cache
from tests.go_toolchain import needs_go
from tiermesh.frontdoor import build as door_build
from tiermesh.frontdoor.build import FrontDoorUnavailable, build
from tiermesh.up.supervisor import Mesh, StartupError, UpOptions


def test_without_the_toolchain_it_names_the_debian_packages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = shutil.which
    monkeypatch.setattr(shutil, "which", lambda tool: None if tool == "protoc" else real(tool))
    with pytest.raises(FrontDoorUnavailable) as refused:
        build(tmp_path)
    assert str(refused.value) == (
        "the Go front door needs protoc: apt-get install golang-go golang-google-grpc-dev "
        "golang-github-gomodule-redigo-dev golang-goprotobuf-dev protobuf-compiler"
    )
    assert list(tmp_path.iterdir()) == []


def test_the_digest_follows_the_sources(tmp_path: Path) -> None:
    sources = tmp_path / "go"
    shutil.copytree(door_build.SOURCES, sources)
    sets = {"inference": b"k", "tiermeshv1": b"t"}
    first = door_build._digest(sets, sources)
    assert door_build._digest(sets, sources) == first
    assert door_build._digest(sets, door_build.SOURCES) == first  # content, not place
    main = sources / "main.go"
    main.write_text(main.read_text() + "\n// changed\n")
    assert door_build._digest(sets, sources) != first
    assert door_build._digest({**sets, "tiermeshv1": b"u"}, door_build.SOURCES) != first


@pytest.mark.slow
@needs_go
def test_a_built_door_is_found_without_building_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, go_build_cache: Path
) -> None:
    binary = build(door_cache(tmp_path, go_build_cache))
    assert binary.is_file() and binary.stat().st_mode & 0o111

    def no_build(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"built again: {args}")

    monkeypatch.setattr(subprocess, "run", no_build)
    assert build(tmp_path) == binary


@pytest.mark.slow
@needs_go
def test_a_failed_build_says_why_and_leaves_nothing(tmp_path: Path, go_build_cache: Path) -> None:
    sources = tmp_path / "go"
    shutil.copytree(door_build.SOURCES, sources)
    (sources / "broken.go").write_text("package main\n\nfunc broken() { return 1 }\n")
    with pytest.raises(FrontDoorUnavailable) as failed:
        build(door_cache(tmp_path / "cache", go_build_cache), sources=sources)
    assert "go build failed" in str(failed.value) and "broken.go" in str(failed.value)
    left = {p.name for p in (tmp_path / "cache" / "frontdoor").iterdir()}
    assert left <= {"gocache"}, left


@pytest.mark.parametrize(
    ("opts", "words"),
    [
        (UpOptions(front_door="rust"), "'rust': choose one of auto, go, python"),
        (UpOptions(extra_env={"TIERMESH_FRONT_DOOR": "c"}), "TIERMESH_FRONT_DOOR='c'"),
        (
            UpOptions(front_door="go", extra_env={"TIERMESH_TENANTS_FILE": "tenants.yaml"}),
            "the Go front door does not do API keys yet",
        ),
    ],
)
def test_up_refuses_a_door_it_cannot_run_before_starting_anything(
    opts: UpOptions, words: str, tmp_path: Path
) -> None:
    opts.data_dir = tmp_path / "data"
    mesh = Mesh(opts)
    with pytest.raises(StartupError) as refused:
        mesh.start()
    assert words in str(refused.value)
    assert mesh.redis is None and mesh.services == []
    assert not opts.data_dir.exists()


@needs_go
def test_the_go_sources_are_gofmt_clean() -> None:
    for folder in (door_build.SOURCES, Path(__file__).parents[2] / "benchmarks" / "go_front_door"):
        listed = subprocess.run(
            ["gofmt", "-l", str(folder)], capture_output=True, text=True, check=True
        )
        assert listed.stdout == "", f"gofmt -w {listed.stdout}"


# What would make `auto` choose the Python gateway, unset for these tests.
QUIET = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_TRACES_EXPORTER",
    "TIERMESH_TRACE_DIR",
    "TIERMESH_FRONT_DOOR",
    "TIERMESH_TENANTS_FILE",
    "OTEL_TRACES_SAMPLER",
)


def chosen(tmp_path: Path, **opts: Any) -> tuple[Path | None, str]:
    """The door `up` would start with these options (nothing is started), and why."""
    mesh = Mesh(UpOptions(data_dir=tmp_path / "data", **opts))
    door = mesh._front_door(tls=False)
    return door, mesh.door_choice


@pytest.mark.parametrize(
    ("env", "why"),
    [
        ({"TIERMESH_TENANTS_FILE": "tenants.yaml"}, "does not do API keys yet"),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "127.0.0.1:4317", "OTEL_TRACES_SAMPLER": "always_on"},
            "does not do OTEL_TRACES_SAMPLER=always_on yet",
        ),
        (
            {"TIERMESH_TRACE_DIR": "/tmp/spans", "OTEL_TRACES_SAMPLER": "traceidratio"},
            "does not do OTEL_TRACES_SAMPLER=traceidratio yet",
        ),
        ({"TIERMESH_FRONT_DOOR": "python"}, "asked for"),
    ],
)
def test_auto_keeps_the_python_gateway_for_what_only_it_does(
    env: dict[str, str], why: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in QUIET:
        monkeypatch.delenv(key, raising=False)
    door, choice = chosen(tmp_path, extra_env=env)
    assert door is None and choice.startswith("python") and why in choice


def test_auto_keeps_the_python_gateway_under_explicit_model_control(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in QUIET:
        monkeypatch.delenv(key, raising=False)
    door, choice = chosen(tmp_path, model_control="explicit")
    assert door is None and "explicit model control" in choice


def test_auto_without_a_go_toolchain_serves_python_and_says_how_to_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(door_build.shutil, "which", lambda tool: None)
    for key in QUIET:
        monkeypatch.delenv(key, raising=False)
    door, choice = chosen(tmp_path)
    assert door is None and "make frontdoor" in choice and "apt-get install" in choice
    with pytest.raises(StartupError, match="apt-get install"):  # asked for by name: refused
        chosen(tmp_path, front_door="go")


@needs_go
@pytest.mark.parametrize(
    "env",
    [
        {},
        # Spans with OpenTelemetry's default sampler: the door traces the calls it answers.
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "127.0.0.1:4317"},
        {"TIERMESH_TRACE_DIR": "/tmp/spans", "OTEL_TRACES_SAMPLER": "parentbased_always_on"},
        {"OTEL_TRACES_EXPORTER": "otlp"},
    ],
)
def test_auto_is_the_go_door_by_default(
    env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in QUIET:
        monkeypatch.delenv(key, raising=False)
    door, choice = chosen(tmp_path, extra_env=env)
    assert door is not None and door.is_file() and choice.startswith("go")
