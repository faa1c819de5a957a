"""Tensors inside the mesh: KServe v2 datatypes, raw-byte validation, numpy conversion.

BYTES tensors use the v2 framing: each element is a 4-byte little-endian length followed by
that many bytes. ONNX string tensors are text, so BYTES elements must be valid UTF-8.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tiermesh.core.errors import invalid, shown, shown_shape

_FIXED: dict[str, np.dtype[np.generic]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
}
BYTES = "BYTES"
DATATYPES = frozenset([*_FIXED, BYTES])

_LEN = struct.Struct("<I")


@dataclass(frozen=True, slots=True)
class TensorData:
    """A named tensor as raw row-major little-endian bytes (BYTES: v2 framing)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    raw: bytes

    @property
    def batch(self) -> int:
        return self.shape[0] if self.shape else 1


def element_count(shape: Sequence[int]) -> int:
    return math.prod(shape)


def element_size(datatype: str) -> int:
    """Bytes per element of a fixed-size datatype."""
    return _FIXED[datatype].itemsize


def split_bytes(raw: bytes, count: int, name: str) -> list[bytes]:
    """Split v2-framed BYTES content into exactly `count` elements, or raise INVALID_ARGUMENT.
    The scan stops past the `count`-th element: content framed as many more (millions of
    empty elements fit a few megabytes) is refused for what one more element costs."""
    out: list[bytes] = []
    pos = 0
    view = memoryview(raw)
    while pos < len(raw):
        if len(out) == count:
            raise invalid(
                f"input '{shown(name)}': BYTES holds more elements than the {count} its shape needs"
            )
        if len(raw) - pos < 4:
            raise invalid(
                f"input '{shown(name)}': BYTES framing broken: {len(raw) - pos} trailing bytes "
                "are too short for a 4-byte length prefix"
            )
        (length,) = _LEN.unpack_from(raw, pos)
        pos += 4
        if length > len(raw) - pos:
            raise invalid(
                f"input '{shown(name)}': BYTES framing broken: element {len(out)} declares "
                f"{length} bytes but only {len(raw) - pos} remain"
            )
        out.append(bytes(view[pos : pos + length]))
        pos += length
    if len(out) != count:
        raise invalid(
            f"input '{shown(name)}': BYTES holds {len(out)} elements, shape needs {count}"
        )
    return out


def join_bytes(items: Sequence[bytes]) -> bytes:
    return b"".join(_LEN.pack(len(item)) + item for item in items)


def validate_raw(name: str, datatype: str, shape: Sequence[int], raw: bytes) -> None:
    """Check raw content against datatype and shape; raise INVALID_ARGUMENT naming the problem."""
    count = element_count(shape)
    if datatype == BYTES:
        for i, item in enumerate(split_bytes(raw, count, name)):
            try:
                item.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise invalid(
                    f"input '{shown(name)}': BYTES element {i} is not valid UTF-8 "
                    f"(byte {exc.start})"
                ) from None
        return
    expected = count * element_size(datatype)
    if len(raw) != expected:
        raise invalid(
            f"input '{shown(name)}': byte size {len(raw)} does not match shape "
            f"{shown_shape(shape)} x {datatype} ({element_size(datatype)} bytes) = {expected}"
        )


def strings(tensor: TensorData) -> list[str]:
    """The elements of a BYTES tensor as str, in row-major order."""
    items = split_bytes(tensor.raw, element_count(tensor.shape), tensor.name)
    return [i.decode("utf-8") for i in items]


def to_numpy(tensor: TensorData) -> npt.NDArray[np.generic]:
    """The tensor as a numpy array; BYTES become an object array of str (what ONNX wants)."""
    if tensor.datatype == BYTES:
        return np.array(strings(tensor), dtype=object).reshape(tensor.shape)
    return np.frombuffer(tensor.raw, dtype=_FIXED[tensor.datatype]).reshape(tensor.shape)


def from_numpy(name: str, array: npt.NDArray[np.generic], datatype: str) -> TensorData:
    """A TensorData of `datatype` from an array (BYTES from str or bytes elements)."""
    shape = tuple(int(d) for d in array.shape)
    if datatype == BYTES:
        items = [x if isinstance(x, bytes) else str(x).encode("utf-8") for x in array.reshape(-1)]
        return TensorData(name, datatype, shape, join_bytes(items))
    data = np.ascontiguousarray(array, dtype=_FIXED[datatype])
    return TensorData(name, datatype, shape, data.tobytes())


def concat_batch(tensors: Sequence[TensorData]) -> TensorData:
    """Join same-named tensors along the batch dimension (dimension 0)."""
    first = tensors[0]
    rows = sum(t.shape[0] for t in tensors)
    # Row-major bytes, and v2 BYTES framing, both concatenate cleanly along dimension 0.
    raw = b"".join(t.raw for t in tensors)
    return TensorData(first.name, first.datatype, (rows, *first.shape[1:]), raw)


def split_batch(tensor: TensorData, rows: Sequence[int]) -> list[TensorData]:
    """Inverse of :func:`concat_batch`: cut along dimension 0 into pieces of `rows` rows."""
    per_row = element_count(tensor.shape[1:])
    out: list[TensorData] = []
    if tensor.datatype == BYTES:
        items = split_bytes(tensor.raw, element_count(tensor.shape), tensor.name)
        start = 0
        for n in rows:
            chunk = items[start : start + n * per_row]
            out.append(TensorData(tensor.name, BYTES, (n, *tensor.shape[1:]), join_bytes(chunk)))
            start += n * per_row
        return out
    size = per_row * element_size(tensor.datatype)
    offset = 0
    for n in rows:
        out.append(
            TensorData(
                tensor.name,
                tensor.datatype,
                (n, *tensor.shape[1:]),
                tensor.raw[offset : offset + n * size],
            )
        )
        offset += n * size
    return out
