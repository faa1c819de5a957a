"""What model control's state means for each service (core/serving.py), and the shared
statistics' Redis form (gateway/statistics_store.py), without Redis."""

from __future__ import annotations

from dataclasses import replace

from tiermesh.core.control_watch import ControlState
from tiermesh.core.jobs import Timing
from tiermesh.core.model_config import parse_config
from tiermesh.core.serving import UnitPlan, is_served, member, plan_units, worker_units
from tiermesh.gateway.statistics import InferenceStatistics
from tiermesh.gateway.statistics_store import _flush_args, parse_hash


def _cfg(name: str, versions: tuple[str, ...] = ("1",), variants: tuple[str, ...] = ("fp32",)):  # type: ignore[no-untyped-def]
    raw = {
        "name": name,
        "platform": "onnxruntime_onnx",
        "max_batch_size": 8,
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "dims": [4]}],
        "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "dims": [3]}],
        "variants": {v: f"{v}.onnx" for v in variants},
        "versions": {v: {f"{x}.onnx": "0" * 64 for x in variants} for v in versions},
    }
    return parse_config(raw, f"{name}/config.yaml")


def test_a_model_or_one_version_is_unloaded() -> None:
    unloaded = {member("a"), member("b", "2")}
    assert not is_served(unloaded, "a", "1")
    assert not is_served(unloaded, "b", "2")
    assert is_served(unloaded, "b", "1")
    assert is_served(unloaded, "c", "1")
    state = ControlState("3", frozenset(unloaded))
    assert not state.served(_cfg("a"), "1") and state.served(_cfg("c"), "1")


def test_a_worker_wants_every_gated_version_and_variant_of_what_is_loaded() -> None:
    a = _cfg("a", ("1", "2"), ("fp32", "int8"))
    # int8 passed its accuracy gate in version 2 only: version 1's gets no session.
    a = replace(a, servable={"1": frozenset({"fp32"}), "2": frozenset({"fp32", "int8"})})
    configs = {"a": a, "b": _cfg("b")}
    assert sorted(map(str, worker_units(configs, [], set()))) == [
        "a@1.fp32",
        "a@2.fp32",
        "a@2.int8",
        "b@1.fp32",
    ]
    assert sorted(map(str, worker_units(configs, [], {"a:1", "b"}))) == ["a@2.fp32", "a@2.int8"]
    # Without a record anywhere only the reference serves, unless the config says ungated.
    only_reference = worker_units({"a": _cfg("a", ("1",), ("fp32", "int8"))}, [], set())
    assert sorted(map(str, only_reference)) == ["a@1.fp32"]
    ungated = replace(_cfg("a", ("1",), ("fp32", "int8")), ungated=True)
    assert sorted(map(str, worker_units({"a": ungated}, [], set()))) == ["a@1.fp32", "a@1.int8"]
    # Only the models it was told to serve; one the repository lacks is skipped.
    assert sorted(map(str, worker_units(configs, ["b", "gone"], set()))) == ["b@1.fp32"]


def test_the_plan_opens_closes_and_keeps_closing_units_wanted_again() -> None:
    plan = plan_units(wanted={"a", "b", "c"}, serving={"a", "d"}, closing={"c"})
    assert plan == UnitPlan(open=("b",), reopen=("c",), close=("d",))
    assert not plan_units(wanted={"a"}, serving={"a"}, closing=set())


def test_statistics_survive_the_round_trip_through_their_redis_hash() -> None:
    stats = InferenceStatistics()
    timing = Timing(
        received_ns=1, enqueued_ns=3, batch_start_ns=6, batch_end_ns=10, postprocessed_ns=15
    )
    for _ in range(2):  # two requests of one batch of 2
        stats.computed("m", "1", 1, timing, 20, ("w", 6), 2)
    stats.cache_miss("m", "1", 7)
    stats.failed("m", "1", 0, 4)
    drained = stats.drain()
    keys_, args = _flush_args("m", "1", drained[("m", "1")])
    assert keys_[0] == "tm:stats:{m}:1" and len(keys_) == 2  # the hash, one new batch
    # What the flush script writes for a first-seen batch, as Redis would hold it.
    pairs = args[1 : 1 + 2 * int(args[0])]
    row = {str(k): str(v) for k, v in zip(pairs[::2], pairs[1::2], strict=True)}
    row.update({"execution_count": "1", "b2:count": "1", "b2:compute_infer_ns": "4"})
    row["b2:compute_output_ns"] = "5"
    back = parse_hash(row)
    assert (back.success.count, back.success.ns) == (2, 38)
    assert (back.compute_input.ns, back.queue.ns, back.compute_output.ns) == (4, 6, 10)
    assert (back.fail.count, back.cache_miss.ns, back.inference_count) == (1, 7, 2)
    assert back.execution_count == 1
    assert back.batches[2].compute_infer.ns == 4 and back.batches[2].compute_output.ns == 5
    # Until written, the drained figures still count for this gateway; a failed write
    # puts them back for the next flush.
    assert stats.of("m", "1").success.count == 2
    stats.flushed(drained, ok=False)
    assert stats.of("m", "1").success.count == 2 and len(stats.drain()[("m", "1")].new_batches) == 1
