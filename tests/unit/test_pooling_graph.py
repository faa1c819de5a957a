"""The pooling step in the model's graph (worker/pooling_graph.py): onnxruntime's embedding
is postprocess's, and a result pooled in the worker passes postprocess unchanged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tiermesh.core.compute_unit import ComputeUnit
from tiermesh.core.jobs import Job, JobResult
from tiermesh.core.keys import StreamKey
from tiermesh.core.model_config import PoolSpec
from tiermesh.core.output_steps import OutputSteps, mean_pool_l2
from tiermesh.core.repository import ModelConfig, parse_config
from tiermesh.core.tensors import from_numpy, to_numpy
from tiermesh.worker.batching import QueuedJob
from tiermesh.worker.pooling_graph import with_pooling
from tiermesh.worker.results import computed
from tiermesh.worker.runner import ModelRunner

SPEC = PoolSpec("last_hidden_state", "attention_mask", "sentence_embedding")
HIDDEN = 4
TABLE = np.random.default_rng(7).standard_normal((50, HIDDEN)).astype(np.float32)


def _model(opset: int = 17, output_rank: int = 3, mask_input: bool = True) -> onnx.ModelProto:
    """last_hidden_state[b, l] = TABLE[input_ids[b, l]] (the mask is an input it ignores,
    as a BERT's padded positions still get vectors)."""
    nodes = [helper.make_node("Gather", ["table", "input_ids"], ["last_hidden_state"])]
    shape: list[Any] = ["batch", "sequence", HIDDEN]
    if output_rank == 2:
        nodes = [
            helper.make_node("Gather", ["table", "input_ids"], ["gathered"]),
            helper.make_node(
                "ReduceMax", ["gathered"], ["last_hidden_state"], axes=[1], keepdims=0
            ),
        ]
        shape = ["batch", HIDDEN]
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"])]
    if mask_input:
        inputs.append(
            helper.make_tensor_value_info(
                "attention_mask", TensorProto.INT64, ["batch", "sequence"]
            )
        )
    graph = helper.make_graph(
        nodes,
        "embed",
        inputs,
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, shape)],
        [numpy_helper.from_array(TABLE, "table")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _session(data: bytes) -> ort.InferenceSession:
    return ort.InferenceSession(data, providers=["CPUExecutionProvider"])


def _feeds() -> dict[str, np.ndarray[Any, Any]]:
    ids = np.array([[3, 9, 27, 4, 0], [5, 11, 0, 0, 0], [8, 0, 0, 0, 0], [0, 0, 0, 0, 0]])
    mask = np.array([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0]])
    return {"input_ids": ids.astype(np.int64), "attention_mask": mask.astype(np.int64)}


def test_the_graph_pools_as_postprocess_does() -> None:
    plain = _model().SerializeToString()
    fused = with_pooling(plain, SPEC)
    assert fused is not None
    session = _session(fused)
    assert [o.name for o in session.get_outputs()] == ["last_hidden_state", "sentence_embedding"]
    feeds = _feeds()
    (embedding,) = session.run(["sentence_embedding"], feeds)
    (tokens,) = _session(plain).run(["last_hidden_state"], feeds)
    result = JobResult(
        request_id="r",
        model="m",
        gateway="gw",
        outputs=(from_numpy(SPEC.source, tokens, "FP32"),),
        aux=(from_numpy(SPEC.mask, feeds["attention_mask"], "INT64"),),
    )
    expected: np.ndarray[Any, Any] = to_numpy(mean_pool_l2(SPEC)(result).outputs[0])
    assert embedding.shape == (4, HIDDEN) and embedding.dtype == np.float32
    np.testing.assert_allclose(embedding, expected, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(np.linalg.norm(embedding[:3], axis=1), 1.0, rtol=1e-6)
    assert embedding[3].tolist() == [0.0] * HIDDEN  # nothing kept: zeros, not NaN
    # Padding at the end changes nothing: row 1 alone, unpadded.
    alone = {k: v[1:2, :2] for k, v in feeds.items()}
    (pooled_alone,) = session.run(["sentence_embedding"], alone)
    np.testing.assert_allclose(pooled_alone[0], embedding[1], rtol=1e-6)


@pytest.mark.parametrize(
    ("model", "spec", "why"),
    [
        (_model(), PoolSpec("nope", SPEC.mask, SPEC.output), "source is not a graph output"),
        (_model(mask_input=False), SPEC, "mask is not a graph input"),
        (_model(opset=12), SPEC, "axes are attributes before opset 13"),
        (_model(output_rank=2), SPEC, "source is not [batch, sequence, hidden]"),
    ],
)
def test_a_graph_that_does_not_fit_is_left_alone(
    model: onnx.ModelProto, spec: PoolSpec, why: str
) -> None:
    assert with_pooling(model.SerializeToString(), spec) is None, why


def test_pooled_once_only() -> None:
    fused = with_pooling(_model().SerializeToString(), SPEC)
    assert fused is not None
    assert with_pooling(fused, PoolSpec("sentence_embedding", SPEC.mask, "again")) is None


def test_external_data_only_where_the_caller_supplies_it(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    onnx.save(_model(), str(path), save_as_external_data=True, size_threshold=0)
    data = path.read_bytes()
    assert with_pooling(data, SPEC, external_ok=False) is None
    assert with_pooling(data, SPEC) is not None


def _cfg(pool: bool = True) -> ModelConfig:
    ids = [
        {"name": "input_ids", "datatype": "INT64", "dims": [-1]},
        {"name": "attention_mask", "datatype": "INT64", "dims": [-1]},
    ]
    raw: dict[str, Any] = {
        "name": "embed",
        "max_batch_size": 8,
        "inputs": ids,
        "outputs": [{"name": "sentence_embedding", "datatype": "FP32", "dims": [HIDDEN]}],
        "compute": {
            "inputs": ids,
            "outputs": [{"name": "last_hidden_state", "datatype": "FP32", "dims": [-1, HIDDEN]}],
            "pad": {"input_ids": 0, "attention_mask": 0},
        },
        "versions": {"1": {"model.onnx": "0" * 64}},
    }
    if pool:
        raw["pool"] = {"source": SPEC.source, "mask": SPEC.mask, "output": SPEC.output}
    return parse_config(raw, "test")


def _job(rid: str, ids: list[int]) -> QueuedJob:
    arr = np.array([ids], np.int64)
    inputs = (
        from_numpy("input_ids", arr, "INT64"),
        from_numpy("attention_mask", (arr > 0).astype(np.int64), "INT64"),
    )
    return QueuedJob(
        StreamKey(ComputeUnit("embed", "1", "fp32"), "center", 1, 0),
        "1-0",
        Job(rid, "embed", inputs, "gw"),
        0,
    )


def test_a_worker_hands_on_embeddings_that_postprocess_passes(tmp_path: Path) -> None:
    """A pooled model's runner answers the embedding for each job of a padded batch, its
    result carries no mask, and postprocess's step leaves it as it is: the same vector the
    token outputs give through postprocess."""
    path = tmp_path / "model.onnx"
    onnx.save(_model(), str(path))
    cfg = _cfg()
    jobs = [_job("a", [3, 9, 27]), _job("b", [5])]  # b is padded to 3 in the batch
    pooled = ModelRunner(cfg, path).run([q.job for q in jobs])
    tokens = ModelRunner(_cfg(pool=False), path).run([q.job for q in jobs])
    steps = OutputSteps.for_models({"embed": cfg})
    for q, out, unpooled in zip(jobs, pooled, tokens, strict=True):
        result = computed(cfg, q, out, 1, 2, 2, "w")
        assert [o.name for o in result.outputs] == ["sentence_embedding"]
        assert result.aux == ()
        assert steps.apply(result) is result
        via_postprocess = steps.apply(computed(cfg, q, unpooled, 1, 2, 2, "w"))
        ours: np.ndarray[Any, Any] = to_numpy(result.outputs[0])
        theirs: np.ndarray[Any, Any] = to_numpy(via_postprocess.outputs[0])
        np.testing.assert_allclose(ours, theirs, rtol=1e-6)
