"""Fixtures shared by the unit tests of generation."""

from __future__ import annotations

import onnxruntime as ort
import pytest

from tests.tiny_llama import write_tiny_gguf
from tiermesh.convert.llama import convert_gguf
from tiermesh.worker.runner import session_options


@pytest.fixture(scope="session")
def tiny_decoder(tmp_path_factory: pytest.TempPathFactory) -> ort.InferenceSession:
    """An onnxruntime session of the decoder converted from a tiny random llama GGUF."""
    d = tmp_path_factory.mktemp("tiny_decoder")
    write_tiny_gguf(d / "tiny.gguf")
    convert_gguf(d / "tiny.gguf", d / "tiny.onnx")
    return ort.InferenceSession(str(d / "tiny.onnx"), session_options(1))
