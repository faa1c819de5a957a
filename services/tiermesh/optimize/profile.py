"""What a model costs and where it can run, read from the graph alone (`tiermesh profile`).

Everything here is an estimate from the ONNX graph: parameter counts, an op histogram,
FLOPs and bytes per token for the matrix products, the dynamic axes of the interface, and a
hardware matrix saying which op types each execution provider (EP) cannot run. The analysis
functions are pure (ModelProto in, frozen dataclasses out); `verify_installed` is the one
place that creates onnxruntime sessions; `render` only formats.
"""

from __future__ import annotations

import collections
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass

import onnx
from onnx import helper

from tiermesh.core.sessions import CPU

# Machine balance: peak FLOP/s over memory bandwidth. A server CPU core group does roughly
# 1-2 TFLOP/s FP32 (AVX-512 FMA) against ~100-200 GB/s of DRAM bandwidth: ~10 FLOP/byte.
# Work below this intensity waits on memory, above it on arithmetic. (A datacenter GPU sits
# near 100-300 FLOP/byte, so the same batch is far more memory-bound there.)
CPU_MACHINE_BALANCE = 10.0
STATIC_TABLE_SOURCE = "static table, onnxruntime 1.2x docs"
NOT_INSTALLED = "n/a (not installed here; static table)"
_ACT_BYTES = 4  # activations are taken as FP32 (int8 inputs of MatMulInteger: 1 byte)


@dataclass(frozen=True)
class Parameters:
    tensors: int
    elements: int
    bytes: int


@dataclass(frozen=True)
class MatMulCost:
    """One matrix product; `flops_per_token` is per row of its activation input."""

    node: str
    op_type: str
    kind: str  # "weight" (constant [K, N] operand) or "activation" (attention-style)
    k: int
    n: int
    flops_per_token: int
    weight_bytes: int
    activation_bytes_per_token: int


@dataclass(frozen=True)
class Intensity:
    tokens: int
    flops: int
    bytes_moved: int
    flops_per_byte: float
    bound: str  # "compute-bound" | "memory-bound"


@dataclass(frozen=True)
class ComputeEstimate:
    seq: int
    hidden: int
    hidden_source: str
    flops_per_token: int
    weight_bytes: int
    activation_bytes_per_token: int
    machine_balance: float
    intensity: tuple[Intensity, ...]
    matmuls: tuple[MatMulCost, ...]


@dataclass(frozen=True)
class DynamicAxis:
    tensor: str
    role: str  # "input" | "output"
    axis: int
    name: str  # the symbolic dim name; "?" when the dim has neither name nor value


@dataclass(frozen=True)
class EpSupport:
    provider: str
    installed: bool
    checked_by: str  # STATIC_TABLE_SOURCE, or "session" when verified with onnxruntime
    unsupported: tuple[str, ...]
    note: str


@dataclass(frozen=True)
class ModelProfile:
    parameters: Parameters
    ops: tuple[tuple[str, int], ...]  # (op type, node count), most frequent first
    compute: ComputeEstimate
    dynamic_axes: tuple[DynamicAxis, ...]
    matrix: tuple[EpSupport, ...]


# --- the static support table -------------------------------------------------------------
# Typed from the execution providers' public operator pages (onnxruntime 1.2x era). CUDA and
# TensorRT run nearly every standard op, so they are written as "all standard ops except";
# MIGraphX, OpenVINO and CoreML publish positive lists. Contrib ops (com.microsoft) are named
# with their domain. `Constant` is left out everywhere: onnxruntime folds it into an
# initializer before any EP sees the graph.
_STRING_AND_ML = set(
    "StringNormalizer TfIdfVectorizer RegexFullMatch StringConcat StringSplit ImageDecoder "
    "com.microsoft::DynamicQuantizeMatMul com.microsoft::MatMulIntegerToFloat".split()
)
_CUDA_LACKS = _STRING_AND_ML | set(
    "Unique DFT STFT Col2Im CenterCropPad MelWeightMatrix BlackmanWindow HannWindow "
    "HammingWindow DynamicQuantizeLinear ConvInteger Multinomial Bernoulli".split()
)
_TENSORRT_LACKS = _CUDA_LACKS | set(
    "MatMulInteger QLinearMatMul QLinearConv BitShift Det SequenceAt SequenceConstruct "
    "SequenceEmpty SequenceInsert SequenceLength SplitToSequence ConcatFromSequence "
    "OptionalHasElement OptionalGetElement".split()
)
_COMMON_POSITIVE = set(
    "Abs Acos Acosh Add And ArgMax ArgMin Asin Asinh Atan Atanh AveragePool "
    "BatchNormalization Cast Ceil Celu Clip Concat ConstantOfShape Conv ConvInteger "
    "ConvTranspose Cos Cosh CumSum DepthToSpace DequantizeLinear Div Dropout "
    "DynamicQuantizeLinear Elu Equal Erf Exp Expand EyeLike Flatten Floor GRU Gather "
    "GatherElements GatherND Gemm GlobalAveragePool GlobalMaxPool Greater GreaterOrEqual "
    "HardSigmoid HardSwish Identity If InstanceNormalization LayerNormalization LeakyRelu "
    "Less LessOrEqual Log LogSoftmax Loop LpNormalization LRN LSTM MatMul MatMulInteger Max "
    "MaxPool Mean Min Mod Mul Neg NonMaxSuppression NonZero Not OneHot Or Pad Pow PRelu "
    "QLinearMatMul QuantizeLinear Range Reciprocal ReduceL1 ReduceL2 ReduceLogSum "
    "ReduceLogSumExp ReduceMax ReduceMean ReduceMin ReduceProd ReduceSum ReduceSumSquare "
    "Relu Reshape Resize ReverseSequence RNN RoiAlign Round ScatterElements ScatterND Selu "
    "Shape Sigmoid Sign Sin Sinh Slice Softmax Softplus Softsign SpaceToDepth Split Sqrt "
    "Squeeze Sub Sum Tan Tanh ThresholdedRelu Tile TopK Transpose Trilu Unsqueeze Upsample "
    "Where Xor".split()
)
_MIGRAPHX = _COMMON_POSITIVE | set(
    "QLinearAdd QLinearConv RandomNormal RandomNormalLike RandomUniform RandomUniformLike "
    "Multinomial com.microsoft::FastGelu com.microsoft::BiasGelu com.microsoft::Gelu "
    "com.microsoft::SkipLayerNormalization".split()
)
_OPENVINO = _COMMON_POSITIVE | set(
    "BitShift CastLike Einsum GlobalLpPool GridSample Hardmax MeanVarianceNormalization Mish "
    "Shrink Size".split()
)
_COREML = set(
    "Add ArgMax AveragePool BatchNormalization Cast Clip Concat Conv ConvTranspose "
    "DepthToSpace Div Erf Flatten Gather Gemm GlobalAveragePool GlobalMaxPool GridSample "
    "GroupNormalization InstanceNormalization LayerNormalization LeakyRelu MatMul Max MaxPool "
    "Min Mul Pad Pow PRelu Reciprocal ReduceMax ReduceMean ReduceSum Relu Reshape Resize "
    "Round Shape Sigmoid Slice Softmax Split Sqrt Squeeze Sub Tanh Transpose Unsqueeze "
    "com.microsoft::Gelu".split()
)
_CPU_DOMAINS = ("", "ai.onnx.ml", "com.microsoft")  # ai.onnx is spelled "" here


@dataclass(frozen=True)
class _EpRule:
    provider: str
    label: str
    supported: frozenset[str] | None  # None: every standard op minus `lacks`
    lacks: frozenset[str]
    note: str


EP_RULES: tuple[_EpRule, ...] = (
    _EpRule(CPU, "CPU", None, frozenset(), "reference EP: all standard ops"),
    _EpRule(
        "CUDAExecutionProvider",
        "CUDA",
        None,
        frozenset(_CUDA_LACKS),
        "missing ops fall back to CPU",
    ),
    _EpRule(
        "TensorrtExecutionProvider",
        "TensorRT",
        None,
        frozenset(_TENSORRT_LACKS),
        "unsupported subgraphs fall back to CUDA/CPU",
    ),
    _EpRule(
        "MIGraphXExecutionProvider",
        "ROCm/MIGraphX",
        frozenset(_MIGRAPHX),
        frozenset(),
        "positive list; ROCm EP kernels mirror CUDA's",
    ),
    _EpRule(
        "OpenVINOExecutionProvider", "OpenVINO", frozenset(_OPENVINO), frozenset(), "positive list"
    ),
    _EpRule(
        "CoreMLExecutionProvider",
        "CoreML",
        frozenset(_COREML),
        frozenset(),
        "positive list (ML Program + NeuralNetwork)",
    ),
)


# --- analysis (pure) ----------------------------------------------------------------------


def _op_key(node: onnx.NodeProto) -> str:
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"


def _nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """Every node, including those inside If/Loop/Scan bodies."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _nodes(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    yield from _nodes(sub)


def _elem_size(elem_type: int) -> int:
    return int(helper.tensor_dtype_to_np_dtype(elem_type).itemsize)


def _numel(dims: Iterable[int]) -> int:
    total = 1
    for d in dims:
        total *= int(d)
    return total


def parameters(model: onnx.ModelProto) -> Parameters:
    inits = model.graph.initializer
    elements = sum(_numel(t.dims) for t in inits)
    size = sum(_numel(t.dims) * _elem_size(t.data_type) for t in inits)
    return Parameters(tensors=len(inits), elements=elements, bytes=size)


def op_histogram(model: onnx.ModelProto) -> tuple[tuple[str, int], ...]:
    counts = collections.Counter(_op_key(n) for n in _nodes(model.graph))
    return tuple(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def _constants(model: onnx.ModelProto) -> dict[str, onnx.TensorProto]:
    consts = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.output:
            for attr in node.attribute:
                if attr.name == "value":
                    consts[node.output[0]] = attr.t
    return consts


def _weight_cost(node: onnx.NodeProto, weight: onnx.TensorProto) -> MatMulCost | None:
    dims = list(weight.dims)
    if len(dims) < 2:
        return None
    k, n = dims[-2], dims[-1]
    if node.op_type == "Gemm" and any(a.name == "transB" and a.i for a in node.attribute):
        k, n = n, k
    slices = _numel(dims[:-2])  # a batched weight: every slice sees its own rows
    in_bytes = 1 if node.op_type == "MatMulInteger" else _ACT_BYTES
    return MatMulCost(
        node=node.name,
        op_type=node.op_type,
        kind="weight",
        k=k,
        n=n,
        flops_per_token=2 * k * n * slices,
        weight_bytes=_numel(dims) * _elem_size(weight.data_type),
        activation_bytes_per_token=k * in_bytes + n * _ACT_BYTES,
    )


def compute_estimate(
    model: onnx.ModelProto,
    seq: int = 128,
    machine_balance: float = CPU_MACHINE_BALANCE,
    hidden: int = 0,
) -> ComputeEstimate:
    """FLOPs and bytes per token of the matrix products (everything else is ignored).

    A product with a constant [K, N] operand costs 2*K*N FLOPs per token and reads its
    weight once per batch. A product of two activations (attention scores, scores x values)
    costs 2*seq*hidden per token at the reference `seq`, all heads together; `hidden` is the
    most common K of the weight products unless given.
    """
    consts = _constants(model)
    weighted: list[MatMulCost] = []
    pairs: list[onnx.NodeProto] = []
    for node in _nodes(model.graph):
        if node.op_type not in ("MatMul", "Gemm", "MatMulInteger") or len(node.input) < 2:
            continue
        weight = consts.get(node.input[1]) or consts.get(node.input[0])
        cost = _weight_cost(node, weight) if weight is not None else None
        if cost is not None:
            weighted.append(cost)
        elif weight is None:
            pairs.append(node)
    source = "given"
    if not hidden:
        ks = collections.Counter(c.k for c in weighted)
        hidden, source = (
            (ks.most_common(1)[0][0], "most common K of weight products") if ks else (0, "none")
        )
    attention = [
        MatMulCost(
            node=node.name,
            op_type=node.op_type,
            kind="activation",
            k=hidden,
            n=seq,
            flops_per_token=2 * seq * hidden,
            weight_bytes=0,
            activation_bytes_per_token=(hidden + seq) * _ACT_BYTES,
        )
        for node in pairs
    ]
    costs = (*weighted, *attention)
    flops = sum(c.flops_per_token for c in costs)
    wbytes = sum(c.weight_bytes for c in costs)
    abytes = sum(c.activation_bytes_per_token for c in costs)
    return ComputeEstimate(
        seq=seq,
        hidden=hidden,
        hidden_source=source,
        flops_per_token=flops,
        weight_bytes=wbytes,
        activation_bytes_per_token=abytes,
        machine_balance=machine_balance,
        intensity=tuple(
            intensity(flops, wbytes, abytes, tokens, machine_balance) for tokens in (1, seq)
        ),
        matmuls=costs,
    )


def intensity(
    flops_per_token: int, weight_bytes: int, act_bytes_per_token: int, tokens: int, balance: float
) -> Intensity:
    """Arithmetic intensity of one batch of `tokens`: weights read once, activations per token."""
    flops = flops_per_token * tokens
    moved = weight_bytes + act_bytes_per_token * tokens
    ratio = flops / moved if moved else 0.0
    return Intensity(
        tokens, flops, moved, ratio, "compute-bound" if ratio >= balance else "memory-bound"
    )


def dynamic_axes(model: onnx.ModelProto) -> tuple[DynamicAxis, ...]:
    init_names = {t.name for t in model.graph.initializer}
    found: list[DynamicAxis] = []
    for role, values in (("input", model.graph.input), ("output", model.graph.output)):
        for value in values:
            if value.name in init_names or not value.type.HasField("tensor_type"):
                continue
            for axis, dim in enumerate(value.type.tensor_type.shape.dim):
                if dim.HasField("dim_value"):
                    continue
                found.append(DynamicAxis(value.name, role, axis, dim.dim_param or "?"))
    return tuple(found)


def _rule_lacks(rule: _EpRule, op: str) -> bool:
    """True when the table says `rule`'s EP has no kernel for `op` (custom domains: none has)."""
    if op == "Constant":
        return False
    domain = op.split("::")[0] if "::" in op else ""
    if rule.supported is not None:
        return op not in rule.supported
    domains = _CPU_DOMAINS if rule.label == "CPU" else ("", "com.microsoft")
    return domain not in domains or op in rule.lacks


def ep_matrix(ops: Iterable[str], available: Sequence[str] = ()) -> tuple[EpSupport, ...]:
    """Which of `ops` each EP cannot run, by the static table; `available` only marks rows."""
    present = sorted(set(ops))
    return tuple(
        EpSupport(
            provider=rule.label,
            installed=rule.provider in available,
            checked_by=STATIC_TABLE_SOURCE,
            unsupported=tuple(op for op in present if _rule_lacks(rule, op)),
            note=rule.note if rule.provider in available else f"{NOT_INSTALLED}; {rule.note}",
        )
        for rule in EP_RULES
    )


def profile(
    model: onnx.ModelProto,
    seq: int = 128,
    machine_balance: float = CPU_MACHINE_BALANCE,
    available: Sequence[str] = (),
) -> ModelProfile:
    ops = op_histogram(model)
    return ModelProfile(
        parameters=parameters(model),
        ops=ops,
        compute=compute_estimate(model, seq, machine_balance),
        dynamic_axes=dynamic_axes(model),
        matrix=ep_matrix((op for op, _ in ops), available),
    )


# --- verification with the EPs installed here (creates sessions) --------------------------


def _dummy_feed(session: object, seq: int) -> dict[str, object]:
    import numpy as np

    kinds = {
        "float": np.float32,
        "double": np.float64,
        "int64": np.int64,
        "int32": np.int32,
        "bool": np.bool_,
        "float16": np.float16,
        "uint8": np.uint8,
        "int8": np.int8,
    }
    feed: dict[str, object] = {}
    for arg in session.get_inputs():  # type: ignore[attr-defined]
        shape = [
            d if isinstance(d, int) else (1 if axis == 0 else seq)
            for axis, d in enumerate(arg.shape)
        ]
        dtype = kinds.get(arg.type.removeprefix("tensor(").removesuffix(")"), np.float32)
        feed[arg.name] = np.zeros(shape, dtype=dtype)
    return feed


def _fallback_ops(model_bytes: bytes, provider: str, seq: int) -> tuple[str, ...]:
    """Op types the session placed on CPU although `provider` came first (one profiled run)."""
    from tiermesh.core.sessions import ProviderSpec, open_session, session_options

    opts = session_options(1)
    opts.enable_profiling = True
    opts.log_severity_level = 3
    # Refuse, never fall back: a session that silently lost `provider` would report every
    # node on CPU as that provider's gap.
    request = (ProviderSpec(provider), ProviderSpec(CPU))
    session = open_session(model_bytes, opts, request, fallback="refuse").session
    session.run(None, _dummy_feed(session, seq))
    path = session.end_profiling()
    with open(path) as f:
        events = json.load(f)
    on_cpu = {
        e["args"]["op_name"]
        for e in events
        if e.get("cat") == "Node" and e.get("args", {}).get("provider") == CPU
    }
    return tuple(sorted(on_cpu))


def verify_installed(
    matrix: Sequence[EpSupport], model_bytes: bytes, available: Sequence[str], seq: int = 8
) -> tuple[EpSupport, ...]:
    """Replace the static rows of EPs present in `available` with what a session reports.

    CPU: the session is created and nothing else (CPU is the last fallback, so creation
    fails exactly when an op has no kernel at all). Other EPs: one run with zero inputs,
    profiled; the op types of nodes placed on CPU are reported (after graph optimisation,
    so fused op names may appear; CUDA also puts small shape computations on CPU on purpose).
    """
    from tiermesh.core.sessions import ProviderSpec, open_session, session_options

    by_label = {rule.label: rule for rule in EP_RULES}
    rows: list[EpSupport] = []
    for row in matrix:
        provider = by_label[row.provider].provider
        if provider not in available:
            rows.append(row)
            continue
        try:
            if provider == CPU:
                open_session(model_bytes, session_options(1), (ProviderSpec(CPU),))
                fell_back: tuple[str, ...] = ()
                note = "session created: every node has a CPU kernel"
            else:
                fell_back = _fallback_ops(model_bytes, provider, seq)
                note = "session run once; listed op types were placed on CPU"
        except Exception as exc:  # an EP's failure is reported, not raised
            rows.append(
                EpSupport(
                    row.provider,
                    True,
                    STATIC_TABLE_SOURCE,
                    row.unsupported,
                    f"session failed ({type(exc).__name__}: {str(exc)[:160]}); static table shown",
                )
            )
            continue
        rows.append(EpSupport(row.provider, True, "session", fell_back, note))
    return tuple(rows)


# --- formatting ---------------------------------------------------------------------------


def _si(value: float, unit: str) -> str:
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.2f} {prefix}{unit}"
    return f"{value:.0f} {unit}"


def _flops(costs: Iterable[MatMulCost]) -> int:
    return sum(m.flops_per_token for m in costs)


def as_json(result: ModelProfile) -> str:
    return json.dumps(asdict(result), indent=2)


def render(name: str, variant: str, result: ModelProfile, top: int = 10) -> str:
    p, c = result.parameters, result.compute
    lines = [
        f"model {name} (variant {variant})",
        "",
        "== parameters",
        f"  {p.elements:,} elements in {p.tensors} initializers, {_si(p.bytes, 'B')}",
        "",
        "== op types (node count)",
    ]
    shown, rest = result.ops[:top], result.ops[top:]
    lines += [f"  {op:<32} {n:>6}" for op, n in shown]
    if rest:
        lines.append(
            f"  {'(others: ' + str(len(rest)) + ' types)':<32} {sum(n for _, n in rest):>6}"
        )
    weight = [m for m in c.matmuls if m.kind == "weight"]
    attn = [m for m in c.matmuls if m.kind == "activation"]
    lines += [
        "",
        f"== compute per token (ESTIMATES: matrix products only, seq={c.seq})",
        f"  weight products     {len(weight):>4}  {_si(_flops(weight), 'FLOP')}  (2*K*N each)",
        f"  activation products {len(attn):>4}  {_si(_flops(attn), 'FLOP')}"
        f"  (2*seq*hidden each, hidden={c.hidden}: {c.hidden_source})",
        f"  total               {'':>4}  {_si(c.flops_per_token, 'FLOP')} per token",
        f"  weight bytes read once per batch: {_si(c.weight_bytes, 'B')}; "
        f"activation bytes per token: {_si(c.activation_bytes_per_token, 'B')}",
        f"  machine balance {c.machine_balance:g} FLOP/byte (typical CPU: ~1-2 TFLOP/s over "
        "~100-200 GB/s)",
        f"  {'tokens/batch':>14} {'FLOPs':>12} {'bytes moved':>12} {'FLOP/byte':>10}  verdict",
    ]
    lines += [
        f"  {i.tokens:>14} {_si(i.flops, ''):>12} {_si(i.bytes_moved, 'B'):>12} "
        f"{i.flops_per_byte:>10.1f}  {i.bound}"
        for i in c.intensity
    ]
    lines += ["", "== dynamic axes"]
    lines += [f"  {a.role:<6} {a.tensor:<28} axis {a.axis}: {a.name}" for a in result.dynamic_axes]
    if not result.dynamic_axes:
        lines.append("  none (all dims fixed)")
    lines += [
        "",
        "== hardware evaluation matrix (op types present in this model that the EP cannot run)",
    ]
    for row in result.matrix:
        missing = ", ".join(row.unsupported) if row.unsupported else "none"
        lines.append(f"  {row.provider:<14} [{row.checked_by}] cannot run: {missing}")
        lines.append(f"  {'':<14} {row.note}")
    return "\n".join(lines) + "\n"
