"""Hostile input: thousands of malformed ModelInfer requests against `tiermesh up`.

Hypothesis builds the requests, class by class of DESIGN.md's table (datatype, rank and
dims, negative / huge dims and int64 overflow in shape products, byte-size lies, contents
vs raw, BYTES framing lies, bad UTF-8, NaN/Inf, path tricks in names and versions,
duplicate and missing inputs, odd parameters, huge priority and timeout, bytes that do not
parse). Each is sent as raw bytes on the real public port beside an honest request (in
flight at the same time, so they often share a worker batch). Every answer must carry the
code its class expects (never INTERNAL or UNKNOWN); every OK answer must be right
(onnxruntime, run here on the same file, is the reference); no service may crash or be
restarted, and none may log an unexpected error.

NaN and Inf are valid IEEE floats that onnxruntime computes with, so the mesh answers them
(OK, NaN where onnxruntime gives NaN) rather than refusing them.
"""

from __future__ import annotations

import math
import struct
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import cycle
from typing import Any

import grpc
import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests import protowire
from tests.e2e.conftest import UpProcess

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

Code = grpc.StatusCode
OK = frozenset({Code.OK})
INVALID = frozenset({Code.INVALID_ARGUMENT})
NOT_FOUND = frozenset({Code.NOT_FOUND})
# DESIGN.md's table, less INTERNAL ("anything unexpected"): what a malformed request may get.
DOCUMENTED = frozenset(
    {
        Code.OK,
        Code.INVALID_ARGUMENT,
        Code.NOT_FOUND,
        Code.RESOURCE_EXHAUSTED,
        Code.UNAVAILABLE,
        Code.DEADLINE_EXCEEDED,
        Code.CANCELLED,
        Code.ABORTED,
        Code.UNAUTHENTICATED,
        Code.PERMISSION_DENIED,
    }
)
METHOD = "/inference.GRPCInferenceService/ModelInfer"
MODELS = ("mlp", "echo", "mlp_cached", "mlp_cascade", "mlp_bounded")
# Examples per class; with one honest request beside each, a run sends ~2x this many.
EXAMPLES = 300
CALL_TIMEOUT_S = 30.0
HONEST_WINDOW = 8

FP32_OUT = ("mlp", "mlp_cached", "mlp_cascade")
DATATYPES = (
    "BOOL",
    "UINT8",
    "UINT16",
    "UINT32",
    "UINT64",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "FP16",
    "FP32",
    "FP64",
    "BF16",
    "BYTES",
)
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


# -- what is sent, what must come back -----------------------------------------------------


@dataclass(frozen=True)
class Case:
    label: str
    payload: bytes
    expect: frozenset[grpc.StatusCode]
    # Checks an OK answer (the mesh computed something: it must be the right thing).
    check: Callable[[service_pb2.ModelInferResponse], None] | None = None


@dataclass
class Reference:
    """onnxruntime on the mesh's own mlp file: the expected answer of every mlp request."""

    session: ort.InferenceSession

    def mlp(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(self.session.run(["OUTPUT0"], {"INPUT0": x})[0])

    def check_mlp(self, x: np.ndarray) -> Callable[[service_pb2.ModelInferResponse], None]:
        want = self.mlp(x)

        def check(resp: service_pb2.ModelInferResponse) -> None:
            got = _output(resp, "OUTPUT0", np.float32)
            assert got.shape == want.shape
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, equal_nan=True)

        return check


def _output(resp: service_pb2.ModelInferResponse, name: str, dtype: Any) -> np.ndarray:
    i = [o.name for o in resp.outputs].index(name)
    shape = tuple(resp.outputs[i].shape)
    return np.frombuffer(resp.raw_output_contents[i], dtype=dtype).reshape(shape)


def check_echo(raw: bytes, shape: list[int]) -> Callable[[service_pb2.ModelInferResponse], None]:
    def check(resp: service_pb2.ModelInferResponse) -> None:
        assert list(resp.outputs[0].shape) == shape
        assert resp.raw_output_contents[0] == raw, "echo must return the text it was sent"

    return check


def framed(items: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(i)) + i for i in items)


def request(
    model: str,
    inputs: list[tuple[str, str, list[int]]],
    raw: list[bytes] | None = None,
    version: str = "",
) -> service_pb2.ModelInferRequest:
    req = service_pb2.ModelInferRequest(model_name=model, model_version=version)
    for name, datatype, shape in inputs:
        req.inputs.add(name=name, datatype=datatype, shape=shape)
    for r in raw or []:
        req.raw_input_contents.append(r)
    return req


def mlp_request(model: str, x: np.ndarray) -> service_pb2.ModelInferRequest:
    return request(model, [("INPUT0", "FP32", list(x.shape))], [x.tobytes()])


# -- strategies, one per malformed class ---------------------------------------------------

rows = st.integers(1, 32)
finite = st.floats(-1e6, 1e6, width=32)
special = st.sampled_from([np.nan, np.inf, -np.inf, -0.0, 1e-45, -1e-45, 1e-38])


@st.composite
def mlp_x(draw: st.DrawFn, values: st.SearchStrategy[float] = finite) -> np.ndarray:
    n = draw(st.integers(1, 4))
    flat = draw(st.lists(values, min_size=n * 4, max_size=n * 4))
    return np.asarray(flat, dtype=np.float32).reshape(n, 4)


@st.composite
def wrong_datatype(draw: st.DrawFn, ref: Reference) -> Case:
    model, name, right = draw(
        st.sampled_from([("mlp", "INPUT0", "FP32"), ("echo", "TEXT", "BYTES")])
    )
    datatype = draw(
        st.sampled_from(DATATYPES).filter(lambda d: d != right)
        | st.text(max_size=12).filter(lambda d: d != right)
    )
    size = draw(st.sampled_from([0, 1, 2, 4, 8, 16, 32]))
    raw = draw(st.binary(min_size=size * 4, max_size=size * 4))
    return Case(
        "datatype", request(model, [(name, datatype, [1, 4])], [raw]).SerializeToString(), INVALID
    )


# int64 values with the edges and the products that overflow 64 bits well represented.
dims = st.one_of(
    st.integers(-3, 40),
    st.sampled_from([2**31 - 1, 2**31, 2**32, 2**32 + 1, 2**62, INT64_MAX, INT64_MIN, -(2**31)]),
    st.integers(INT64_MIN, INT64_MAX),
)


@st.composite
def shapes(draw: st.DrawFn, ref: Reference) -> Case:
    """Any shape with a content of some length; the oracle says which are valid."""
    shape = draw(
        st.lists(dims, max_size=5)
        | st.lists(dims, min_size=33, max_size=40)  # over the rank limit
        | st.lists(st.integers(1, 5), min_size=2, max_size=2)  # near the valid ones
    )
    if draw(st.booleans()):  # mlp: fixed [batch, 4] FP32
        count = math.prod(shape)
        exact = count * 4 if 0 < count <= 512 else 0
        nbytes = draw(st.sampled_from([exact, 16, 0, 4]) | st.integers(0, 600))
        raw = draw(st.binary(min_size=nbytes, max_size=nbytes))
        req = request("mlp", [("INPUT0", "FP32", shape)], [raw]).SerializeToString()
        valid = (
            len(shape) == 2 and 1 <= shape[0] <= 32 and shape[1] == 4 and len(raw) == shape[0] * 16
        )
        if not valid:
            return Case("shape", req, INVALID)
        x = np.frombuffer(raw, dtype=np.float32).reshape(shape)
        return Case("shape", req, OK, ref.check_mlp(x))
    k = draw(st.integers(0, 12))
    items = draw(st.lists(st.text(max_size=6).map(str.encode), min_size=k, max_size=k))
    raw = framed(items)
    req = request("echo", [("TEXT", "BYTES", shape)], [raw]).SerializeToString()
    valid = len(shape) == 2 and 1 <= shape[0] <= 16 and shape[1] >= 1 and shape[0] * shape[1] == k
    if not valid:
        return Case("shape", req, INVALID)
    return Case("shape", req, OK, check_echo(raw, shape))


@st.composite
def byte_size_lies(draw: st.DrawFn, ref: Reference) -> Case:
    n = draw(rows)
    delta = draw(st.integers(-16 * n, 64).filter(lambda d: d != 0))
    raw = draw(st.binary(min_size=16 * n + delta, max_size=16 * n + delta))
    model = draw(st.sampled_from(FP32_OUT))
    return Case(
        "byte size",
        request(model, [("INPUT0", "FP32", [n, 4])], [raw]).SerializeToString(),
        INVALID,
    )


@st.composite
def contents_mixing(draw: st.DrawFn, ref: Reference) -> Case:
    x = draw(mlp_x())
    req = request("mlp", [("INPUT0", "FP32", list(x.shape))])
    how = draw(st.sampled_from(["raw+contents", "typed", "wrong field", "count", "raw count"]))
    values = [float(v) for v in x.reshape(-1)]
    if how == "raw+contents":
        req.raw_input_contents.append(x.tobytes())
        req.inputs[0].contents.fp32_contents.extend(draw(st.lists(finite, min_size=1, max_size=8)))
        return Case("contents", req.SerializeToString(), INVALID)
    if how == "typed":
        req.inputs[0].contents.fp32_contents.extend(values)
        return Case("contents", req.SerializeToString(), OK, ref.check_mlp(x))
    if how == "wrong field":
        field_name = draw(
            st.sampled_from(["int_contents", "int64_contents", "uint_contents", "bool_contents"])
        )
        getattr(req.inputs[0].contents, field_name).extend([1] * len(values))
        return Case("contents", req.SerializeToString(), INVALID)
    if how == "count":
        extra = draw(st.integers(-len(values), 8).filter(lambda d: d != 0))
        req.inputs[0].contents.fp32_contents.extend((values + [1.0] * 8)[: len(values) + extra])
        return Case("contents", req.SerializeToString(), INVALID)
    n = draw(st.sampled_from([2, 3]))
    for _ in range(n):
        req.raw_input_contents.append(x.tobytes())
    return Case("contents", req.SerializeToString(), INVALID)


@st.composite
def framing_lies(draw: st.DrawFn, ref: Reference) -> Case:
    k = draw(st.integers(1, 8))
    items = draw(st.lists(st.text(max_size=10).map(str.encode), min_size=k, max_size=k))
    raw = framed(items)
    shape = [1, k]
    lie = draw(st.sampled_from(["past end", "truncated prefix", "trailing bytes", "count"]))
    if lie == "past end":  # a length prefix that runs past the end of the content
        i = draw(st.integers(0, k - 1))
        pos = sum(4 + len(items[j]) for j in range(i))
        declared = len(raw) - pos - 4 + draw(st.integers(1, 2**32 - 1 - len(raw)))
        raw = raw[:pos] + struct.pack("<I", declared) + raw[pos + 4 :]
    elif lie == "truncated prefix":  # the last element cut inside its length prefix
        last = framed(items[:-1])
        raw = last + raw[len(last) : len(last) + draw(st.integers(1, 3))]
    elif lie == "trailing bytes":  # bytes after the last element, too few for a prefix
        raw = raw + draw(st.binary(min_size=1, max_size=3))
    else:  # well framed, but more or fewer elements than the shape says
        shape = [1, k + draw(st.sampled_from([-1, 1, 2])) or 2]
    return Case(
        "BYTES framing",
        request("echo", [("TEXT", "BYTES", shape)], [raw]).SerializeToString(),
        INVALID,
    )


BAD_UTF8 = [b"\xff", b"\xfe\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\xe2\x82", b"\xf4\x90\x80\x80"]


@st.composite
def utf8(draw: st.DrawFn, ref: Reference) -> Case:
    k = draw(st.integers(1, 6))
    items = draw(
        st.lists(
            st.binary(max_size=12)
            | st.sampled_from(BAD_UTF8)
            | st.text(max_size=8).map(str.encode),
            min_size=k,
            max_size=k,
        )
    )
    raw = framed(items)
    shape = [1, k]
    req = request("echo", [("TEXT", "BYTES", shape)], [raw])
    if draw(st.booleans()):  # the same text as typed contents
        req.ClearField("raw_input_contents")
        req.inputs[0].contents.bytes_contents.extend(items)
    valid = all(_is_utf8(i) for i in items)
    if not valid:
        return Case("UTF-8", req.SerializeToString(), INVALID)
    return Case("UTF-8", req.SerializeToString(), OK, check_echo(raw, shape))


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@st.composite
def nan_inf(draw: st.DrawFn, ref: Reference) -> Case:
    x = draw(mlp_x(finite | special))
    model = draw(st.sampled_from(FP32_OUT))
    return Case("NaN/Inf", mlp_request(model, x).SerializeToString(), OK, ref.check_mlp(x))


TRICKY_NAMES = [
    "../mlp",
    "mlp/../mlp",
    "./mlp",
    "/mlp",
    "mlp/",
    "mlp/1",
    "..",
    ".",
    "",
    "mlp\x00",
    "\x00mlp",
    "mlp\n",
    " mlp",
    "MLP",
    "\uff4d\uff4c\uff50",  # fullwidth "mlp"
    "mlp\u202e",
    "%2e%2e%2fmlp",
    "..\\mlp",
    "/etc/passwd",
    "models/mlp/1/model.onnx",
    "m" * 10_000,
    "🙂" * 500,
]
TRICKY_VERSIONS = [
    "../1",
    "1/",
    "/1",
    "1\x00",
    "01",
    " 1",
    "-1",
    "0",
    "2",
    "\uff11",
    "\u0663",
    "9" * 400,
]


@st.composite
def path_tricks(draw: st.DrawFn, ref: Reference) -> Case:
    x = draw(mlp_x())
    if draw(st.booleans()):
        name = draw(st.sampled_from(TRICKY_NAMES) | st.text(max_size=40))
        name = name if name not in MODELS else name + "/"
        req = mlp_request(name, x)
        version = draw(st.sampled_from(["", "1"]) | st.text(max_size=8))
    else:
        req = mlp_request("mlp", x)
        version = draw(
            st.sampled_from(TRICKY_VERSIONS)
            | st.text(min_size=1, max_size=20).filter(lambda v: v != "1")
        )
    req.model_version = version
    return Case("path tricks", req.SerializeToString(), NOT_FOUND)


@st.composite
def input_lists(draw: st.DrawFn, ref: Reference) -> Case:
    x = draw(mlp_x())
    how = draw(
        st.sampled_from(
            ["duplicate", "missing", "unknown", "extra", "empty name", "output", "many"]
        )
    )
    req = mlp_request("mlp", x)
    if how == "duplicate":
        req.inputs.add(name="INPUT0", datatype="FP32", shape=list(x.shape))
        req.raw_input_contents.append(x.tobytes())
    elif how == "missing":
        req.ClearField("inputs")
        req.ClearField("raw_input_contents")
    elif how in ("unknown", "empty name"):
        req.inputs[0].name = (
            ""
            if how == "empty name"
            else draw(st.text(min_size=1, max_size=20).filter(lambda n: n != "INPUT0"))
        )
    elif how == "extra":
        req.inputs.add(name=draw(st.text(max_size=10)), datatype="FP32", shape=list(x.shape))
        req.raw_input_contents.append(x.tobytes())
    elif how == "output":
        req.outputs.add(name=draw(st.text(max_size=20).filter(lambda n: n != "OUTPUT0")))
    else:  # hundreds of inputs
        for i in range(draw(st.integers(257, 400))):
            req.inputs.add(name=f"INPUT{i + 1}", datatype="FP32", shape=list(x.shape))
    return Case("inputs", req.SerializeToString(), INVALID)


def _set_param(p: service_pb2.InferParameter, kind: str, value: Any) -> None:
    setattr(p, kind, value)


odd_params = st.one_of(
    st.tuples(st.just("bool_param"), st.booleans()),
    st.tuples(st.just("int64_param"), st.integers(INT64_MIN, INT64_MAX)),
    st.tuples(st.just("uint64_param"), st.integers(0, 2**64 - 1)),
    st.tuples(st.just("double_param"), st.floats(allow_nan=True, allow_infinity=True)),
    st.tuples(st.just("string_param"), st.text(max_size=30)),
)


@st.composite
def parameters(draw: st.DrawFn, ref: Reference) -> Case:
    x = draw(mlp_x())
    req = mlp_request("mlp", x)
    for _ in range(draw(st.integers(0, 3))):  # unknown parameters of any type: ignored
        key = draw(
            st.text(max_size=16).filter(lambda k: k not in ("priority", "timeout", "variant"))
        )
        _set_param(req.parameters[key], *draw(odd_params))
    expect = OK
    which = draw(st.sampled_from(["none", "priority", "timeout", "variant"]))
    if which != "none":
        kind, value = draw(odd_params)
        _set_param(req.parameters[which], kind, value)
        expect = _param_expect(which, kind, value)
    return Case(f"params:{which}", req.SerializeToString(), expect, ref.check_mlp(x))


def _param_expect(which: str, kind: str, value: Any) -> frozenset[grpc.StatusCode]:
    if which == "variant":
        return OK if kind == "string_param" and value in ("", "fp32") else INVALID
    if kind not in ("int64_param", "uint64_param"):
        return INVALID
    if which == "priority":
        return OK if value in (0, 1, 2) else INVALID
    if value < 0:
        return INVALID
    if 0 < value < 2_000_000:  # shorter than a loaded 2-core machine promises an answer
        return frozenset({Code.OK, Code.DEADLINE_EXCEEDED})
    return OK  # 0 = none; huge ones are capped, not an overflow


@st.composite
def undecodable(draw: st.DrawFn, ref: Reference) -> Case:
    x = draw(mlp_x())
    good = mlp_request("mlp", x).SerializeToString()
    how = draw(st.sampled_from(["random", "bad utf-8 string", "truncated", "bad tensor name"]))
    bad = draw(st.sampled_from(BAD_UTF8))
    if how == "random":  # random bytes may well parse (as a request naming no model)
        payload = draw(st.binary(max_size=64))
        return Case("undecodable", payload, frozenset({Code.INVALID_ARGUMENT, Code.NOT_FOUND}))
    if how == "bad utf-8 string":  # model_name / model_version / id
        payload = good + protowire.field(draw(st.sampled_from([1, 2, 3])), b"mlp" + bad)
    elif how == "bad tensor name":  # inputs[].name
        payload = good + protowire.field(5, protowire.field(1, bad) + protowire.field(2, b"FP32"))
    else:
        cut = draw(st.integers(1, len(good) - 1))
        payload = good[:cut]
        # A cut between two fields leaves a valid (smaller) request: a missing input, or
        # a name cut short (unknown model / input).
        return Case("undecodable", payload, frozenset({Code.INVALID_ARGUMENT, Code.NOT_FOUND}))
    return Case("undecodable", payload, INVALID)


STRATEGIES = {
    "datatype": wrong_datatype,
    "shape": shapes,
    "byte size": byte_size_lies,
    "contents": contents_mixing,
    "BYTES framing": framing_lies,
    "UTF-8": utf8,
    "NaN/Inf": nan_inf,
    "path tricks": path_tricks,
    "inputs": input_lists,
    "params": parameters,
    "undecodable": undecodable,
}


# -- the run -------------------------------------------------------------------------------


@dataclass
class Tally:
    codes: Counter[tuple[str, str]] = field(default_factory=Counter)
    hostile: int = 0
    honest: int = 0
    honest_batched: int = 0  # honest answers computed in a batch beside another request


class Honest:
    """Honest requests to send beside the hostile ones, each with its expected answer."""

    def __init__(self, ref: Reference) -> None:
        rng = np.random.default_rng(8)
        pool: list[tuple[bytes, Callable[[service_pb2.ModelInferResponse], None], int]] = []
        for i in range(12):
            if i % 4 == 3:
                items = [f"honest {i} ✓".encode(), b"", "二".encode()]
                raw = framed(items)
                req = request("echo", [("TEXT", "BYTES", [1, 3])], [raw])
                pool.append((req.SerializeToString(), check_echo(raw, [1, 3]), 1))
            else:
                x = rng.standard_normal((1 + i % 3, 4)).astype(np.float32)
                pool.append(
                    (mlp_request("mlp", x).SerializeToString(), ref.check_mlp(x), x.shape[0])
                )
        self._next = cycle(pool)

    def __iter__(self) -> Iterator[tuple[bytes, Callable[[Any], None], int]]:
        return self._next


class Sender:
    """Sends each hostile request beside an honest one. The hostile answer is awaited and
    checked at once; honest answers are checked once HONEST_WINDOW more are in flight, so
    their round trip through the mesh does not pace the run."""

    def __init__(self, call: Any, honest: Honest, tally: Tally) -> None:
        self._call = call
        self._honest = iter(honest)
        self._tally = tally
        self._in_flight: deque[tuple[Any, Callable[[Any], None], int, str]] = deque()

    def send(self, case: Case) -> None:
        payload, check_honest, rows = next(self._honest)
        honest = self._call.future(payload, timeout=CALL_TIMEOUT_S)
        hostile = self._call.future(case.payload, timeout=CALL_TIMEOUT_S)
        self._in_flight.append((honest, check_honest, rows, case.label))
        code, details, body = _outcome(hostile)
        self._tally.hostile += 1
        self._tally.codes[(case.label, code.name)] += 1
        assert code not in (Code.INTERNAL, Code.UNKNOWN), f"{case.label}: {code.name} {details!r}"
        assert code in DOCUMENTED, f"{case.label}: undocumented {code.name} {details!r}"
        assert code in case.expect, f"{case.label}: got {code.name} {details!r}, want {case.expect}"
        if code == Code.OK and case.check is not None:
            case.check(service_pb2.ModelInferResponse.FromString(body))
        while len(self._in_flight) > HONEST_WINDOW:
            self._check_honest()

    def drain(self) -> None:
        while self._in_flight:
            self._check_honest()

    def _check_honest(self) -> None:
        future, check, rows, beside = self._in_flight.popleft()
        code, details, body = _outcome(future)
        assert code == Code.OK, f"honest request beside {beside}: {code.name} {details}"
        resp = service_pb2.ModelInferResponse.FromString(body)
        check(resp)
        self._tally.honest += 1
        if resp.parameters["tiermesh.batch_size"].int64_param > rows:
            self._tally.honest_batched += 1


def _outcome(future: Any) -> tuple[grpc.StatusCode, str, bytes]:
    try:
        return Code.OK, "", future.result()
    except grpc.RpcError as err:
        return err.code(), err.details() or "", b""


def test_hostile_requests_get_documented_codes_and_break_nothing(mesh_up: UpProcess) -> None:
    model = mesh_up.trace_dir.parent / "models" / "mlp" / "1" / "model.onnx"
    ref = Reference(ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]))
    honest = Honest(ref)
    tally = Tally()
    before = mesh_up.children()
    log_start = len(mesh_up.log.read_bytes())
    started = time.monotonic()
    with grpc.insecure_channel(mesh_up.url) as channel:
        call = channel.unary_unary(METHOD)
        sender = Sender(call, honest, tally)
        for strategy in STRATEGIES.values():

            @settings(
                max_examples=EXAMPLES,
                derandomize=True,
                database=None,
                deadline=None,
                phases=(Phase.explicit, Phase.generate, Phase.shrink),
                suppress_health_check=list(HealthCheck),
            )
            @given(case=strategy(ref))
            def run(case: Case) -> None:
                sender.send(case)

            run()
        sender.drain()
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        # Still serving, and still right.
        assert stub.ServerLive(service_pb2.ServerLiveRequest(), timeout=10).live
        assert stub.ServerReady(service_pb2.ServerReadyRequest(), timeout=10).ready
        payload, check, _ = next(iter(honest))
        check(service_pb2.ModelInferResponse.FromString(call(payload, timeout=10)))
    elapsed = time.monotonic() - started
    _report(tally, elapsed)
    assert mesh_up.proc.poll() is None
    assert mesh_up.children() == before, "a service died and was restarted during the run"
    log = mesh_up.log.read_bytes()[log_start:].decode(errors="replace")
    assert "unexpected error" not in log and "Traceback" not in log, log[-4000:]
    assert tally.hostile >= 3000
    assert tally.honest == tally.hostile
    assert tally.honest_batched > 0, "no honest request shared a batch with a hostile one"


def _report(tally: Tally, elapsed: float) -> None:
    by_class: dict[str, Counter[str]] = {}
    for (label, code), n in tally.codes.items():
        by_class.setdefault(label, Counter())[code] += n
    print(
        f"\nhostile requests: {tally.hostile}, honest beside them: {tally.honest} "
        f"({tally.honest_batched} computed in a shared batch), {elapsed:.1f} s"
    )
    for label in sorted(by_class):
        codes = ", ".join(f"{c} {n}" for c, n in sorted(by_class[label].items()))
        print(f"  {label:<18} {codes}")
