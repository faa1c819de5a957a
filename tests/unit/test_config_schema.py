"""config.yaml's grammar (core/config_schema.py): a misspelt key anywhere is refused with the
file, the section, the key and the keys allowed there, by the repository, `tiermesh models
verify` and `tiermesh up`; `tiermesh models schema` prints a JSON Schema that every shipped
config satisfies."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tiermesh.cli.main import main
from tiermesh.core.repository import ModelRepository, RepositoryError

MODELS = Path(__file__).resolve().parents[2] / "models"


def _repo_with(tmp_path: Path, name: str, edit: Any) -> Path:
    """A repository holding models/<name>/config.yaml after `edit(raw)`."""
    (tmp_path / name).mkdir()
    raw = yaml.safe_load((MODELS / name / "config.yaml").read_text())
    edit(raw)
    (tmp_path / name / "config.yaml").write_text(yaml.safe_dump(raw))
    return tmp_path


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (
            lambda raw: raw.update(max_batch_sise=raw.pop("max_batch_size")),
            "unknown key 'max_batch_sise' (did you mean 'max_batch_size'?); allowed keys: ",
        ),
        (
            lambda raw: raw["tokenize"].update(max_lenght=raw["tokenize"].pop("max_length")),
            "tokenize: unknown key 'max_lenght' (did you mean 'max_length'?); allowed keys: "
            "max_length, max_text_bytes, tokenizer",
        ),
        (
            lambda raw: raw["length_buckets"][1].update(prefered_batch_sizes=[8]),
            "length_buckets.1.Bucket: unknown key 'prefered_batch_sizes'",
        ),
        (
            lambda raw: raw["tiers"]["edge"].update(varient="int8"),
            "tiers.edge: unknown key 'varient' (did you mean 'variant'?)",
        ),
        (lambda raw: raw.update(colour="blue"), "unknown key 'colour'; allowed keys: batching,"),
    ],
)
def test_a_misspelt_key_names_file_key_and_allowed_keys(
    tmp_path: Path, edit: Any, says: str
) -> None:
    root = _repo_with(tmp_path, "minilm-l6", edit)
    with pytest.raises(RepositoryError) as exc:
        ModelRepository(root).load()
    assert str(exc.value).startswith(f"{root / 'minilm-l6' / 'config.yaml'}: ")
    assert says in str(exc.value)


def test_verify_and_up_stop_on_a_misspelt_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tiermesh.up import supervisor

    root = _repo_with(tmp_path, "mlp", lambda raw: raw.update(queue_bund=10))
    monkeypatch.setattr(supervisor, "run", lambda opts: pytest.fail("up started the mesh"))
    for argv in (["models", "verify"], ["up", "--insecure"]):
        assert main([*argv, "--repository", str(root)]) == 1
        err = capsys.readouterr().err
        assert f"{root / 'mlp' / 'config.yaml'}: unknown key 'queue_bund'" in err, err
        assert "(did you mean 'queue_bound'?); allowed keys: " in err


def test_a_wrong_type_names_the_key(tmp_path: Path) -> None:
    root = _repo_with(tmp_path, "mlp", lambda raw: raw["batching"].update(max_batch_wait_ms="2ms"))
    with pytest.raises(RepositoryError, match=r"batching\.max_batch_wait_ms: Input should be"):
        ModelRepository(root).load()


def _schema(capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main(["models", "schema"]) == 0
    schema: dict[str, Any] = json.loads(capsys.readouterr().out)
    jsonschema.Draft202012Validator.check_schema(schema)
    return schema


def test_every_shipped_config_satisfies_the_printed_schema(
    capsys: pytest.CaptureFixture[str],
) -> None:
    validator = jsonschema.Draft202012Validator(_schema(capsys))
    paths = sorted(MODELS.glob("*/config.yaml"))
    assert len(paths) >= 8
    for path in paths:
        errors = list(validator.iter_errors(yaml.safe_load(path.read_text())))
        assert not errors, f"{path}: {errors[0].message}"


def test_the_schema_refuses_what_the_loader_refuses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    validator = jsonschema.Draft202012Validator(_schema(capsys))
    raw = yaml.safe_load((MODELS / "minilm-l6" / "config.yaml").read_text())
    raw["tiers"]["edge"]["varient"] = "int8"
    error = jsonschema.exceptions.best_match(validator.iter_errors(raw))
    assert error is not None and "'varient' was unexpected" in error.message


def test_shipped_configs_copy_and_load(tmp_path: Path) -> None:
    """The pydantic grammar reads every shipped config as the repository serves it."""
    for path in MODELS.glob("*/config.yaml"):
        shutil.copytree(path.parent, tmp_path / path.parent.name, ignore=_weights)
    configs = ModelRepository(tmp_path).load()
    assert configs["minilm-l6"].tiers[0].max_cost == 64
    assert configs["smollm2"].generation is not None
    assert configs["smollm2"].generation.max_sequences == 16


def _weights(folder: str, names: list[str]) -> list[str]:
    return [n for n in names if n.endswith((".onnx", ".json", ".data"))]
