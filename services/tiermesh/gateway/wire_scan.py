"""What a ModelInferRequest would cost to parse, read from its bytes before it is parsed.

protobuf builds every element of a repeated field when it parses a message: a packed field
of zeros holds one element a byte, each 4 or 8 bytes once parsed, and each `bytes_contents`
element is an object of its own. A 60 MB request of typed zeros became ~0.5 GB of parsed
message before any check could compare its element count with its shape. `check` walks the
request's framing (a few fields, each skipped by its length) and refuses, before the parse,
a request whose inputs' contents list more than MAX_LISTED_ELEMENTS elements in all (at
most 8 bytes each once parsed: 8 MiB), an input of more dimensions than MAX_RANK, or more
inputs than MAX_INPUTS. Separately framed elements (`bytes_contents`, scalars sent
unpacked, and packed fields themselves: protobuf appends their elements) are counted one by
one, so at most MAX_FRAMED_ELEMENTS of them a request. Bytes
that do not frame as protobuf are left to the parser, which refuses them.
"""

from __future__ import annotations

import numpy as np

from tiermesh.core.errors import MeshError, invalid
from tiermesh.core.validation import MAX_LISTED_ELEMENTS
from tiermesh.gateway.converters import MAX_INPUTS, MAX_RANK

# Elements framed one by one that the walk counts (~0.3 us each) before it refuses.
MAX_FRAMED_ELEMENTS = 1 << 16

_VARINT, _FIXED64, _LEN, _FIXED32 = 0, 1, 2, 5
# ModelInferRequest.inputs; InferInputTensor.shape and .contents.
_INPUTS, _SHAPE, _CONTENTS = 5, 3, 5
# InferTensorContents: each field's element size when packed (0: varints).
_PACKED_SIZE = {1: 0, 2: 0, 3: 0, 4: 0, 5: 0, 6: 4, 7: 8}
_BYTES_CONTENTS = 8


class _Broken(Exception):
    """The bytes do not frame as protobuf: the parser will say so."""


def _varint(data: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while pos < len(data):
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            break
    raise _Broken


def _past_scalar(data: memoryview, pos: int, wire: int) -> int:
    """Where a field of a scalar wire type that starts its value at `pos` ends."""
    if wire == _VARINT:
        return _varint(data, pos)[1]
    if wire == _FIXED64:
        return pos + 8
    if wire == _FIXED32:
        return pos + 4
    raise _Broken


def _fields(data: memoryview) -> list[tuple[int, int, memoryview | None]]:
    """(field number, wire type, the bytes of a length-delimited value) of each field."""
    out: list[tuple[int, int, memoryview | None]] = []
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        value: memoryview | None = None
        if wire == _LEN:
            length, pos = _varint(data, pos)
            value = data[pos : pos + length]
            pos += length
        else:
            pos = _past_scalar(data, pos, wire)
        if pos > len(data):
            raise _Broken
        out.append((number, wire, value))
        if len(out) > MAX_FRAMED_ELEMENTS + MAX_RANK + 8:
            break  # the caller counts what it found: past this, it refuses
    return out


_CONTINUED = bytes(range(0x80, 0x100))


def _varints_in(packed: memoryview) -> int:
    """Elements of a packed varint field (its bytes without the continuation bit), exact up
    to MAX_LISTED_ELEMENTS: past 10 bytes an element (a varint's most) there are more than
    that, and the field is not read. A short field is counted without numpy's ~1 us a call."""
    if len(packed) > 10 * MAX_LISTED_ELEMENTS:
        return MAX_LISTED_ELEMENTS + 1
    if len(packed) <= 256:
        return len(packed.tobytes().translate(None, _CONTINUED))
    return int(np.count_nonzero(np.frombuffer(packed, dtype=np.uint8) < 0x80))


def _listed(contents: memoryview) -> tuple[int, int]:
    """(elements, of which framed one by one) of an InferTensorContents, counted up to just
    past MAX_FRAMED_ELEMENTS framed ones. One tight loop (~0.3 us an element, where the
    general `_fields` took ~2 us): framed elements are what an attacker sends by the million.
    A packed field counts as framed too (protobuf appends each one's elements): millions of
    one-element packed fields stop the walk as bytes_contents do."""
    listed = framed = pos = 0
    end = len(contents)
    while pos < end and framed <= MAX_FRAMED_ELEMENTS:
        key = contents[pos]
        pos += 1
        if key & 0x80:  # a field number past 15: none of InferTensorContents'
            key, pos = _varint(contents, pos - 1)
        number, wire = key >> 3, key & 7
        if wire == _LEN:
            length = contents[pos] if pos < end else 0x80
            pos += 1
            if length & 0x80:
                length, pos = _varint(contents, pos - 1)
            if number in _PACKED_SIZE:
                size = _PACKED_SIZE[number]
                value = contents[pos : pos + length]
                listed += length // size if size else _varints_in(value)
                framed += 1
                pos += length
                continue
            pos += length
        else:
            pos = _past_scalar(contents, pos, wire)
        listed += 1
        framed += 1
    if pos > end:
        raise _Broken
    return listed, framed


def _input(tensor: memoryview, index: int) -> tuple[int, int]:
    """(elements, of which framed one by one) the input's contents list."""
    rank = listed = framed = 0
    for number, wire, value in _fields(tensor):
        if number == _SHAPE:
            rank += _varints_in(value) if wire == _LEN and value is not None else 1
        elif number == _CONTENTS and wire == _LEN and value is not None:
            listed, framed = _listed(value)
    if rank > MAX_RANK:
        raise invalid(f"input {index}: rank {rank} over the limit of {MAX_RANK}")
    return listed, framed


def check(data: bytes) -> MeshError | None:
    """INVALID_ARGUMENT for a request that lists more than the gateway takes; None for any
    other (a request that does not parse included: the parser refuses it). A request of at
    most MAX_FRAMED_ELEMENTS bytes cannot list more than that many elements (one byte each
    at least), nor more inputs or dimensions than the parsed checks then refuse: it is not
    walked (the walk costs ~16 us a request; the common call is that small)."""
    if len(data) <= MAX_FRAMED_ELEMENTS:
        return None
    try:
        inputs = [v for n, w, v in _fields(memoryview(data)) if n == _INPUTS and w == _LEN]
        if len(inputs) > MAX_INPUTS:
            return invalid(f"{len(inputs)} inputs, over the limit of {MAX_INPUTS}")
        listed = framed = 0
        for index, tensor in enumerate(inputs):
            assert tensor is not None
            more, more_framed = _input(tensor, index)
            listed, framed = listed + more, framed + more_framed
            if framed > MAX_FRAMED_ELEMENTS or listed > MAX_LISTED_ELEMENTS:
                return invalid(
                    f"the inputs' contents list over {MAX_LISTED_ELEMENTS} elements, or over "
                    f"{MAX_FRAMED_ELEMENTS} framed one by one (bytes_contents, unpacked "
                    "scalars, packed fields); send large tensors as raw_input_contents"
                )
    except _Broken:
        return None
    except MeshError as err:
        return err
    return None
