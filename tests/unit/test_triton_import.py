"""`tiermesh models import-triton DIR`: a Triton model folder's config.pbtxt mapped onto
config.yaml field by field, the version folders its version_policy serves copied and run
once, and every field that cannot be mapped named in one refusal."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
import yaml
from onnx import TensorProto, helper

from tests.unit.test_models_add import conv_graph, matmul_graph, save
from tiermesh.cli.main import main
from tiermesh.convert.triton_import import DATATYPE_OF_TRITON
from tiermesh.core.repository import ModelRepository, sha256_file

REALISTIC = """
name: "resnet_like"
platform: "onnxruntime_onnx"
max_batch_size: 8
version_policy: { latest { num_versions: 2 } }
input [
  {
    name: "image"
    data_type: TYPE_FP32
    format: FORMAT_NCHW
    dims: [ 3, -1, -1 ]
  }
]
output [
  {
    name: "features"
    data_type: TYPE_FP32
    dims: [ 4, 1, 1 ]
  }
]
dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 500
}
instance_group [ { kind: KIND_CPU, count: 2 } ]
"""


def triton_folder(
    where: Path,
    pbtxt: str,
    versions: tuple[str, ...] = ("1",),
    graph: onnx.GraphProto | None = None,
) -> Path:
    folder = where / "triton"
    for version in versions:
        (folder / version).mkdir(parents=True)
        save(graph or conv_graph(), folder / version / "model.onnx")
    (folder / "config.pbtxt").write_text(pbtxt)
    return folder


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return tmp_path / "models"


def import_triton(repo: Path, folder: Path, *args: str) -> int:
    return main(["models", "import-triton", str(folder), *args, "--repository", str(repo)])


def config_of(repo: Path, name: str) -> dict[str, object]:
    raw = yaml.safe_load((repo / name / "config.yaml").read_text())
    assert isinstance(raw, dict)
    return raw


def test_a_realistic_folder_imports(
    tmp_path: Path, repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = triton_folder(tmp_path, REALISTIC, versions=("1", "2", "10"))
    assert import_triton(repo, folder) == 0
    cfg = config_of(repo, "resnet_like")
    assert cfg["max_batch_size"] == 8
    assert cfg["inputs"] == [{"name": "image", "datatype": "FP32", "dims": [3, -1, -1]}]
    assert cfg["outputs"] == [{"name": "features", "datatype": "FP32", "dims": [4, 1, 1]}]
    assert cfg["batching"] == {"max_batch_wait_ms": 0.5}
    assert cfg["length_buckets"] == [{"max_length": 1, "preferred_batch_sizes": [4, 8]}]
    # latest 2 of 1, 2, 10: by number, not by name
    sha = sha256_file(folder / "2" / "model.onnx")
    assert cfg["versions"] == {"2": {"model.onnx": sha}, "10": {"model.onnx": sha}}
    out = capsys.readouterr().out
    assert "versions: 2, 10 (version_policy latest 2)" in out
    assert "note: input[image].format FORMAT_NCHW describes the layout only" in out
    assert "note: instance_group KIND_CPU, count 2 is not written" in out
    assert (
        "batching: batches up to 8 rows, waiting at most 0.5 ms, preferred batch sizes [4, 8]"
        in out
    )
    loaded = ModelRepository(repo)
    model = loaded.load()["resnet_like"]
    assert model.bucket(0).preferred_batch_sizes == (4, 8)
    assert model.max_batch_wait_ms == 0.5
    loaded.checked_folder("resnet_like", "2")


def test_unmappable_fields_are_all_named_in_one_refusal(
    tmp_path: Path, repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pbtxt = (
        REALISTIC[: REALISTIC.index("dynamic_batching")]  # a oneof with sequence_batching
        + """
sequence_batching { }
optimization { execution_accelerators { cpu_execution_accelerator: [ { name: "openvino" } ] } }
parameters { key: "intra_op_thread_count" value: { string_value: "2" } }
"""
    )
    folder = triton_folder(tmp_path, pbtxt)
    assert import_triton(repo, folder) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "config.pbtxt: cannot import field(s) optimization, sequence_batching, parameters" in err
    assert "no tiermesh equivalent" in err and "nothing was added" in err
    assert not repo.exists() or list(repo.iterdir()) == []


def test_nested_fields_and_other_platforms_are_named_with_their_reason(
    tmp_path: Path, repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pbtxt = """
name: "plan"
platform: "tensorrt_plan"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_BF16 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 3 ] reshape: { shape: [ 1, 3 ] } } ]
dynamic_batching { preserve_ordering: true }
instance_group [ { kind: KIND_MODEL } ]
"""
    assert import_triton(repo, triton_folder(tmp_path, pbtxt, graph=matmul_graph())) == 2
    err = capsys.readouterr().err
    for part in (
        "dynamic_batching.preserve_ordering",
        "platform: tensorrt_plan: only onnxruntime_onnx is served",
        "input[x].data_type: TYPE_BF16: the mesh cannot carry it",
        "output[y].reshape: dims [3] reshaped to [1, 3]",
        "instance_group[0].kind: KIND_MODEL",
    ):
        assert part in err


def test_kind_gpu_is_imported_with_a_note_and_no_dynamic_batching_waits_for_nothing(
    tmp_path: Path, repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pbtxt = """
max_batch_size: 4
backend: "onnxruntime"
instance_group [ { kind: KIND_GPU, count: 1, gpus: [ 0 ] } ]
"""
    folder = triton_folder(tmp_path, pbtxt, versions=("1", "2"), graph=matmul_graph())
    assert import_triton(repo, folder, "--name", "gpu_model") == 0
    cfg = config_of(repo, "gpu_model")
    assert cfg["batching"] == {"max_batch_wait_ms": 0}
    assert "length_buckets" not in cfg and "tiers" not in cfg
    # No policy: Triton's default serves the latest version only.
    assert list(cfg["versions"]) == ["2"]  # type: ignore[call-overload]
    # No input/output in config.pbtxt: read from the graph, as Triton's auto-complete does.
    assert cfg["inputs"] == [{"name": "x", "datatype": "FP32", "dims": [4]}]
    out = capsys.readouterr().out
    assert "note: instance_group KIND_GPU, count 1, gpus [0] is not written" in out
    assert "TIERMESH_EXECUTION_PROVIDERS=cuda" in out
    assert "interface: inputs and outputs read from the graph of version 2" in out


def test_specific_versions_default_filename_priorities_and_a_faithful_reshape(
    tmp_path: Path, repo: Path
) -> None:
    pbtxt = """
name: "picked"
platform: "onnxruntime_onnx"
max_batch_size: 16
default_model_filename: "net.onnx"
version_policy: { specific { versions: [ 1, 3 ] } }
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] reshape: { shape: [ 4 ] } } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 3 ] } ]
dynamic_batching { priority_levels: 3 default_priority_level: 2 }
response_cache { enable: true }
"""
    folder = tmp_path / "triton"
    for version in ("1", "2", "3"):
        (folder / version).mkdir(parents=True)
        save(matmul_graph(), folder / version / "net.onnx")
    (folder / "config.pbtxt").write_text(pbtxt)
    assert import_triton(repo, folder) == 0
    cfg = config_of(repo, "picked")
    assert list(cfg["versions"]) == ["1", "3"]  # type: ignore[call-overload]
    assert (repo / "picked" / "3" / "model.onnx").read_bytes() == (
        folder / "3" / "net.onnx"
    ).read_bytes()
    assert cfg["priority_levels"] == 3 and cfg["default_priority"] == 2
    assert cfg["response_cache"] == {"enabled": True}
    assert cfg["batching"] == {"max_batch_wait_ms": 0.0}


def test_a_specific_version_without_a_folder_is_refused(
    tmp_path: Path, repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pbtxt = "max_batch_size: 8\nversion_policy: { specific { versions: [ 1, 7 ] } }\n"
    assert import_triton(repo, triton_folder(tmp_path, pbtxt, graph=matmul_graph())) == 2
    assert "version_policy specific names version(s) 7, which have no folder" in (
        capsys.readouterr().err
    )


def test_a_declared_interface_the_graph_contradicts_is_refused(
    tmp_path: Path, repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pbtxt = """
max_batch_size: 8
input [ { name: "x" data_type: TYPE_INT64 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 5 ] } ]
"""
    assert import_triton(repo, triton_folder(tmp_path, pbtxt, graph=matmul_graph())) == 2
    err = capsys.readouterr().err
    assert "does not match config.pbtxt" in err
    assert "input x: config.pbtxt says INT64, the graph FP32" in err
    assert "output y: config.pbtxt says shape [-1, 5] (batch dimension first), the graph" in err


def test_a_string_model_maps_type_string_to_bytes(tmp_path: Path, repo: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["TEXT"], ["ECHO"])],
        "echo",
        [helper.make_tensor_value_info("TEXT", TensorProto.STRING, ["batch", 1])],
        [helper.make_tensor_value_info("ECHO", TensorProto.STRING, ["batch", 1])],
    )
    pbtxt = """
max_batch_size: 4
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "ECHO" data_type: TYPE_STRING dims: [ 1 ] } ]
"""
    assert import_triton(repo, triton_folder(tmp_path, pbtxt, graph=graph), "--name", "echo") == 0
    assert config_of(repo, "echo")["inputs"] == [{"name": "TEXT", "datatype": "BYTES", "dims": [1]}]
    assert DATATYPE_OF_TRITON["TYPE_STRING"] == "BYTES"


def test_not_a_model_config_is_refused(
    tmp_path: Path, repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = triton_folder(tmp_path, "max_batch_size: 8\nbatching_mode: FAST\n")
    assert import_triton(repo, folder) == 2
    err = capsys.readouterr().err
    assert "config.pbtxt: not a Triton model config" in err and "batching_mode" in err


def test_a_folder_without_config_pbtxt_is_refused(
    tmp_path: Path, repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert import_triton(repo, tmp_path) == 2
    assert "no config.pbtxt (a Triton model folder holds config.pbtxt" in capsys.readouterr().err
