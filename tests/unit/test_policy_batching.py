"""Pure routing and batch-formation decisions, and the work-stream names they produce."""

from __future__ import annotations

from typing import Any

import pytest

from tiermesh.core.compute_unit import ComputeUnit
from tiermesh.core.jobs import Job, Timing
from tiermesh.core.keys import DEFAULT_TIER, StreamKey, stream_keys
from tiermesh.core.model_config import bucket_for
from tiermesh.core.repository import ModelConfig, parse_config
from tiermesh.core.tensors import TensorData
from tiermesh.router.policy import choose_stream, job_length
from tiermesh.worker.batching import (
    QueuedJob,
    split_cancelled,
    split_expired,
    take_count,
    view_of,
)


def _t(name: str, *shape: int) -> TensorData:
    return TensorData(name, "INT64", shape, b"")  # decisions never look at the bytes


def _job(*inputs: TensorData, priority: int = 0, deadline_ns: int = 0) -> Job:
    return Job("r", "m", inputs, "gw:1", deadline_ns=deadline_ns, priority=priority)


def _cfg(**over: Any) -> ModelConfig:
    raw = {
        "name": "bert",
        "max_batch_size": 32,
        "inputs": [{"name": "IDS", "datatype": "INT64", "dims": [-1]}],
        "outputs": [{"name": "EMB", "datatype": "FP32", "dims": [8]}],
        "versions": {"1": {"model.onnx": "0" * 64}},
        "priority_levels": 3,
        "default_priority": 2,
        "length_buckets": [16, 64, 256],
        **over,
    }
    return parse_config(raw, "test")


# -- router policy -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("length", "bucket"),
    [(0, 0), (1, 0), (16, 0), (17, 1), (64, 1), (65, 2), (256, 2), (257, 2), (10_000, 2)],
)
def test_bucket_for_edges(length: int, bucket: int) -> None:
    assert bucket_for(length, (16, 64, 256)) == bucket


@pytest.mark.parametrize("length", [0, 1, 10**9])
def test_bucket_for_no_bounds_is_one_bucket(length: int) -> None:
    assert bucket_for(length, ()) == 0


def test_bucket_for_single_bound_catches_all() -> None:
    assert bucket_for(5, (8,)) == 0
    assert bucket_for(50, (8,)) == 0


@pytest.mark.parametrize(
    ("inputs", "length"),
    [
        ((_t("IDS", 2, 40),), 40),
        ((_t("IDS", 2, 40), _t("MASK", 2, 70)), 70),
        ((_t("IMG", 1, 3, 224, 100),), 224),
        ((_t("X", 8),), 1),  # no non-batch dimension
        ((), 1),
    ],
)
def test_job_length(inputs: tuple[TensorData, ...], length: int) -> None:
    assert job_length(_job(*inputs)) == length


@pytest.mark.parametrize(
    ("priority", "expected"),
    [(0, 2), (1, 1), (3, 3)],
)
def test_choose_stream_priority(priority: int, expected: int) -> None:
    key = choose_stream(_cfg(), _job(_t("IDS", 1, 10), priority=priority))
    assert key.priority == expected


@pytest.mark.parametrize("priority", [4, 9, -4])
def test_a_priority_out_of_range_is_refused_in_the_callers_words(priority: int) -> None:
    with pytest.raises(ValueError, match=f"priority {priority} out of range: model 'bert' has"):
        _cfg().priority_level(priority)


def test_choose_stream_key() -> None:
    key = choose_stream(_cfg(), _job(_t("IDS", 4, 100)), tier="edge")
    assert key == StreamKey(ComputeUnit.parse("bert@1.fp32"), "edge", 2, 2)
    assert choose_stream(_cfg(), _job(_t("IDS", 1, 3))).tier == DEFAULT_TIER


def test_choose_stream_without_buckets() -> None:
    key = choose_stream(_cfg(length_buckets=[]), _job(_t("IDS", 1, 5000)))
    assert key.bucket == 0


# -- worker batching -----------------------------------------------------------------------


def _k(priority: int, bucket: int, model: str = "m") -> StreamKey:
    return StreamKey(ComputeUnit(model, "1", "fp32"), "center", priority, bucket)


MS = 1_000_000


def _queued(key: StreamKey, rows: int, routed: int, dequeued: int, deadline: int = 0) -> QueuedJob:
    job = Job(
        request_id=f"r{routed}",
        model="m",
        inputs=(TensorData("X", "FP32", (rows, 4), bytes(16 * rows)),),
        gateway="g",
        deadline_ns=deadline,
        timing=Timing(routed_ns=routed),
    )
    return QueuedJob(key, "0-1", job, dequeued)


def test_view_of_summarises_a_buffer() -> None:
    key = _k(1, 0)
    queued = [
        _queued(key, 2, 5 * MS, 9 * MS, 0),
        _queued(key, 3, 4 * MS, 8 * MS, 50 * MS),
        _queued(key, 1, 7 * MS, 10 * MS, 30 * MS),
    ]
    view = view_of(key, queued)
    assert (view.rows, view.oldest_enqueued_ns, view.first_dequeued_ns) == (6, 4 * MS, 8 * MS)
    assert view.earliest_deadline_ns == 30 * MS
    assert view_of(key, queued[:1]).earliest_deadline_ns == 0  # no deadline at all


def test_split_cancelled() -> None:
    key = _k(1, 0)
    a, b = _queued(key, 1, 1, 1), _queued(key, 1, 2, 2)
    assert split_cancelled([a, b], {"r2"}) == ([a], [b])
    assert split_cancelled([a, b], set()) == ([a, b], [])


@pytest.mark.parametrize(
    ("rows", "count"),
    [
        ([], 0),
        ([1], 1),
        ([32], 1),  # exactly max still runs
        ([40], 1),  # over max alone still runs (validation caps it)
        ([32, 1], 1),
        ([16, 16, 1], 2),
        ([10, 10, 10], 3),
        ([31, 1, 1], 2),
        ([1, 32], 1),
    ],
)
def test_take_count(rows: list[int], count: int) -> None:
    assert take_count(rows, 32) == count


def _q(deadline_ns: int, entry: str) -> QueuedJob:
    return QueuedJob(_k(1, 0), entry, _job(_t("IDS", 1, 2), deadline_ns=deadline_ns), 0)


def test_split_expired() -> None:
    now = 5_000
    batch = [_q(0, "none"), _q(4_999, "past"), _q(5_000, "now"), _q(5_001, "future")]
    live, expired = split_expired(batch, now)
    assert [q.entry_id for q in live] == ["none", "future"]
    assert [q.entry_id for q in expired] == ["past", "now"]


def test_split_expired_deadline_zero_never_expires() -> None:
    live, expired = split_expired([_q(0, "a")], 10**19)
    assert (len(live), len(expired)) == (1, 0)


# -- stream keys ---------------------------------------------------------------------------


def test_stream_key_name_format() -> None:
    """The model's name is the Redis Cluster hash tag: every stream of a model in one slot."""
    assert (
        StreamKey(ComputeUnit.parse("mlp@1.fp32"), "edge", 1, 0).name
        == "tm:q:{mlp}@1.fp32:edge:p1:b0"
    )
    assert (
        StreamKey(ComputeUnit.parse("bert-base@2.int8"), "center", 2, 13).name
        == "tm:q:{bert-base}@2.int8:center:p2:b13"
    )


def test_every_key_of_a_models_work_shares_its_slot() -> None:
    from redis.cluster import key_slot

    from tiermesh.core import keys

    unit, other = ComputeUnit.parse("mlp@1.fp32"), ComputeUnit.parse("mlp@2.int8")
    together = [
        StreamKey(unit, "edge", 1, 0).name,
        StreamKey(other, "center", 0, 3).name,
        keys.workers_key(unit, "edge"),
        keys.provider_key(unit, "edge", "w1"),
        keys.rate_key(other, "center"),
        keys.dead_letter_key(unit, "center"),
        keys.enqueued_key(unit.model, "r1"),
        keys.enqueued_key("mlp", "r2"),
        keys.cache_entry_key("mlp", "d1"),
        keys.cache_index_key("mlp"),
        keys.stats_key("mlp", "1"),
        keys.stats_batch_key("mlp", "w1", 5),
    ]
    assert {key_slot(k.encode()) for k in together} == {key_slot(b"mlp")}
    assert key_slot(
        StreamKey(ComputeUnit.parse("bert@1.fp32"), "edge", 1, 0).name.encode()
    ) == key_slot(b"bert")
    # What one script or transaction writes together, beyond a model's work.
    for group in (
        [keys.rollout_key("mlp"), keys.CHANGE_LOG, keys.ROLLOUT_LOCK],
        [keys.UNLOADED_MODELS, keys.CONTROL_GENERATION],
        [keys.quota_rate_key("t"), keys.quota_in_flight_key("t")],
        [
            keys.batch_job_key("j"),
            keys.batch_inputs_key("j"),
            keys.batch_results_key("j"),
            keys.batch_open_key("t"),
            keys.BATCH_ACTIVE,
            keys.BATCH_FEED_LOCK,
        ],
    ):
        assert len({key_slot(k.encode()) for k in group}) == 1, group


@pytest.mark.parametrize(
    "key",
    [
        StreamKey(ComputeUnit.parse("mlp@1.fp32"), "edge", 1, 0),
        StreamKey(ComputeUnit.parse("a_b@x-1.c"), "center", 10, 99),
    ],
)
def test_stream_key_parse_round_trip(key: StreamKey) -> None:
    assert StreamKey.parse(key.name) == key


@pytest.mark.parametrize(
    "name",
    [
        "tm:workers:mlp:edge",
        "xx:q:mlp:edge:p1:b0",
        "tm:x:mlp:edge:p1:b0",
        "tm:q:mlp:edge:1:b0",
        "tm:q:mlp:edge:p1:0",
        "tm:q:mlp:edge:p1:b0:extra",
        "tm:q:mlp:edge:px:b0",
        "tm:q:mlp:edge:p1:b",
        "tm:q:mlp@1.fp32:edge:p1:b0",  # no hash tag
        "",
    ],
)
def test_stream_key_parse_rejects_foreign(name: str) -> None:
    with pytest.raises(ValueError):
        StreamKey.parse(name)


def test_stream_keys_highest_priority_first() -> None:
    keys = stream_keys(ComputeUnit("m", "1", "fp32"), "edge", 2, 2)
    assert [(k.priority, k.bucket) for k in keys] == [(1, 0), (1, 1), (2, 0), (2, 1)]
    assert len({k.name for k in keys}) == 4


def test_job_length_counts_every_dimension_when_the_model_does_not_batch() -> None:
    job = _job(_t("IDS", 300, 4))
    assert job_length(job, batched=False) == 300
    assert job_length(job, batched=True) == 4
