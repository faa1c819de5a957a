"""The cascade decision and its config."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tiermesh.core.model_config import RepositoryError, parse_config
from tiermesh.core.tensors import from_numpy
from tiermesh.worker.cascade import escalates, top1_softmax


def _cfg(**over: Any) -> Any:
    raw: dict[str, Any] = {
        "name": "clf",
        "max_batch_size": 8,
        "inputs": [{"name": "X", "datatype": "FP32", "dims": [4]}],
        "outputs": [{"name": "LOGITS", "datatype": "FP32", "dims": [3]}],
        "versions": {"1": {"model.onnx": "x"}},
        "tiers": {"edge": {"max_cost": 0}, "center": {}},
        "cascade": {"output": "LOGITS", "threshold": 0.9},
    }
    raw.update(over)
    return parse_config(raw, "test")


def logits(*rows: list[float]) -> Any:
    return from_numpy("LOGITS", np.array(rows, np.float32), "FP32")


def test_top1_softmax_is_the_least_confident_row() -> None:
    assert top1_softmax(logits([0, 0, 0])) == pytest.approx(1 / 3)
    assert top1_softmax(logits([10, 0, 0], [0, 0, 0])) == pytest.approx(1 / 3)
    assert top1_softmax(logits([1000, 0, 0])) == pytest.approx(1.0)  # no overflow


def test_only_unsure_edge_answers_escalate() -> None:
    cfg = _cfg()
    unsure, sure = [logits([0.1, 0, 0])], [logits([9, 0, 0])]
    assert escalates(cfg, "edge", unsure) == pytest.approx(top1_softmax(unsure[0]))
    assert escalates(cfg, "edge", sure) is None
    assert escalates(cfg, "center", unsure) is None  # the last tier is final
    assert escalates(_cfg(cascade=None), "edge", unsure) is None


@pytest.mark.parametrize(
    ("over", "words"),
    [
        ({"cascade": {"output": "NOPE", "threshold": 0.9}}, "unknown"),
        ({"cascade": {"output": "LOGITS", "threshold": 0.9, "score": "entropy"}}, "score"),
        ({"tiers": {"center": {}}}, "two tiers"),
        ({"tiers": {"fog": {}, "center": {}}}, "unknown key 'fog'"),
    ],
)
def test_bad_cascade_configs_are_refused(over: dict[str, Any], words: str) -> None:
    with pytest.raises(RepositoryError, match=words):
        _cfg(**over)
