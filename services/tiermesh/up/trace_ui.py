"""An optional local tracing UI for `tiermesh up` (TIERMESH_TRACE_UI=1): Arize Phoenix, a
PyPI-installable OTLP receiver with a web UI. It needs protobuf 7 and tritonclient needs 6,
so it lives in its own environment: `make trace-ui` installs it into .tiermesh/trace-ui/
(or put a `phoenix` on PATH, or name it with TIERMESH_TRACE_UI_BIN). The services then
export their spans to it over OTLP/gRPC through the standard OTEL_* variables."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tiermesh.up.processes import environ_with, free_port, spawn

INSTALL_HINT = (
    "TIERMESH_TRACE_UI=1 wants a local tracing UI, but Arize Phoenix was not found: run "
    "`make trace-ui` once (its own environment under .tiermesh/trace-ui), or point "
    "OTEL_EXPORTER_OTLP_ENDPOINT at a collector. Starting without a UI."
)
LOCAL_INSTALL = Path(".tiermesh") / "trace-ui" / "bin" / "phoenix"


@dataclass
class TraceUI:
    proc: subprocess.Popen[bytes]
    ui_url: str
    otlp_endpoint: str

    def otel_env(self) -> dict[str, str]:
        """What the services need to export their spans here."""
        return {
            "OTEL_EXPORTER_OTLP_ENDPOINT": self.otlp_endpoint,
            "OTEL_EXPORTER_OTLP_INSECURE": "true",
            "OTEL_TRACES_EXPORTER": "otlp",
        }


def phoenix_command(env: Mapping[str, str]) -> list[str] | None:
    """How to start Phoenix, or None when it is not installed anywhere we look."""
    for candidate in (env.get("TIERMESH_TRACE_UI_BIN", ""), str(LOCAL_INSTALL)):
        if candidate and Path(candidate).is_file():
            return [candidate, "serve"]
    found = shutil.which("phoenix")
    return [found, "serve"] if found else None


def start_trace_ui(data_dir: Path, ready_timeout_s: float = 60.0) -> TraceUI | None:
    """Start Phoenix and return once its OTLP port accepts connections; None (after saying
    why on stderr) when it is not installed or does not come up."""
    command = phoenix_command(os.environ)
    if command is None:
        print(INSTALL_HINT, file=sys.stderr)
        return None
    http_port, grpc_port = free_port(), free_port()
    work = data_dir / "phoenix"
    work.mkdir(parents=True, exist_ok=True)
    proc = spawn(
        command,
        environ_with(
            PHOENIX_HOST="127.0.0.1",
            PHOENIX_PORT=str(http_port),
            PHOENIX_GRPC_PORT=str(grpc_port),
            PHOENIX_WORKING_DIR=str(work.resolve()),
        ),
    )
    deadline = time.monotonic() + ready_timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            print(f"the tracing UI exited with code {proc.returncode}", file=sys.stderr)
            return None
        try:
            with socket.create_connection(("127.0.0.1", grpc_port), timeout=0.5):
                return TraceUI(
                    proc, f"http://127.0.0.1:{http_port}", f"http://127.0.0.1:{grpc_port}"
                )
        except OSError:
            try:
                proc.wait(timeout=0.2)  # returns early only if it died
            except subprocess.TimeoutExpired:
                pass
    proc.kill()
    print(f"the tracing UI did not open its OTLP port within {ready_timeout_s}s", file=sys.stderr)
    return None
