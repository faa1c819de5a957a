from __future__ import annotations

import pytest

from tiermesh.core.compute_unit import ComputeUnit
from tiermesh.core.keys import StreamKey


def test_a_unit_is_written_and_read_back_with_its_version() -> None:
    unit = ComputeUnit("mlp", "1", "fp32")
    assert str(unit) == repr(unit) == "mlp@1.fp32"
    assert ComputeUnit.parse("mlp@1.fp32") == unit
    assert ComputeUnit.parse("minilm-l6@v2_b.int8").labels == ("minilm-l6", "v2_b", "int8")
    assert unit.tagged == "{mlp}@1.fp32"
    assert ComputeUnit.parse_tagged("{mlp}@1.fp32") == unit


def test_a_stream_name_carries_its_unit() -> None:
    unit = ComputeUnit("mlp", "1", "fp32")
    assert StreamKey(unit, "center", 2, 0).name == "tm:q:{mlp}@1.fp32:center:p2:b0"
    assert StreamKey.parse(StreamKey(unit, "edge", 1, 3).name).unit == unit


@pytest.mark.parametrize("bad", ["mlp.fp32", "mlp@1", "@1.fp32", "mlp@.fp32", "mlp@1."])
def test_text_without_model_version_and_variant_is_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        ComputeUnit.parse(bad)


def test_a_name_without_its_hash_tag_is_refused() -> None:
    with pytest.raises(ValueError):
        ComputeUnit.parse_tagged("mlp@1.fp32")


def test_units_order_and_hash_as_their_parts() -> None:
    units = {
        ComputeUnit("b", "1", "fp32"),
        ComputeUnit("a", "2", "int8"),
        ComputeUnit("a", "1", "fp32"),
    }
    assert [str(u) for u in sorted(units)] == ["a@1.fp32", "a@2.int8", "b@1.fp32"]
    assert ComputeUnit("a", "1", "fp32") in units
