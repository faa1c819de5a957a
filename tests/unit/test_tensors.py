"""The tensor codec: raw-byte validation, v2 BYTES framing, numpy conversion, batching."""

from __future__ import annotations

import struct

import grpc
import numpy as np
import pytest

from tiermesh.core.errors import MeshError
from tiermesh.core.tensors import (
    TensorData,
    concat_batch,
    from_numpy,
    join_bytes,
    split_batch,
    split_bytes,
    to_numpy,
    validate_raw,
)


def _frame(*items: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(i)) + i for i in items)


def _invalid(exc: pytest.ExceptionInfo[MeshError]) -> str:
    assert exc.value.code == grpc.StatusCode.INVALID_ARGUMENT
    return exc.value.message


# -- validate_raw, fixed-size datatypes ---------------------------------------------------


def test_validate_raw_accepts_exact_size() -> None:
    validate_raw("x", "FP32", (2, 3), bytes(24))


@pytest.mark.parametrize(
    ("datatype", "shape", "size", "expected"),
    [
        ("FP32", (2, 3), 20, 24),
        ("INT64", (4,), 33, 32),
        ("FP16", (3, 1), 0, 6),
        ("BOOL", (5,), 6, 5),
    ],
)
def test_validate_raw_size_mismatch_names_input_and_sizes(
    datatype: str, shape: tuple[int, ...], size: int, expected: int
) -> None:
    with pytest.raises(MeshError) as exc:
        validate_raw("INPUT0", datatype, shape, bytes(size))
    msg = _invalid(exc)
    assert "'INPUT0'" in msg
    assert f"byte size {size}" in msg
    assert f"= {expected}" in msg
    assert datatype in msg


# -- BYTES framing -------------------------------------------------------------------------


def test_bytes_valid_framing_passes() -> None:
    validate_raw("t", "BYTES", (1, 2), _frame("héllo".encode(), b""))


def test_bytes_truncated_length_prefix() -> None:
    raw = _frame(b"ab") + b"\x01\x00"  # a second prefix cut to 2 of its 4 bytes
    with pytest.raises(MeshError) as exc:
        validate_raw("TEXT", "BYTES", (2,), raw)
    msg = _invalid(exc)
    assert "'TEXT'" in msg
    assert "2 trailing bytes" in msg
    assert "4-byte length prefix" in msg


def test_bytes_declared_length_past_end() -> None:
    raw = _frame(b"ok") + struct.pack("<I", 10) + b"abc"
    with pytest.raises(MeshError) as exc:
        validate_raw("TEXT", "BYTES", (2,), raw)
    msg = _invalid(exc)
    assert "'TEXT'" in msg
    assert "element 1 declares 10 bytes but only 3 remain" in msg


@pytest.mark.parametrize(("items", "shape"), [(3, (2, 2)), (5, (2, 2)), (0, (1,))])
def test_bytes_element_count_must_match_shape(items: int, shape: tuple[int, ...]) -> None:
    raw = _frame(*[b"x"] * items)
    with pytest.raises(MeshError) as exc:
        validate_raw("TEXT", "BYTES", shape, raw)
    msg = _invalid(exc)
    count = int(np.prod(shape))
    if items > count:
        assert f"holds more elements than the {count} its shape needs" in msg
    else:
        assert f"holds {items} elements" in msg
        assert f"needs {count}" in msg


def test_a_bytes_scan_stops_one_element_past_the_shape() -> None:
    # Millions of empty elements fit a few megabytes; the split reads two of them here, or
    # it would reach the broken framing at the end and name that instead.
    raw = _frame(*[b""] * 1_000_000) + b"\x01"
    with pytest.raises(MeshError) as exc:
        validate_raw("TEXT", "BYTES", (1,), raw)
    assert "holds more elements than the 1 its shape needs" in _invalid(exc)


def test_bytes_invalid_utf8_names_element_and_byte() -> None:
    raw = _frame(b"fine", b"ab\xff\xfe")
    with pytest.raises(MeshError) as exc:
        validate_raw("TEXT", "BYTES", (2,), raw)
    msg = _invalid(exc)
    assert "'TEXT'" in msg
    assert "element 1 is not valid UTF-8" in msg
    assert "byte 2" in msg


def test_split_and_join_bytes_are_inverse() -> None:
    items = [b"", b"a", "日本語".encode(), bytes(300)]
    assert split_bytes(join_bytes(items), 4, "t") == items
    assert join_bytes([]) == b""
    assert split_bytes(b"", 0, "t") == []


# -- numpy round trips ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("datatype", "array"),
    [
        ("FP32", np.array([[1.5, -2.25, 3.0], [0.0, 1e-7, -1e7]], dtype=np.float32)),
        ("INT64", np.array([[2**62, -(2**62)], [0, -1]], dtype=np.int64)),
        ("FP16", np.array([0.5, -65504.0, 1.0], dtype=np.float16)),
        ("BOOL", np.array([[True, False], [False, True]], dtype=np.bool_)),
    ],
)
def test_numpy_round_trip_fixed(datatype: str, array: np.ndarray) -> None:
    t = from_numpy("x", array, datatype)
    assert t.datatype == datatype
    assert t.shape == array.shape
    assert len(t.raw) == array.nbytes
    validate_raw(t.name, t.datatype, t.shape, t.raw)
    back = to_numpy(t)
    assert back.dtype == array.dtype
    np.testing.assert_array_equal(back, array)


def test_from_numpy_is_little_endian_row_major() -> None:
    arr = np.array([[1, 2], [3, 4]], dtype=">i8").T  # big-endian and not C-contiguous
    t = from_numpy("x", arr, "INT64")
    assert t.raw == np.array([[1, 3], [2, 4]], dtype="<i8").tobytes()


def test_numpy_round_trip_bytes_unicode() -> None:
    array = np.array([["héllo", "", "日本語"], ["emoji 🎉", "tab\tnl\n", "z"]], dtype=object)
    t = from_numpy("TEXT", array, "BYTES")
    assert t.shape == (2, 3)
    validate_raw(t.name, t.datatype, t.shape, t.raw)
    assert split_bytes(t.raw, 6, "TEXT")[0] == "héllo".encode()
    back = to_numpy(t)
    assert back.dtype == object
    assert back.shape == (2, 3)
    assert back.tolist() == array.tolist()


def test_from_numpy_bytes_accepts_bytes_elements() -> None:
    t = from_numpy("TEXT", np.array([b"ab", "cd"], dtype=object), "BYTES")
    assert t.raw == _frame(b"ab", b"cd")


# -- batching ------------------------------------------------------------------------------


def test_concat_split_round_trip_fixed() -> None:
    parts = [
        from_numpy("x", np.arange(n * 4, dtype=np.float32).reshape(n, 4) + 100 * n, "FP32")
        for n in (1, 3, 2)
    ]
    joined = concat_batch(parts)
    assert joined.shape == (6, 4)
    assert joined.name == "x"
    np.testing.assert_array_equal(to_numpy(joined), np.concatenate([to_numpy(p) for p in parts]))
    back = split_batch(joined, [1, 3, 2])
    assert back == parts


def test_concat_split_round_trip_bytes_multi_element_rows() -> None:
    a = np.array([["a", "bb", "ccc"]], dtype=object)
    b = np.array([["", "日本", "x"], ["éé", "yy", "🎉"]], dtype=object)
    c = np.array([["1", "22", "333"]], dtype=object)
    parts = [from_numpy("TEXT", arr, "BYTES") for arr in (a, b, c)]
    joined = concat_batch(parts)
    assert joined.shape == (4, 3)
    validate_raw(joined.name, joined.datatype, joined.shape, joined.raw)
    assert to_numpy(joined).tolist() == [*a.tolist(), *b.tolist(), *c.tolist()]
    back = split_batch(joined, [1, 2, 1])
    assert back == parts
    assert [to_numpy(p).tolist() for p in back] == [a.tolist(), b.tolist(), c.tolist()]


def test_tensor_batch_property() -> None:
    assert TensorData("x", "FP32", (5, 2), bytes(40)).batch == 5
    assert TensorData("x", "FP32", (), bytes(4)).batch == 1
