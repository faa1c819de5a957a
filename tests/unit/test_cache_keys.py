"""The response-cache digest: stable, sensitive to everything that decides an answer,
blind to input order, and unambiguous."""

from __future__ import annotations

import struct
from dataclasses import replace
from typing import Any

import pytest

from tiermesh.core import keys
from tiermesh.core.tensors import TensorData
from tiermesh.gateway.cache import cache_digest

X = TensorData("x", "FP32", (1, 4), struct.pack("<4f", 1.0, 2.0, 3.0, 4.0))
MASK = TensorData("mask", "INT64", (1, 2), struct.pack("<2q", 1, 0))


def digest(**overrides: Any) -> str:
    args: dict[str, Any] = dict(
        model="mlp",
        version="1",
        variant="fp32",
        tenant="acme",
        inputs=(X, MASK),
        requested_outputs=("y",),
    )
    args.update(overrides)
    return cache_digest(**args)


def test_stable_and_hex() -> None:
    first = digest()
    assert first == digest()
    # Equal content in new objects gives the same digest.
    copy = TensorData(X.name, X.datatype, tuple(X.shape), bytes(bytearray(X.raw)))
    assert first == digest(inputs=[copy, MASK], requested_outputs=["y"])
    assert len(first) == 64
    int(first, 16)


def test_input_order_does_not_matter() -> None:
    assert digest(inputs=(X, MASK)) == digest(inputs=(MASK, X))


@pytest.mark.parametrize(
    "overrides",
    [
        {"model": "mlp2"},
        {"version": "2"},
        {"variant": "int8"},
        {"tenant": "other"},
        {"tenant": None},
        {"tenant": ""},
        {"requested_outputs": ()},
        {"requested_outputs": ("z",)},
        {"requested_outputs": ("y", "z")},
        {"inputs": (X,)},
        {"inputs": (X, MASK, TensorData("extra", "BOOL", (1,), b"\x01"))},
    ],
    ids=lambda o: ",".join(f"{k}={v!r}" for k, v in o.items())[:40],
)
def test_differs_by_each_field(overrides: dict[str, Any]) -> None:
    assert digest(**overrides) != digest()


def test_differs_by_any_input_byte() -> None:
    base = digest()
    for i in range(len(X.raw)):
        flipped = bytearray(X.raw)
        flipped[i] ^= 0x01
        assert digest(inputs=(replace(X, raw=bytes(flipped)), MASK)) != base


def test_differs_by_shape_dtype_and_name() -> None:
    base = digest()
    # Same bytes, other shape / datatype / name.
    assert digest(inputs=(replace(X, shape=(4,)), MASK)) != base
    assert digest(inputs=(replace(X, shape=(2, 2)), MASK)) != base
    assert digest(inputs=(replace(X, datatype="INT32"), MASK)) != base
    assert digest(inputs=(replace(X, name="x2"), MASK)) != base


def test_tenant_none_is_not_any_tenant() -> None:
    shared = digest(tenant=None)
    assert shared != digest(tenant="a")
    assert shared != digest(tenant="")
    assert digest(tenant="a") != digest(tenant="b")


def test_lengths_prevent_ambiguity() -> None:
    def named(*names: str) -> tuple[TensorData, ...]:
        return tuple(TensorData(n, "UINT8", (1,), b"\x07") for n in names)

    # Input names split differently.
    assert digest(inputs=named("ab", "c")) != digest(inputs=named("a", "bc"))
    # Raw content split differently between two inputs.
    left = (TensorData("a", "UINT8", (2,), b"\x01\x02"), TensorData("b", "UINT8", (1,), b"\x03"))
    right = (TensorData("a", "UINT8", (1,), b"\x01"), TensorData("b", "UINT8", (2,), b"\x02\x03"))
    assert digest(inputs=left) != digest(inputs=right)
    # Identity strings split differently.
    assert digest(model="ab", version="c") != digest(model="a", version="bc")
    assert digest(version="1", variant="fp32") != digest(version="1f", variant="p32")
    # Requested outputs split or joined differently.
    outs = [("ab", "c"), ("a", "bc"), ("abc",), ("a", "b", "c")]
    assert len({digest(requested_outputs=o) for o in outs}) == len(outs)
    # A tenant cannot pose as the model/version boundary.
    assert digest(variant="fp32", tenant="x") != digest(variant="fp32x", tenant="")


def test_requested_output_order_counts() -> None:
    assert digest(requested_outputs=("y", "z")) != digest(requested_outputs=("z", "y"))


def test_entry_keys_share_the_model_prefix() -> None:
    key = keys.cache_entry_key("mlp", digest())
    assert key.startswith(keys.cache_entry_prefix("mlp"))
    assert not key.startswith(keys.cache_entry_prefix("ml"))
    assert keys.cache_index_key("mlp") != key
    assert not keys.cache_index_key("mlp").startswith(keys.cache_entry_prefix("mlp"))
