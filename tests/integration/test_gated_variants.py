"""Only gated variants serve, through the real mesh (gateway, router, Redis, worker,
postprocess in this process): a variant whose accuracy gate failed answers nobody, whether
a caller names it or a tier opts into it, and no worker builds a session for it. The
default repository's int8 variants carry passing records."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import redis.asyncio as aioredis
import tritonclient.grpc.aio as aioclient
import yaml
from tritonclient.utils import InferenceServerException

from tests.conftest import MODELS
from tests.integration.conftest import start_mesh
from tests.unit.test_gates import record
from tiermesh.cli.main import main
from tiermesh.core import keys
from tiermesh.core.builtin_models import build_mlp
from tiermesh.core.compute_unit import ComputeUnit
from tiermesh.core.gates import write_record

pytestmark = pytest.mark.integration


def _repo(root: Path) -> tuple[bytes, bytes]:
    """`tiny`: the mlp as fp32, other weights as int8 (so answers tell them apart), an edge
    tier that opts into int8, and an int8 gate record that failed."""
    fp32, int8 = build_mlp(), build_mlp(seed=7)
    folder = root / "tiny" / "1"
    folder.mkdir(parents=True)
    (folder / "model.onnx").write_bytes(fp32)
    (folder / "model.int8.onnx").write_bytes(int8)
    sha = {
        f: hashlib.sha256(b).hexdigest()
        for f, b in (("model.onnx", fp32), ("model.int8.onnx", int8))
    }
    config = {
        "name": "tiny",
        "max_batch_size": 8,
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "dims": [4]}],
        "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "dims": [3]}],
        "variants": {"fp32": "model.onnx", "int8": "model.int8.onnx"},
        "default_variant": "fp32",
        "tiers": {
            "mixed_variants": True,
            "edge": {"variant": "int8", "max_cost": 64},
            "center": {"variant": "fp32"},
        },
        "versions": {"1": sha},
    }
    (root / "tiny" / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    write_record(folder, "int8", record(sha256=sha["model.int8.onnx"], passed=False))
    return fp32, int8


async def test_a_failed_variant_answers_nobody(redis_url: str, tmp_path: Path) -> None:
    fp32, int8 = _repo(tmp_path)
    rows = np.random.default_rng(3).standard_normal((2, 4)).astype(np.float32)
    want = {
        name: ort.InferenceSession(data).run(None, {"INPUT0": rows})[0]
        for name, data in (("fp32", fp32), ("int8", int8))
    }
    assert np.abs(want["fp32"] - want["int8"]).max() > 0.1
    # One worker, on the edge: the tier whose config asks for the failed int8.
    mesh = await start_mesh(redis_url, tmp_path, worker_tier="edge")
    client = aioclient.InferenceServerClient(mesh.gateway)
    try:
        tensor = aioclient.InferInput("INPUT0", [2, 4], "FP32")
        tensor.set_data_from_numpy(rows)
        with pytest.raises(InferenceServerException) as exc:
            await client.infer("tiny", [tensor], parameters={"variant": "int8"})
        assert exc.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert "variant 'int8' of model 'tiny' version 1 has no passing accuracy-gate record" in (
            exc.value.message()
        )
        # Light, unnamed: the edge answers, with the reference instead of its failed int8.
        answer = await client.infer("tiny", [tensor])
        params = answer.get_response().parameters
        assert params["tiermesh.tier"].string_param == "edge"
        assert params["tiermesh.variant"].string_param == "fp32"
        np.testing.assert_allclose(answer.as_numpy("OUTPUT0"), want["fp32"], atol=1e-5, rtol=0)
        redis = aioredis.Redis.from_url(redis_url)
        try:
            live = {
                variant: await redis.zcard(
                    keys.workers_key(ComputeUnit("tiny", "1", variant), "edge")
                )
                for variant in ("fp32", "int8")
            }
        finally:
            await redis.aclose()
        assert live == {"fp32": 1, "int8": 0}
    finally:
        await client.close()
        await mesh.close()


def test_every_quantized_variant_of_the_default_repository_passed(
    fetched_models: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["models", "verify", "--repository", str(MODELS)]) == 0
    out = capsys.readouterr().out
    for name in fetched_models:
        assert "  1/int8: serves: passed cosine>=0.99 (mean 0.99" in out.split(f"\n{name}:")[1]
    assert "does NOT serve" not in out
