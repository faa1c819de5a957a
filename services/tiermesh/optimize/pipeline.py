"""`tiermesh optimize MODEL`: build every variant, gate it against FP32 on eval texts,
report, and write the passing ones into the model repository (file, checksum, provenance,
variants.yaml) where the mesh serves them by name."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml
from tqdm import tqdm

from tiermesh.core.gates import write_record
from tiermesh.core.repository import BUILT_VARIANTS, ModelRepository
from tiermesh.core.text import TextEncoder
from tiermesh.optimize import calibrate, evaluate, sensitivity, variants
from tiermesh.optimize.gate import AccuracyGate
from tiermesh.optimize.gated import gate_record
from tiermesh.optimize.report import VariantResult, write

Builder = Callable[[Path, Path], Path]
LENGTHS = (16, 64, 128)


@dataclass
class Plan:
    model: str
    repository: Path
    out: Path
    gate: AccuracyGate
    calibration: Sequence[str]
    evaluation: Sequence[str]
    write_back: bool = True
    progress: bool = True
    # Which variants to build (BUILDERS' names); empty: all of them.
    variants: Sequence[str] = ()


BUILDERS = ("graph", "fp16", "int8dyn", "int8qdq", "int4")


def _builders(reader: Callable[[], calibrate.TextCalibrationReader]) -> dict[str, Builder]:
    return {
        "graph": variants.graph_optimized,
        "fp16": variants.fp16,
        "int8dyn": variants.int8_dynamic,
        "int8qdq": lambda src, dst: variants.int8_static(src, dst, reader()),
        "int4": variants.int4_weight_only,
    }


def run(plan: Plan) -> list[VariantResult]:
    repo = ModelRepository(plan.repository)
    cfg = repo.load()[plan.model]
    if cfg.tokenize is None:
        raise ValueError(f"model {plan.model!r} takes no text: optimize needs a text model")
    folder = repo.checked_folder(plan.model)
    fp32 = folder / cfg.variants[cfg.default_variant]
    encoder = TextEncoder(folder / cfg.tokenize.tokenizer_file, cfg.tokenize.max_length)

    def reader() -> calibrate.TextCalibrationReader:
        return calibrate.TextCalibrationReader(encoder, plan.calibration)

    work = Path(tempfile.mkdtemp(prefix="tiermesh-optimize-"))
    try:
        base = evaluate.embed(evaluate.session(fp32), encoder, plan.evaluation)
        built: dict[str, tuple[Path, list[str], str]] = {"fp32": (fp32, [], "")}
        builders = {
            name: build
            for name, build in _builders(reader).items()
            if not plan.variants or name in plan.variants
        }
        stages = tqdm(builders.items(), desc="build", disable=not plan.progress)
        for name, build in stages:
            stages.set_postfix_str(name)
            try:
                built[name] = (build(fp32, work / f"model.{name}.onnx"), [], "")
            except variants.VariantError as exc:
                built[name] = (fp32, [], f"not built: {exc}")

        def passes(path: Path) -> bool:
            got = evaluate.embed(evaluate.session(path), encoder, plan.evaluation)
            return plan.gate.passes(evaluate.accuracy(base, got))

        if "int8qdq" in built and not built["int8qdq"][2] and not passes(built["int8qdq"][0]):
            ranking = sensitivity.node_sensitivity(fp32, reader)
            mixed = sensitivity.mixed_precision(
                fp32, work / "model.int8mixed.onnx", reader, ranking, passes
            )
            if mixed is None:
                built["int8mixed"] = (
                    fp32,
                    [],
                    f"rejected: no set of FP32 nodes makes INT8 pass {plan.gate}",
                )
            else:
                built["int8mixed"] = (mixed[0], mixed[1], "")
        results = []
        skipped = {name: note for name, (_, _, note) in built.items() if note}
        for name, (path, excluded, note) in tqdm(
            built.items(), desc="evaluate", disable=not plan.progress
        ):
            if not note:
                results.append(_evaluate(name, path, base, encoder, plan, excluded))
        write(plan.out, plan.model, str(plan.gate), results, skipped)
        if plan.write_back:
            _write_back(folder, [r for r in results if r.passed and r.name != "fp32"], work, plan)
        return results
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _evaluate(
    name: str,
    path: Path,
    base: evaluate.Floats,
    encoder: TextEncoder,
    plan: Plan,
    excluded: list[str],
) -> VariantResult:
    sess = evaluate.session(path)
    acc = evaluate.accuracy(base, evaluate.embed(sess, encoder, plan.evaluation))
    # The graph variant was optimised offline: its cold start is measured without redoing it
    # (fp32's row is the same model optimised at every load).
    rss, cold = evaluate.process_footprint(path, LENGTHS, preoptimized=name == "graph")
    return VariantResult(
        name=name,
        file=path.name,
        size_mb=path.stat().st_size / 1e6,
        accuracy=acc,
        speed=evaluate.speed(sess, LENGTHS),
        peak_rss_mb=rss,
        cold_start_s=cold,
        passed=name == "fp32" or plan.gate.passes(acc),
        excluded_nodes=excluded,
    )


def _write_back(folder: Path, passed: list[VariantResult], work: Path, plan: Plan) -> None:
    """Copy the passing variants next to the FP32 model; record checksums and how they were
    made in provenance.yaml, their names in variants.yaml and their gate records in
    gates.yaml."""
    prov_path = folder / "provenance.yaml"
    prov = yaml.safe_load(prov_path.read_text()) if prov_path.exists() else {}
    built_path = folder / BUILT_VARIANTS
    built = yaml.safe_load(built_path.read_text()) if built_path.exists() else {}
    for r in passed:
        target = folder / f"model.{r.name}.onnx"
        shutil.copy(work / r.file, target)
        # The record that lets the variant serve (core/gates.py); it hashed the file and
        # the text sets, which provenance.yaml repeats.
        record = gate_record(
            target, r.accuracy, plan.gate, plan.calibration, plan.evaluation, r.excluded_nodes
        )
        write_record(folder, r.name, record)
        prov.setdefault("files", {})[target.name] = record.sha256
        prov.setdefault("optimize", {})[r.name] = {
            "gate": record.gate,
            "calibration_sha256": record.calibration_sha256,
            "eval_sha256": record.eval_sha256,
            "excluded_nodes": r.excluded_nodes,
            "cosine_mean": r.accuracy.mean,
            # Saved after graph optimisation: workers load it without redoing it.
            "preoptimized": r.name == "graph",
        }
        built[r.name] = target.name
    prov_path.write_text(yaml.safe_dump(prov, sort_keys=False))
    built_path.write_text(yaml.safe_dump(built, sort_keys=False))
