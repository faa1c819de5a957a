"""Fixtures every test layer shares: a real redis-server on a free port, and a model
repository built into a temporary folder from the committed configs."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import redis
import redis.asyncio as aioredis
from onnx import TensorProto, helper, numpy_helper

from tests.tiny_llama import write_tiny_gguf
from tiermesh.convert.llama import convert_gguf
from tiermesh.convert.minilm import fetch_minilm
from tiermesh.core.builtin_models import BUILDERS, IR_VERSION, OPSET, build_into, build_mlp
from tiermesh.core.cache_dir import default_cache_dir
from tiermesh.core.model_files import mirror_model
from tiermesh.up.certs import DevCerts, write_dev_certs
from tiermesh.up.processes import free_port
from tiermesh.worker.runner import session_options

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "models"
BUILTINS = tuple(BUILDERS)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A private redis-server for the whole session; its URL (db 0)."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server is not installed; run `make test`, which installs it")
    port = free_port()
    data = tmp_path_factory.mktemp("redis")
    proc = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(data),
            "--save",
            "",
            "--appendonly",
            "no",
            "--loglevel",
            "warning",
        ],
        stdout=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port)
    try:
        for _ in range(200):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                try:
                    proc.wait(timeout=0.05)  # returns early only if it died
                    pytest.fail(f"redis-server exited with {proc.returncode}")
                except subprocess.TimeoutExpired:
                    continue
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        client.close()
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
async def redis_url(redis_server: str) -> AsyncIterator[str]:
    """The session's redis, emptied for this test."""
    client = aioredis.Redis.from_url(redis_server)
    await client.flushall()
    await client.aclose()
    yield redis_server


def copy_repository(
    dest: Path,
    bounded_queue: int = 2,
    fetched: Sequence[str] = (),
    rollout_model: str = "",
) -> Path:
    """The built-in models' committed configs with freshly built weights, plus mlp
    variations for the tests: `mlp_bounded` (a tiny queue bound, for admission),
    `mlp_cached` (a response cache: 1 s TTL, 3 entries) and `mlp_cascade` (edge takes all,
    unsure answers re-run on center). `fetched` names real models to add (configs copied,
    weights linked from the project's models/). `rollout_model` adds a model of that name
    with three versions (see add_versioned_mlp)."""
    for name in BUILTINS:
        (dest / name).mkdir(parents=True, exist_ok=True)
        shutil.copy(MODELS / name / "config.yaml", dest / name / "config.yaml")
    build_into(dest)
    for name in fetched:
        mirror_model(MODELS / name, dest)
    _mlp_variation(
        dest, "mlp_bounded", replace=("queue_bound: 1024", f"queue_bound: {bounded_queue}")
    )
    _mlp_variation(
        dest, "mlp_cached", extra="response_cache: {enabled: true, ttl_s: 1.0, max_entries: 3}\n"
    )
    _mlp_variation(
        dest,
        "mlp_cascade",
        extra="tiers: {edge: {max_cost: 0}, center: {}}\n"
        "cascade: {output: OUTPUT0, threshold: 0.99}\n",
    )
    if rollout_model:
        add_versioned_mlp(dest, rollout_model)
    return dest


# Versions of the model add_versioned_mlp builds: the mlp, the mlp with other weights
# (answers OK, but different ones), and a graph that fails on every input.
GOOD, DRIFTING, FAILING = "1", "2", "3"
CANARY_SETTINGS = (
    "canary: {window_s: 10, min_requests: 10, max_error_rate: 0.2, min_cosine: 0.99, "
    "min_pairs: 3, mirror_fraction: 0.5}\n"
)


def build_failing_mlp() -> bytes:
    """The mlp's interface over a graph that fails at run time for every input: INPUT0
    ([batch, 4]: 4 x batch values) is reshaped to [3, 7], which no batch fills."""
    graph = helper.make_graph(
        [
            helper.make_node("Reshape", ["INPUT0", "shape"], ["r"]),
            helper.make_node("MatMul", ["r", "w"], ["OUTPUT0"]),
        ],
        "failing_mlp",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", 3])],
        initializer=[
            numpy_helper.from_array(np.array([3, 7], np.int64), "shape"),
            numpy_helper.from_array(np.ones((7, 3), np.float32), "w"),
        ],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION
    )
    return bytes(model.SerializeToString())


def add_versioned_mlp(dest: Path, name: str) -> None:
    """Model `name`: version 1 is the mlp (stable), 2 the mlp with other weights, 3 fails
    on every request; canary thresholds sized for tests (CANARY_SETTINGS)."""
    files = {GOOD: build_mlp(), DRIFTING: build_mlp(seed=7), FAILING: build_failing_mlp()}
    text = (dest / "mlp" / "config.yaml").read_text().replace("name: mlp", f"name: {name}")
    text = text[: text.index("versions:")]
    versions = "".join(
        f'  "{v}":\n    model.onnx: {hashlib.sha256(data).hexdigest()}\n'
        for v, data in files.items()
    )
    folder = dest / name
    for version, data in files.items():
        (folder / version).mkdir(parents=True)
        (folder / version / "model.onnx").write_bytes(data)
    (folder / "config.yaml").write_text(
        f'{text}stable_version: "{GOOD}"\n{CANARY_SETTINGS}versions:\n{versions}'
    )


def _mlp_variation(
    dest: Path, name: str, extra: str = "", replace: tuple[str, str] = ("", "")
) -> None:
    """Another model built from the mlp: same weights, its config changed."""
    folder = dest / name
    (folder / "1").mkdir(parents=True)
    text = (dest / "mlp" / "config.yaml").read_text().replace("name: mlp", f"name: {name}")
    if replace[0]:
        text = text.replace(*replace)
    (folder / "config.yaml").write_text(text + extra)
    shutil.copy(dest / "mlp" / "1" / "model.onnx", folder / "1" / "model.onnx")


@pytest.fixture(scope="session")
def go_build_cache() -> Path:
    """The Go build cache of the door that `tiermesh up` builds (`make test` builds it first):
    a test that builds the door into a folder of its own shares it (door_cache), so it
    compiles the door's sources, not every gRPC package again (~12 s a build)."""
    path = default_cache_dir() / "frontdoor" / "gocache"
    path.mkdir(parents=True, exist_ok=True)
    return path


def door_cache(root: Path, go_build_cache: Path) -> Path:
    """`root`, a cache folder for `tiermesh.frontdoor.build.build`, sharing the Go build
    cache (Go's cache is made to be shared by concurrent builds)."""
    (root / "frontdoor").mkdir(parents=True, exist_ok=True)
    (root / "frontdoor" / "gocache").symlink_to(go_build_cache, target_is_directory=True)
    return root


@pytest.fixture(scope="session")
def fetched_models() -> tuple[str, ...]:
    """The real MiniLM models in the project's models/, fetched (and converted) when absent;
    the download cache survives between runs ($TIERMESH_CACHE_DIR or ~/.cache/tiermesh)."""
    names = ("minilm-l6", "minilm-l3")
    fetch_minilm(MODELS, default_cache_dir(), progress=False, which=names)
    return names


@pytest.fixture(scope="session")
def model_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_repository(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> DevCerts:
    """A CA and the server, client and internal (server + client) certificates it signed,
    generated with `cryptography` for 127.0.0.1, ::1 and localhost."""
    return write_dev_certs(tmp_path_factory.mktemp("certs"))


def copy_model(repo: Path, source: str, name: str, tamper: bool = False) -> None:
    """A copy of `source` named `name`, as an operator drops a model folder in; with
    `tamper` its weights no longer match the sha256 in its config."""
    shutil.copytree(repo / source, repo / name)
    cfg = repo / name / "config.yaml"
    cfg.write_text(cfg.read_text().replace(f"name: {source}", f"name: {name}"))
    if tamper:
        with (repo / name / "1" / "model.onnx").open("ab") as f:
            f.write(b"\0")


@pytest.fixture(scope="session")
def tiny_decoder(tmp_path_factory: pytest.TempPathFactory) -> ort.InferenceSession:
    """An onnxruntime session of the decoder converted from a tiny random llama GGUF."""
    d = tmp_path_factory.mktemp("tiny_decoder")
    write_tiny_gguf(d / "tiny.gguf")
    convert_gguf(d / "tiny.gguf", d / "tiny.onnx")
    return ort.InferenceSession(str(d / "tiny.onnx"), session_options(1))
