"""The gateway's request decisions: validation, model lookup, priority, deadline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import yaml

from tiermesh.core.errors import MAX_MESSAGE_CHARS, MeshError, shown, shown_shape
from tiermesh.core.repository import ModelConfig, ModelRepository, parse_config
from tiermesh.core.tensors import TensorData, from_numpy
from tiermesh.gateway.requests import (
    MAX_WAIT_NS,
    InferRequest,
    effective_deadline_ns,
    find_model,
    priority_level,
    validate,
)

RAW: dict[str, Any] = {
    "name": "pair",
    "max_batch_size": 8,
    "inputs": [
        {"name": "IDS", "datatype": "INT64", "dims": [-1]},
        {"name": "FEAT", "datatype": "FP32", "dims": [4]},
    ],
    "outputs": [{"name": "OUT", "datatype": "FP32", "dims": [3]}],
    "priority_levels": 3,
    "default_priority": 2,
    "versions": {"1": {"model.onnx": "0" * 64}, "2": {"model.onnx": "1" * 64}},
}


@pytest.fixture
def cfg() -> ModelConfig:
    return parse_config(RAW, "test")


def _ids(batch: int = 2, length: int = 5) -> TensorData:
    return from_numpy("IDS", np.zeros((batch, length), dtype=np.int64), "INT64")


def _feat(batch: int = 2) -> TensorData:
    return from_numpy("FEAT", np.ones((batch, 4), dtype=np.float32), "FP32")


def _req(*inputs: TensorData, outputs: tuple[str, ...] = ()) -> InferRequest:
    return InferRequest("pair", "", tuple(inputs), requested_outputs=outputs)


def _invalid(cfg: ModelConfig, req: InferRequest) -> str:
    with pytest.raises(MeshError) as exc:
        validate(cfg, req)
    assert exc.value.code == grpc.StatusCode.INVALID_ARGUMENT
    return exc.value.message


# -- validate ------------------------------------------------------------------------------


def test_valid_request_passes(cfg: ModelConfig) -> None:
    validate(cfg, _req(_ids(3, 7), _feat(3), outputs=("OUT",)))
    validate(cfg, _req(_feat(1), _ids(1, 1)))  # order does not matter


def test_unknown_input(cfg: ModelConfig) -> None:
    extra = from_numpy("MASK", np.ones((2, 5), dtype=np.int64), "INT64")
    msg = _invalid(cfg, _req(_ids(), _feat(), extra))
    assert "unknown input 'MASK'" in msg
    assert "IDS, FEAT" in msg


def test_duplicate_input(cfg: ModelConfig) -> None:
    assert "'IDS' given more than once" in _invalid(cfg, _req(_ids(), _ids(), _feat()))


def test_missing_input(cfg: ModelConfig) -> None:
    msg = _invalid(cfg, _req(_ids()))
    assert "missing input(s) FEAT" in msg


def test_wrong_datatype(cfg: ModelConfig) -> None:
    ids32 = from_numpy("IDS", np.zeros((2, 5), dtype=np.int32), "INT32")
    msg = _invalid(cfg, _req(ids32, _feat()))
    assert "'IDS'" in msg
    assert "datatype INT32" in msg
    assert "INT64" in msg


@pytest.mark.parametrize("shape", [(8,), (2, 4, 1)])
def test_wrong_rank(cfg: ModelConfig, shape: tuple[int, ...]) -> None:
    feat = from_numpy("FEAT", np.ones(shape, dtype=np.float32), "FP32")
    msg = _invalid(cfg, _req(_ids(), feat))
    assert f"rank {len(shape)} does not match the model's rank 2" in msg


def test_wrong_fixed_dim(cfg: ModelConfig) -> None:
    feat = from_numpy("FEAT", np.ones((2, 5), dtype=np.float32), "FP32")
    msg = _invalid(cfg, _req(_ids(), feat))
    assert "'FEAT': dimension 1 is 5, the model expects 4" in msg


def test_batch_over_max(cfg: ModelConfig) -> None:
    msg = _invalid(cfg, _req(_ids(9), _feat(9)))
    assert "batch size 9 exceeds max_batch_size 8" in msg


def test_batch_equal_to_max_passes(cfg: ModelConfig) -> None:
    validate(cfg, _req(_ids(8), _feat(8)))


@pytest.mark.parametrize("shape", [(0, 4), (2, 0)])
def test_zero_dim(cfg: ModelConfig, shape: tuple[int, int]) -> None:
    ids = TensorData("IDS", "INT64", shape, b"")
    msg = _invalid(cfg, _req(ids, _feat()))
    assert "every dimension must be positive" in msg


def test_inputs_disagree_on_batch(cfg: ModelConfig) -> None:
    msg = _invalid(cfg, _req(_ids(2), _feat(3)))
    assert "disagree on the batch size" in msg


def test_unknown_requested_output(cfg: ModelConfig) -> None:
    msg = _invalid(cfg, _req(_ids(), _feat(), outputs=("OUT", "LOGITS")))
    assert "unknown output 'LOGITS'" in msg


def test_byte_size_checked_after_shape(cfg: ModelConfig) -> None:
    feat = TensorData("FEAT", "FP32", (2, 4), bytes(31))
    msg = _invalid(cfg, _req(_ids(), feat))
    assert "byte size 31" in msg


def test_non_batching_model_checks_full_rank() -> None:
    cfg = parse_config({**RAW, "max_batch_size": 0, "inputs": RAW["inputs"][1:]}, "t")
    validate(cfg, InferRequest("pair", "", (from_numpy("FEAT", np.ones(4, np.float32), "FP32"),)))
    msg = _invalid(cfg, _req(_feat(1)))
    assert "rank 2 does not match the model's rank 1" in msg


# -- find_model ----------------------------------------------------------------------------


@pytest.fixture
def repo(tmp_path: Path) -> ModelRepository:
    (tmp_path / "pair").mkdir()
    (tmp_path / "pair" / "config.yaml").write_text(yaml.safe_dump(RAW))
    repo = ModelRepository(tmp_path)
    repo.load()
    return repo


@pytest.mark.parametrize("version", ["", "1", "2"])
def test_find_model_known(repo: ModelRepository, cfg: ModelConfig, version: str) -> None:
    assert find_model(repo, "pair", version) == cfg


@pytest.mark.parametrize(
    ("name", "version", "text"),
    [
        ("nope", "", "Request for unknown model: 'nope' is not found"),
        ("pair", "7", "Request for unknown model: 'pair' version 7 is not found"),
    ],
)
def test_find_model_not_found(repo: ModelRepository, name: str, version: str, text: str) -> None:
    with pytest.raises(MeshError) as exc:
        find_model(repo, name, version)
    assert exc.value.code == grpc.StatusCode.NOT_FOUND
    assert exc.value.message == text  # Triton's words: its clients look for them


# -- priority_level ------------------------------------------------------------------------


@pytest.mark.parametrize(("requested", "level"), [(0, 2), (1, 1), (2, 2), (3, 3)])
def test_priority_level(cfg: ModelConfig, requested: int, level: int) -> None:
    assert priority_level(cfg, requested) == level


@pytest.mark.parametrize("requested", [4, -1, 2**63])
def test_priority_out_of_range(cfg: ModelConfig, requested: int) -> None:
    with pytest.raises(MeshError) as exc:
        priority_level(cfg, requested)
    assert exc.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert f"priority {requested} out of range" in exc.value.message
    assert "1..3" in exc.value.message


# -- effective_deadline_ns -----------------------------------------------------------------

NOW = 1_700_000_000_000_000_000


@pytest.mark.parametrize(
    ("grpc_s", "timeout_us", "expected"),
    [
        (2.0, 500_000, NOW + 500_000_000),  # timeout parameter earlier
        (0.25, 500_000, NOW + 250_000_000),  # gRPC deadline earlier
        (1.5, None, NOW + 1_500_000_000),
        (None, 3_000, NOW + 3_000_000),
    ],
)
def test_deadline_is_earliest(grpc_s: float | None, timeout_us: int | None, expected: int) -> None:
    assert effective_deadline_ns(NOW, grpc_s, timeout_us, default_timeout_ms=60_000) == expected


def test_deadline_default_when_neither() -> None:
    assert effective_deadline_ns(NOW, None, None, default_timeout_ms=1234) == NOW + 1_234_000_000


def test_negative_timeout_invalid() -> None:
    with pytest.raises(MeshError) as exc:
        effective_deadline_ns(NOW, 1.0, -5, default_timeout_ms=1000)
    assert exc.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "-5" in exc.value.message


def test_zero_timeout_means_none_as_in_triton() -> None:
    assert effective_deadline_ns(NOW, None, 0, default_timeout_ms=1234) == NOW + 1_234_000_000
    assert effective_deadline_ns(NOW, 2.0, 0, default_timeout_ms=1234) == NOW + 2_000_000_000


# -- hostile input (bugs the hostile e2e run found) -----------------------------------------


def test_huge_timeout_is_capped_not_an_int64_overflow() -> None:
    """A `timeout` of 2**64-1 us is valid protocol; the deadline once overflowed int64 ns
    and the request got INTERNAL from the serialisation of the internal job."""
    for timeout_us in (2**63 - 1, 2**64 - 1):
        deadline = effective_deadline_ns(NOW, None, timeout_us, default_timeout_ms=1000)
        assert deadline == NOW + MAX_WAIT_NS
        assert deadline < 2**63
    assert effective_deadline_ns(NOW, 1e12, None, default_timeout_ms=1000) == NOW + MAX_WAIT_NS


def test_a_timeout_under_the_cap_is_kept() -> None:
    assert effective_deadline_ns(NOW, None, 3_600_000_000, 1000) == NOW + 3_600_000_000_000


@pytest.mark.parametrize(
    ("name", "version"), [("m" * 100_000, ""), ("pair", "9" * 100_000), ("x\x00\n" * 999, "")]
)
def test_not_found_quotes_a_huge_name_briefly(
    repo: ModelRepository, name: str, version: str
) -> None:
    """The message travels in the trailers, which a client caps at 8 KiB: quoting a 100 kB
    name made the client see RESOURCE_EXHAUSTED instead of NOT_FOUND."""
    with pytest.raises(MeshError) as exc:
        find_model(repo, name, version)
    assert exc.value.code == grpc.StatusCode.NOT_FOUND
    assert len(exc.value.message) < 200
    assert "\x00" not in exc.value.message and "\n" not in exc.value.message


def test_invalid_messages_quote_huge_names_and_shapes_briefly(cfg: ModelConfig) -> None:
    name = "N" * 50_000
    msg = _invalid(cfg, _req(TensorData(name, "FP32", (2, 4), b""), _ids()))
    assert "unknown input 'NNN" in msg and len(msg) < 300
    shape = (2,) * 10_000
    msg = _invalid(cfg, _req(_ids(), TensorData("FEAT", "FP32", shape, b"")))
    assert "rank 10000" in msg and len(msg) < 300
    msg = _invalid(cfg, _req(_ids(), _feat(), outputs=("O" * 50_000,)))
    assert "unknown output" in msg and len(msg) < 300


def test_mesh_error_messages_are_capped() -> None:
    err = MeshError(grpc.StatusCode.INVALID_ARGUMENT, "x" * 100_000)
    assert len(err.message) <= MAX_MESSAGE_CHARS + 3


def test_shown_escapes_and_cuts() -> None:
    assert shown("mlp") == "mlp"
    assert shown("a\x00b\n") == "a\\x00b\\n"
    assert shown("é✓") == "é✓"
    assert shown("m" * 100) == "m" * 64 + "... (100 characters)"
    assert shown_shape([1, 2]) == "[1, 2]"
    assert shown_shape(range(20)) == "[0, 1, 2, 3, 4, 5, 6, 7, ... (20 dimensions)]"
