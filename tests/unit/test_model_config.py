"""Text-model configs: compute interface, tokenize/pool, variants, companions, provenance."""

from __future__ import annotations

import copy
import hashlib
from pathlib import Path
from typing import Any

import pytest
import yaml

from tiermesh.core.model_config import PoolSpec, TensorSpec, TokenizeSpec, companions
from tiermesh.core.repository import ModelRepository, RepositoryError, parse_config

ROOT = Path(__file__).resolve().parents[2]
MINILM_CONFIG = ROOT / "models" / "minilm-l6" / "config.yaml"

FILES = {"model.onnx": b"fp32 weights", "model.int8.onnx": b"int8 weights", "tok.json": b"{}"}
DIGESTS = {name: hashlib.sha256(data).hexdigest() for name, data in FILES.items()}
IDS = [
    {"name": "input_ids", "datatype": "INT64", "dims": [-1]},
    {"name": "attention_mask", "datatype": "INT64", "dims": [-1]},
]


def _text(name: str = "txt", **over: Any) -> dict[str, Any]:
    """A small text model shaped like models/minilm-l6/config.yaml."""
    raw: dict[str, Any] = {
        "name": name,
        "max_batch_size": 8,
        "inputs": [{"name": "text", "datatype": "BYTES", "dims": [1]}],
        "outputs": [{"name": "emb", "datatype": "FP32", "dims": [4]}],
        "compute": {
            "inputs": copy.deepcopy(IDS),
            "outputs": [{"name": "hidden", "datatype": "FP32", "dims": [-1, 4]}],
            "pad": {"input_ids": 0, "attention_mask": 0},
        },
        "tokenize": {"tokenizer": "tok.json", "max_length": 32, "max_text_bytes": 100},
        "pool": {"source": "hidden", "mask": "attention_mask", "output": "emb"},
        "companions": [{"name": f"{name}-ids", "inputs": copy.deepcopy(IDS)}],
        "variants": {"fp32": "model.onnx", "int8": "model.int8.onnx"},
        "default_variant": "fp32",
        "versions": {"1": dict(DIGESTS)},
    }
    raw.update(over)
    return raw


def _error(raw: dict[str, Any]) -> str:
    with pytest.raises(RepositoryError) as exc:
        parse_config(raw, "cfg.yaml")
    return str(exc.value)


def _repo(root: Path, *raws: dict[str, Any], files: dict[str, bytes] = FILES) -> ModelRepository:
    for raw in raws:
        folder = root / raw["name"]
        (folder / "1").mkdir(parents=True)
        (folder / "config.yaml").write_text(yaml.safe_dump(raw))
        for name, data in files.items():
            (folder / "1" / name).write_bytes(data)
    repo = ModelRepository(root)
    repo.load()
    return repo


# -- parsing -------------------------------------------------------------------------------


def test_committed_minilm_config_parses() -> None:
    raw = yaml.safe_load(MINILM_CONFIG.read_text())
    cfg = parse_config(raw, str(MINILM_CONFIG))
    assert [(t.name, t.datatype, t.dims) for t in cfg.inputs] == [("text", "BYTES", (1,))]
    assert cfg.runs_inputs == (
        TensorSpec("input_ids", "INT64", (-1,)),
        TensorSpec("attention_mask", "INT64", (-1,)),
    )
    assert cfg.runs_outputs == (TensorSpec("last_hidden_state", "FP32", (-1, 384)),)
    assert cfg.outputs == (TensorSpec("sentence_embedding", "FP32", (384,)),)
    assert cfg.pad == {"input_ids": 0, "attention_mask": 0}
    assert cfg.tokenize == TokenizeSpec("tokenizer.json", 256, 16384)
    assert cfg.pool == PoolSpec("last_hidden_state", "attention_mask", "sentence_embedding")
    assert cfg.max_sequence == 256
    assert cfg.variants == {"fp32": "model.onnx", "int8": "model.int8.onnx"}
    assert (cfg.default_variant, cfg.model_file) == ("fp32", "model.onnx")
    assert cfg.length_buckets == (16, 64, 128, 256)
    (ids,) = companions(raw, cfg, str(MINILM_CONFIG))
    assert ids.name == "minilm-l6-ids"
    assert ids.companion_of == ids.queue_model == "minilm-l6"


def test_without_compute_the_public_interface_runs() -> None:
    raw = _text(inputs=copy.deepcopy(IDS), compute=None, tokenize=None, pool=None)
    cfg = parse_config(raw, "cfg.yaml")
    assert cfg.compute_inputs == () and cfg.runs_inputs == cfg.inputs
    assert cfg.runs_outputs == cfg.outputs
    assert (cfg.pad, cfg.tokenize, cfg.pool, cfg.max_sequence) == ({}, None, None, 0)


@pytest.mark.parametrize(
    ("over", "default", "model_file"),
    [
        ({"default_variant": "int8"}, "int8", "model.int8.onnx"),
        # Without default_variant the first variant listed is the default.
        ({"default_variant": None, "variants": {"q": "q.onnx", "fp32": "m.onnx"}}, "q", "q.onnx"),
        # Without variants, model_file is the one fp32 variant.
        ({"variants": None, "default_variant": None, "model_file": "m.onnx"}, "fp32", "m.onnx"),
    ],
)
def test_variants_and_default(over: dict[str, Any], default: str, model_file: str) -> None:
    raw = {k: v for k, v in _text(**over).items() if v is not None}
    raw["versions"]["1"] |= {"m.onnx": "c" * 64, "q.onnx": "d" * 64}
    cfg = parse_config(raw, "cfg.yaml")
    assert cfg.default_variant == default
    assert cfg.model_file == cfg.variants[default] == model_file


@pytest.mark.parametrize(
    ("over", "text"),
    [
        ({"default_variant": "fp16"}, "default_variant 'fp16' is not a variant"),
        ({"versions": {"1": {"model.onnx": "a" * 64}}}, "lists no sha256 for model.int8.onnx"),
        (
            {"versions": {"1": dict(DIGESTS), "2": {"model.int8.onnx": "a" * 64}}},
            "version 2 lists no sha256 for model.onnx",
        ),
        ({"name": "txt.v2"}, "model name 'txt.v2'"),
        ({"variants": {"fp32": "model.onnx", "int.8": "model.int8.onnx"}}, "variant names"),
        ({"pool": {"source": "nope", "mask": "attention_mask", "output": "emb"}}, "pool"),
        ({"pool": {"source": "hidden", "mask": "mask", "output": "emb"}}, "pool"),
        ({"pool": {"source": "hidden"}}, "pool.mask: missing required key"),
        ({"tokenize": {"tokenizer": "tok.json"}}, "max_length"),
    ],
)
def test_invalid_text_config(over: dict[str, Any], text: str) -> None:
    message = _error(_text(**over))
    assert message.startswith("cfg.yaml: ")
    assert text in message


# "text" is a public input, not a compute one: pad applies to what onnxruntime runs.
@pytest.mark.parametrize("unknown", ["token_type_ids", "text"])
def test_pad_naming_unknown_compute_input(unknown: str) -> None:
    raw = _text()
    raw["compute"]["pad"] = {"input_ids": 0, unknown: 0}
    assert f"pad names unknown compute inputs ['{unknown}']" in _error(raw)


# -- companions ----------------------------------------------------------------------------


def test_companion_shares_parent_compute() -> None:
    raw = _text()
    parent = parse_config(raw, "cfg.yaml")
    (ids,) = companions(raw, parent, "cfg.yaml")
    assert ids.inputs == parent.runs_inputs
    assert ids.tokenize is None
    assert ids.max_sequence == parent.max_sequence == 32
    for attr in ("runs_outputs", "outputs", "pool", "pad", "variants", "versions"):
        assert getattr(ids, attr) == getattr(parent, attr), attr


@pytest.mark.parametrize(
    ("inputs", "text"),
    [
        ([IDS[0]], "companion txt-ids must take the compute inputs"),
        ([IDS[1], IDS[0]], "companion txt-ids must take the compute inputs"),
        ([*IDS, {"name": "x", "datatype": "INT64", "dims": [-1]}], "must take the compute"),
    ],
)
def test_companion_inputs_must_be_compute_inputs(inputs: list[Any], text: str) -> None:
    raw = _text(companions=[{"name": "txt-ids", "inputs": inputs}])
    with pytest.raises(RepositoryError, match=text):
        companions(raw, parse_config(raw, "cfg.yaml"), "cfg.yaml")


def test_companion_inputs_must_match_compute_datatypes() -> None:
    # Same names, other datatype: the companion would pass validation and fail in compute.
    wrong = [{**IDS[0], "datatype": "FP32"}, IDS[1]]
    raw = _text(companions=[{"name": "txt-ids", "inputs": wrong}])
    with pytest.raises(RepositoryError, match="compute inputs"):
        companions(raw, parse_config(raw, "cfg.yaml"), "cfg.yaml")


@pytest.mark.parametrize("item", [{"name": "txt.ids", "inputs": IDS}, {"name": "x"}, "x"])
def test_bad_companion(item: Any) -> None:
    raw = _text(companions=[item])
    with pytest.raises(RepositoryError):
        companions(raw, parse_config(raw, "cfg.yaml"), "cfg.yaml")


def test_load_registers_companions(tmp_path: Path) -> None:
    repo = _repo(tmp_path, _text())
    assert sorted(repo.configs) == ["txt", "txt-ids"]
    ids = repo.configs["txt-ids"]
    assert (ids.companion_of, ids.queue_model, ids.tokenize) == ("txt", "txt", None)
    assert ids.max_sequence == 32
    assert repo.configs["txt"].companion_of == ""


@pytest.mark.parametrize(
    "second",
    [
        _text("other", companions=[{"name": "txt-ids", "inputs": IDS}]),
        _text("txt-ids", companions=None),  # a folder named like another model's companion
        _text("other", companions=[{"name": "other", "inputs": IDS}]),  # its own name
        _text("other", companions=[{"name": "o-ids", "inputs": IDS}] * 2),
    ],
)
def test_companion_defined_twice(tmp_path: Path, second: dict[str, Any]) -> None:
    with pytest.raises(RepositoryError, match="defined twice"):
        _repo(tmp_path, _text(), second)


# -- checked files -------------------------------------------------------------------------


def _provenance() -> dict[str, Any]:
    files = {"model.onnx": "provenance", "model.int8.onnx": "provenance"}
    return _text(versions={"1": {**files, "tok.json": DIGESTS["tok.json"]}})


def _write_provenance(folder: Path, files: dict[str, str]) -> None:
    (folder / "provenance.yaml").write_text(yaml.safe_dump({"model": "txt", "files": files}))


def test_provenance_checksum_matches(tmp_path: Path) -> None:
    repo = _repo(tmp_path, _provenance())
    _write_provenance(tmp_path / "txt" / "1", dict(DIGESTS))
    assert repo.checked_folder("txt") == tmp_path / "txt" / "1"


def test_provenance_mismatch_names_expected_and_found(tmp_path: Path) -> None:
    repo = _repo(tmp_path, _provenance())
    _write_provenance(tmp_path / "txt" / "1", {**DIGESTS, "model.int8.onnx": "b" * 64})
    with pytest.raises(RepositoryError) as exc:
        repo.checked_folder("txt")
    message = str(exc.value)
    assert "model.int8.onnx" in message
    assert f"expected {'b' * 64}" in message
    assert f"found {DIGESTS['model.int8.onnx']}" in message


def test_provenance_without_the_file_entry_refuses(tmp_path: Path) -> None:
    repo = _repo(tmp_path, _provenance())
    _write_provenance(tmp_path / "txt" / "1", {"model.onnx": DIGESTS["model.onnx"]})
    with pytest.raises(RepositoryError, match="expected none"):
        repo.checked_folder("txt")


@pytest.mark.parametrize("content", [None, "files: [", "model: txt\n", "files: 3\n"])
def test_provenance_missing_or_unreadable(tmp_path: Path, content: str | None) -> None:
    repo = _repo(tmp_path, _provenance())
    if content is not None:
        (tmp_path / "txt" / "1" / "provenance.yaml").write_text(content)
    with pytest.raises(RepositoryError, match="provenance"):
        repo.checked_folder("txt")


def test_plain_checksum_still_checked_next_to_provenance(tmp_path: Path) -> None:
    repo = _repo(tmp_path, _provenance())
    _write_provenance(tmp_path / "txt" / "1", dict(DIGESTS))
    (tmp_path / "txt" / "1" / "tok.json").write_bytes(b"changed")
    with pytest.raises(RepositoryError, match=r"tok\.json: sha256 mismatch"):
        repo.checked_folder("txt")


def test_checked_files_checks_only_those_named(tmp_path: Path) -> None:
    repo = _repo(tmp_path, _provenance())
    _write_provenance(tmp_path / "txt" / "1", {**DIGESTS, "model.onnx": "b" * 64})
    assert repo.checked_files("txt", ["tok.json"]) == tmp_path / "txt" / "1"
    (tmp_path / "txt" / "1" / "tok.json").write_bytes(b"changed")
    with pytest.raises(RepositoryError, match=r"tok\.json: sha256 mismatch"):
        repo.checked_files("txt", ["tok.json"])


@pytest.mark.parametrize(
    ("variant", "file"), [("", "model.onnx"), ("fp32", "model.onnx"), ("int8", "model.int8.onnx")]
)
def test_checked_file_variant(tmp_path: Path, variant: str, file: str) -> None:
    repo = _repo(tmp_path, _text())
    assert repo.checked_file("txt", variant=variant) == tmp_path / "txt" / "1" / file


def test_checked_file_unknown_variant(tmp_path: Path) -> None:
    repo = _repo(tmp_path, _text())
    with pytest.raises(RepositoryError, match="model 'txt' has no variant 'fp16'"):
        repo.checked_file("txt", variant="fp16")


@pytest.mark.parametrize("variant", ["", "int8"])
def test_companion_files_are_the_parents(tmp_path: Path, variant: str) -> None:
    repo = _repo(tmp_path, _text())
    parent = repo.checked_file("txt", "1", variant)
    assert repo.checked_file("txt-ids", "1", variant) == parent
    assert parent.parent == tmp_path / "txt" / "1"
    assert repo.checked_folder("txt-ids") == tmp_path / "txt" / "1"


def test_companion_checks_the_parents_checksums(tmp_path: Path) -> None:
    repo = _repo(tmp_path, _text())
    (tmp_path / "txt" / "1" / "model.int8.onnx").write_bytes(b"tampered")
    with pytest.raises(RepositoryError, match="sha256 mismatch"):
        repo.checked_file("txt-ids")
