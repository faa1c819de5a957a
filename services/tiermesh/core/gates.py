"""Accuracy-gate records: which variants of a model version may answer.

A variant other than the reference (FP32: what the gate compares against) serves only with
a passing record in its version folder's `gates.yaml`, written by `tiermesh optimize` and
`tiermesh models fetch` after they measured the variant against the reference:

    int8:
      file: model.int8.onnx
      sha256: 3f0c...          # the bytes judged; a record for other bytes does not count
      gate: cosine>=0.99
      value: 0.99426
      passed: true
      cosine: {mean: 0.99426, p1: 0.97406, min: 0.97359}
      rows: 117
      eval_sha256: ...         # the texts it was judged on (calibration_sha256: built from)
      date: "2026-12-07"
      excluded_nodes: [l0/ffn/out/matmul, l2/ffn/out/matmul]   # kept FP32
      method: dynamic INT8, per channel

A model's config may serve variants without one (`ungated: true`), logged at start.
`judge` is pure: the repository gives it the records and the checksums it expects.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

GATES_FILE = "gates.yaml"
REFERENCE_VARIANT = "fp32"


@dataclass(frozen=True, slots=True)
class GateRecord:
    """One variant's measurement against the reference on the evaluation set."""

    file: str
    sha256: str
    gate: str  # e.g. cosine>=0.99
    value: float  # the gated metric's value
    passed: bool
    cosine: Mapping[str, float]  # mean, p1, min
    rows: int
    eval_sha256: str
    calibration_sha256: str
    date: str
    # The nodes kept in float (mixed precision), when any, and how it was quantized.
    excluded_nodes: tuple[str, ...] = ()
    method: str = ""

    def summary(self) -> str:
        figures = ", ".join(f"{k} {v:.4f}" for k, v in self.cosine.items())
        verdict = "passed" if self.passed else "FAILED"
        how = "".join(
            f"; {part}"
            for part in (
                self.method,
                f"{len(self.excluded_nodes)} nodes kept FP32" if self.excluded_nodes else "",
            )
            if part
        )
        return f"{verdict} {self.gate} ({figures}; {self.rows} texts, {self.date}{how})"


class Standing(enum.Enum):
    REFERENCE = "reference"
    PASSED = "passed"
    UNGATED = "ungated"  # served by the config's `ungated: true`
    FAILED = "failed"
    MISSING = "no record"
    STALE = "record for other bytes"

    @property
    def serves(self) -> bool:
        return self in (Standing.REFERENCE, Standing.PASSED, Standing.UNGATED)


@dataclass(frozen=True, slots=True)
class GateVerdict:
    variant: str
    standing: Standing
    why: str
    record: GateRecord | None = None


def reference_variant(variants: Mapping[str, str], default_variant: str) -> str:
    """The variant the gate compares against: fp32 when the model has one, else its default
    (a model shipped in one precision is its own reference)."""
    return REFERENCE_VARIANT if REFERENCE_VARIANT in variants else default_variant


def judge(
    variants: Mapping[str, str],
    reference: str,
    records: Mapping[str, GateRecord],
    expected_sha256: Callable[[str], str],
    ungated: bool,
) -> dict[str, GateVerdict]:
    """Each variant's standing in one version: `records` from its gates.yaml,
    `expected_sha256(file)` the checksum the repository holds the file to ("" unknown)."""
    out = {}
    for variant, file in variants.items():
        record = records.get(variant)
        if variant == reference:
            verdict = GateVerdict(variant, Standing.REFERENCE, "the reference the gate compares to")
        elif record is None or record.file != file:
            verdict = GateVerdict(variant, Standing.MISSING, "no gate record", None)
        elif not (expected := expected_sha256(file)):
            verdict = GateVerdict(
                variant, Standing.MISSING, "the file's checksum is unknown (not fetched?)", record
            )
        elif record.sha256 != expected:
            verdict = GateVerdict(
                variant,
                Standing.STALE,
                f"the gate record judged other bytes (sha256 {record.sha256[:12]}...)",
                record,
            )
        elif record.passed:
            verdict = GateVerdict(variant, Standing.PASSED, record.summary(), record)
        else:
            verdict = GateVerdict(variant, Standing.FAILED, record.summary(), record)
        if ungated and not verdict.standing.serves:
            verdict = GateVerdict(
                variant, Standing.UNGATED, f"ungated: true ({verdict.why})", verdict.record
            )
        out[variant] = verdict
    return out


def read_records(folder: Path) -> dict[str, GateRecord]:
    """The records of a version folder ({} without gates.yaml); ValueError if malformed."""
    path = folder / GATES_FILE
    if not path.is_file():
        return {}
    try:
        raw = yaml.safe_load(path.read_text()) or {}
        return {str(variant): _record(entry) for variant, entry in dict(raw).items()}
    except (yaml.YAMLError, TypeError, KeyError, ValueError, AttributeError) as exc:
        raise ValueError(f"{path}: unreadable gate records ({exc})") from exc


def _record(entry: Any) -> GateRecord:
    values = dict(entry)
    values["cosine"] = {str(k): float(v) for k, v in dict(values["cosine"]).items()}
    values["excluded_nodes"] = tuple(values.get("excluded_nodes") or ())
    record = GateRecord(**values)
    if not isinstance(record.passed, bool):
        raise ValueError(f"passed must be true or false, got {record.passed!r}")
    return record


def write_record(folder: Path, variant: str, record: GateRecord) -> None:
    """Add or replace `variant`'s record in the folder's gates.yaml (atomically)."""
    path = folder / GATES_FILE
    raw = yaml.safe_load(path.read_text()) if path.is_file() else {}
    entry = asdict(record)
    entry["cosine"] = dict(record.cosine)
    entry["excluded_nodes"] = list(record.excluded_nodes)
    raw = {**(raw or {}), variant: entry}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(raw, sort_keys=False))
    tmp.replace(path)
