"""Accuracy-gate records (core/gates.py) and what the repository makes of them: a variant
other than the reference serves only with a passing record for its exact bytes, or when the
config says `ungated: true`; a default or tier variant that cannot serve falls back to the
reference; `tiermesh models verify` lists every variant with its standing."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
import yaml
from structlog.testing import capture_logs

from tiermesh.cli.main import main
from tiermesh.core.gates import (
    GateRecord,
    Standing,
    judge,
    read_records,
    reference_variant,
    write_record,
)
from tiermesh.core.repository import ModelRepository, RepositoryError

FP32, INT8, FP16 = b"fp32 bytes", b"int8 bytes", b"fp16 bytes"
SHA = {
    name: hashlib.sha256(data).hexdigest()
    for name, data in (("model.onnx", FP32), ("model.int8.onnx", INT8), ("model.fp16.onnx", FP16))
}


def record(file: str = "model.int8.onnx", passed: bool = True, **over: Any) -> GateRecord:
    values: dict[str, Any] = {
        "file": file,
        "sha256": SHA[file],
        "gate": "cosine>=0.99",
        "value": 0.9943 if passed else 0.9884,
        "passed": passed,
        "cosine": {"mean": 0.9943 if passed else 0.9884, "p1": 0.974, "min": 0.973},
        "rows": 117,
        "eval_sha256": "e" * 64,
        "calibration_sha256": "c" * 64,
        "date": "2026-12-07",
        **over,
    }
    return GateRecord(**values)


VARIANTS = {"fp32": "model.onnx", "int8": "model.int8.onnx", "fp16": "model.fp16.onnx"}


def _judge(records: dict[str, GateRecord], ungated: bool = False) -> dict[str, Standing]:
    verdicts = judge(VARIANTS, "fp32", records, lambda f: SHA.get(f, ""), ungated)
    return {v: verdict.standing for v, verdict in verdicts.items()}


def test_only_the_reference_and_passing_records_serve() -> None:
    assert _judge({}) == {
        "fp32": Standing.REFERENCE,
        "int8": Standing.MISSING,
        "fp16": Standing.MISSING,
    }
    got = _judge({"int8": record(), "fp16": record("model.fp16.onnx", passed=False)})
    assert got == {"fp32": Standing.REFERENCE, "int8": Standing.PASSED, "fp16": Standing.FAILED}
    assert [s.serves for s in got.values()] == [True, True, False]


def test_a_record_for_other_bytes_or_another_file_does_not_count() -> None:
    stale = record(sha256="0" * 64)
    assert _judge({"int8": stale})["int8"] is Standing.STALE
    elsewhere = record("model.fp16.onnx")  # int8's entry judged the fp16 file
    assert _judge({"int8": elsewhere})["int8"] is Standing.MISSING
    unknown = judge(VARIANTS, "fp32", {"int8": record()}, lambda f: "", False)
    assert unknown["int8"].standing is Standing.MISSING
    assert "not fetched" in unknown["int8"].why


def test_ungated_serves_everything_and_says_why() -> None:
    verdicts = judge(
        VARIANTS, "fp32", {"fp16": record("model.fp16.onnx", passed=False)}, lambda f: SHA[f], True
    )
    assert {v: x.standing for v, x in verdicts.items()} == {
        "fp32": Standing.REFERENCE,
        "int8": Standing.UNGATED,
        "fp16": Standing.UNGATED,
    }
    assert verdicts["fp16"].why.startswith("ungated: true (FAILED cosine>=0.99 (mean 0.9884")
    assert verdicts["int8"].why == "ungated: true (no gate record)"


def test_reference_is_fp32_else_the_default() -> None:
    assert reference_variant(VARIANTS, "int8") == "fp32"
    assert reference_variant({"int8": "a", "fp16": "b"}, "fp16") == "fp16"


def test_records_round_trip_and_a_malformed_file_is_refused(tmp_path: Path) -> None:
    write_record(tmp_path, "int8", record(excluded_nodes=("l0/ffn/out/matmul",)))
    write_record(tmp_path, "fp16", record("model.fp16.onnx", passed=False))
    got = read_records(tmp_path)
    assert got == {
        "int8": record(excluded_nodes=("l0/ffn/out/matmul",)),
        "fp16": record("model.fp16.onnx", passed=False),
    }
    (tmp_path / "gates.yaml").write_text(yaml.safe_dump({"int8": {"file": "x"}}))
    with pytest.raises(ValueError, match="unreadable gate records"):
        read_records(tmp_path)


# -- the repository ------------------------------------------------------------------------


def _repo(tmp_path: Path, records: dict[str, GateRecord] | None = None, **over: Any) -> Path:
    folder = tmp_path / "tiny" / "1"
    folder.mkdir(parents=True)
    for file, data in (("model.onnx", FP32), ("model.int8.onnx", INT8), ("model.fp16.onnx", FP16)):
        (folder / file).write_bytes(data)
    for variant, rec in (records or {}).items():
        write_record(folder, variant, rec)
    raw = {
        "name": "tiny",
        "max_batch_size": 4,
        "inputs": [{"name": "X", "datatype": "FP32", "dims": [2]}],
        "outputs": [{"name": "Y", "datatype": "FP32", "dims": [2]}],
        "variants": VARIANTS,
        "default_variant": "fp32",
        "versions": {"1": dict(SHA)},
        **over,
    }
    (tmp_path / "tiny" / "config.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    return tmp_path


def test_the_repository_serves_what_passed(tmp_path: Path) -> None:
    repo = ModelRepository(
        _repo(tmp_path, {"int8": record(), "fp16": record("model.fp16.onnx", passed=False)})
    )
    cfg = repo.load()["tiny"]
    assert cfg.servable == {"1": frozenset({"fp32", "int8"})}
    assert (cfg.serves("int8"), cfg.serves("fp16"), cfg.serves("fp32")) == (True, False, True)
    assert cfg.servable_variants() == ["fp32", "int8"]


def test_a_failed_default_or_tier_variant_falls_back_to_the_reference(tmp_path: Path) -> None:
    tiers = {
        "mixed_variants": True,
        "edge": {"variant": "fp16", "max_cost": 8},
        "center": {"variant": "int8"},
    }
    root = _repo(
        tmp_path,
        {"int8": record(), "fp16": record("model.fp16.onnx", passed=False)},
        default_variant="fp16",
        tiers=tiers,
    )
    with capture_logs() as logs:
        cfg = ModelRepository(root).load()["tiny"]
    assert cfg.default_variant == "fp32"
    assert cfg.tier_variants == {"edge": "fp32", "center": "int8"}
    # Never silently: each fallback is a warning naming what was asked and what serves.
    said = [(e["event"].split(";")[0], e.get("tier"), e["variant"]) for e in logs]
    assert said == [
        ("default variant has no passing gate record", None, "fp16"),
        ("tier variant has no passing gate record", "edge", "fp16"),
    ]


def test_a_record_edited_by_hand_is_refused_with_the_file(tmp_path: Path) -> None:
    root = _repo(tmp_path)
    (root / "tiny" / "1" / "gates.yaml").write_text("int8: [not, a, record]\n")
    with pytest.raises(RepositoryError, match=r"config.yaml: .*gates.yaml: unreadable"):
        ModelRepository(root).load()


def test_verify_lists_every_variant_with_its_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _repo(tmp_path, {"int8": record(), "fp16": record("model.fp16.onnx", passed=False)})
    assert main(["models", "verify", "--repository", str(root)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("tiny: versions ['1'], variants ['fp16', 'fp32', 'int8']")
    assert out[1:] == [
        "  1/fp32: serves: the reference the gate compares to",
        "  1/int8: serves: passed cosine>=0.99 (mean 0.9943, p1 0.9740, min 0.9730; "
        "117 texts, 2026-12-07)",
        "  1/fp16: does NOT serve: FAILED cosine>=0.99 (mean 0.9884, p1 0.9740, min 0.9730; "
        "117 texts, 2026-12-07)",
    ]
