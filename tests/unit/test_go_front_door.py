"""benchmarks/grpc_hops.py --go: the Go ModelInfer server it builds from Debian's Go packages
refuses clearly without them, and (where they are installed) answers tritonclient as the
Python servicer does."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.conftest import door_cache

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def grpc_hops() -> ModuleType:
    spec = importlib.util.spec_from_file_location("grpc_hops", BENCHMARKS / "grpc_hops.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_without_the_go_toolchain_it_names_the_debian_packages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hops = grpc_hops()
    monkeypatch.setattr(shutil, "which", lambda tool: None if tool == "go" else "/bin/true")
    with pytest.raises(SystemExit) as refused:
        hops.build_go_server(tmp_path)
    assert "--go: the Go front door needs go: apt-get install golang-go" in str(refused.value)
    assert not (tmp_path / "frontdoor").exists()


@pytest.mark.slow
@pytest.mark.skipif(
    any(shutil.which(t) is None for t in ("go", "protoc", "protoc-gen-go")),
    reason="Debian's Go toolchain is not installed (make test installs it: scripts/ensure_go.sh)",
)
def test_the_go_server_answers_a_tritonclient_call(tmp_path: Path, go_build_cache: Path) -> None:
    hops = grpc_hops()
    binary = hops.build_go_server(door_cache(tmp_path, go_build_cache))
    proc = subprocess.Popen([binary], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
        ids = grpcclient.InferInput("input_ids", [1, 16], "INT64")
        ids.set_data_from_numpy(np.ones((1, 16), np.int64))
        result = client.infer("minilm", [ids], request_id="r-7")
        out = result.as_numpy("sentence_embedding")
        assert result.get_response().id == "r-7"
        assert out is not None and out.shape == (1, 384) and out.dtype == np.float32
        assert not out.any()
    finally:
        proc.kill()
        proc.wait()
