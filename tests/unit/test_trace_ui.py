"""Where `tiermesh up` looks for the optional tracing UI, and what the services get."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tiermesh.up import trace_ui
from tiermesh.up.trace_ui import TraceUI, phoenix_command, start_trace_ui


def test_an_explicit_binary_wins(tmp_path: Path) -> None:
    binary = tmp_path / "phoenix"
    binary.write_text("#!/bin/sh\n")
    assert phoenix_command({"TIERMESH_TRACE_UI_BIN": str(binary)}) == [str(binary), "serve"]


def test_nothing_installed_means_no_ui(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)  # no .tiermesh/trace-ui here
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("TIERMESH_TRACE_UI_BIN", raising=False)
    assert phoenix_command({}) is None
    assert start_trace_ui(tmp_path) is None
    assert "make trace-ui" in capsys.readouterr().err


def test_services_export_to_it_over_otlp() -> None:
    proc = subprocess.Popen(["true"])
    proc.wait()
    env = TraceUI(proc, "http://127.0.0.1:6006", "http://127.0.0.1:4317").otel_env()
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://127.0.0.1:4317"
    assert env["OTEL_TRACES_EXPORTER"] == "otlp"
    assert trace_ui.LOCAL_INSTALL.parts[:2] == (".tiermesh", "trace-ui")
