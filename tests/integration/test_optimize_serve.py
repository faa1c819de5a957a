"""`tiermesh optimize` writes a passing variant into the repository; the mesh serves it by
name and its answers equal direct onnxruntime on that variant file."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc.aio as aioclient

from tests.conftest import MODELS
from tests.integration.conftest import start_mesh
from tiermesh.core.repository import ModelRepository
from tiermesh.core.text import TextEncoder
from tiermesh.optimize import datasets, evaluate
from tiermesh.optimize.gate import parse_gate
from tiermesh.optimize.pipeline import Plan, run

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture
def l3_repo(tmp_path: Path, fetched_models: tuple[str, ...]) -> Path:
    """minilm-l3 with its weights copied (optimize writes into the version folder)."""
    repo = tmp_path / "models"
    (repo / "minilm-l3").mkdir(parents=True)
    shutil.copy(MODELS / "minilm-l3" / "config.yaml", repo / "minilm-l3" / "config.yaml")
    shutil.copytree(MODELS / "minilm-l3" / "1", repo / "minilm-l3" / "1")
    return repo


async def test_an_optimized_variant_is_served_and_equals_onnxruntime(
    l3_repo: Path, redis_url: str, tmp_path: Path
) -> None:
    texts = datasets.builtin_texts("eval")[:24]
    results = run(
        Plan(
            "minilm-l3",
            l3_repo,
            tmp_path / "report",
            parse_gate("cosine>=0.95"),
            datasets.builtin_texts("calibration")[:16],
            texts,
            progress=False,
        )
    )
    assert (tmp_path / "report" / "report.md").exists()
    written = {r.name for r in results if r.passed and r.name != "fp32"}
    assert "fp16" in written  # FP16 stays within any sane gate
    repo = ModelRepository(l3_repo)
    cfg = repo.load()["minilm-l3"]
    assert written <= set(cfg.variants)
    fp16 = repo.checked_file("minilm-l3", variant="fp16")

    mesh = await start_mesh(redis_url, l3_repo, worker_models="minilm-l3")
    try:
        client = aioclient.InferenceServerClient(mesh.gateway)
        try:
            inp = aioclient.InferInput("text", [4, 1], "BYTES")
            inp.set_data_from_numpy(np.array([[t.encode()] for t in texts[:4]], dtype=object))
            got = await client.infer("minilm-l3", [inp], parameters={"variant": "fp16"})
        finally:
            await client.close()
    finally:
        await mesh.close()
    assert got.get_response().parameters["tiermesh.variant"].string_param == "fp16"
    encoder = TextEncoder(fp16.parent / "tokenizer.json", 128)
    want = evaluate.embed(evaluate.session(fp16), encoder, texts[:4])
    np.testing.assert_allclose(got.as_numpy("sentence_embedding"), want, atol=1e-5)


async def test_a_gate_nothing_can_pass_rejects_with_a_clear_message(
    l3_repo: Path, tmp_path: Path
) -> None:
    texts = datasets.builtin_texts("eval")[:12]
    results = run(
        Plan(
            "minilm-l3",
            l3_repo,
            tmp_path / "report",
            parse_gate("cosine_min>=1"),
            datasets.builtin_texts("calibration")[:8],
            texts,
            write_back=False,
            progress=False,
            variants=("int8qdq",),  # its mixed fallback is the rejection to see
        )
    )
    assert [r.name for r in results if r.passed] == ["fp32"]
    md = (tmp_path / "report" / "report.md").read_text()
    assert "int8mixed: rejected: no set of FP32 nodes makes INT8 pass cosine_min>=1" in md
    assert "variants.yaml" not in {p.name for p in (l3_repo / "minilm-l3" / "1").iterdir()}
