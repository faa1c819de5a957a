"""Execution providers as configuration (core/sessions.py): requests read from names, aliases
and JSON; the pure choice of providers from what onnxruntime has (refused in one line, or a
CPU fallback that warns); a session onnxruntime silently moved to another provider; the
`execution_providers` of a tier; the worker's setting over the tier's; where it shows (the
worker's metric, ModelConfig's parameters)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import onnxruntime as ort
import pytest
import yaml
from prometheus_client import CollectorRegistry
from pydantic import ValidationError
from structlog.testing import capture_logs

from tiermesh.core import sessions
from tiermesh.core.builtin_models import build_mlp
from tiermesh.core.compute_unit import ComputeUnit
from tiermesh.core.repository import ModelConfig, parse_config
from tiermesh.core.sessions import (
    CPU,
    CPU_ONLY,
    Opened,
    ProviderChoice,
    ProviderError,
    ProviderSpec,
    ProviderUnavailable,
    check_provider,
    open_session,
    parse_providers,
    select_providers,
    session_options,
)
from tiermesh.core.settings import WorkerSettings
from tiermesh.core.tier_spec import TierConfigError, TierSpec, parse_tiers
from tiermesh.gateway.converters import EXECUTION_PROVIDERS, model_config
from tiermesh.worker import runner as runner_module
from tiermesh.worker.metrics import WorkerMetrics
from tiermesh.worker.runner import ModelRunner
from tiermesh.worker.units import provider_choice

MODELS = Path(__file__).resolve().parents[2] / "models"
CUDA = "CUDAExecutionProvider"
TRT = "TensorrtExecutionProvider"
CPU_MACHINE = ["AzureExecutionProvider", CPU]  # what the CPU wheel of onnxruntime lists


def spec(name: str, **options: str) -> ProviderSpec:
    return ProviderSpec(name, options)


# -- reading a request ---------------------------------------------------------------------


def test_names_and_aliases_in_any_case_become_onnxruntimes_names_in_order() -> None:
    assert parse_providers("TensorRT, cuda,CPUExecutionProvider") == (
        spec(TRT),
        spec(CUDA),
        spec(CPU),
    )
    assert ProviderSpec("cudaexecutionprovider") == ProviderSpec("CUDA") == spec(CUDA)
    assert [s.name for s in parse_providers("openvino,rocm,migraphx,coreml")] == [
        "OpenVINOExecutionProvider",
        "ROCMExecutionProvider",
        "MIGraphXExecutionProvider",
        "CoreMLExecutionProvider",
    ]
    assert parse_providers("") == parse_providers(None) == parse_providers([]) == ()


def test_a_json_list_carries_options_as_strings() -> None:
    request = parse_providers(
        '[{"name": "tensorrt", "options": {"trt_fp16_enable": true, "device_id": 1}}, "cuda"]'
    )
    assert request == (spec(TRT, trt_fp16_enable="1", device_id="1"), spec(CUDA))
    assert dict(request[0].options) == {"trt_fp16_enable": "1", "device_id": "1"}
    # A value: hashable, equal by contents, options read-only.
    assert len({request[0], spec(TRT, device_id="1", trt_fp16_enable="1")}) == 1
    with pytest.raises(TypeError):
        request[0].options["device_id"] = "2"  # type: ignore[index]


def test_an_unknown_name_is_refused_naming_the_allowed_ones() -> None:
    with pytest.raises(ProviderError) as err:
        parse_providers("cuda,tpu")
    message = str(err.value)
    assert "'tpu'" in message
    for allowed in ("cuda", "tensorrt", "openvino", "rocm", "migraphx", "coreml", "cpu", CUDA):
        assert allowed in message


@pytest.mark.parametrize(
    "raw",
    [
        "cuda,CUDA",  # twice
        "[1]",
        '[{"name": "cuda", "device_id": 0}]',  # options outside `options`
        '[{"options": {}}]',  # no name
        '[{"name": "cuda", "options": {"device_id": [0]}}]',  # not a scalar
        "[not json",
        '{"name": "cuda"}',  # not a list
    ],
)
def test_malformed_requests_are_refused(raw: str) -> None:
    with pytest.raises(ProviderError):
        parse_providers(raw)


# -- choosing providers (pure) -------------------------------------------------------------


def test_available_providers_are_given_in_the_order_asked() -> None:
    request = (spec(TRT, trt_fp16_enable="1"), spec(CUDA), spec(CPU))
    assert select_providers(request, [CPU, CUDA, TRT], "refuse") == request
    assert select_providers((), CPU_MACHINE, "refuse") == CPU_ONLY


def test_a_missing_provider_is_refused_in_one_line_naming_the_way_out() -> None:
    with pytest.raises(ProviderUnavailable) as err:
        select_providers((spec(CUDA),), CPU_MACHINE, "refuse")
    message = str(err.value)
    assert "\n" not in message
    assert CUDA in message
    assert "AzureExecutionProvider, CPUExecutionProvider" in message  # what there is
    assert "TIERMESH_PROVIDER_FALLBACK=cpu" in message


def test_the_cpu_fallback_drops_what_is_missing_and_warns() -> None:
    with capture_logs() as logs:
        assert select_providers((spec(CUDA),), CPU_MACHINE, "cpu") == (spec(CPU),)
    (warning,) = logs
    assert warning["log_level"] == "warning"
    assert warning["requested"] == [CUDA]
    assert warning["missing"] == [CUDA]
    assert warning["using"] == [CPU]
    # What is there is kept, in order; CPU is not listed twice.
    with capture_logs() as logs:
        chosen = select_providers((spec(TRT), spec(CUDA), spec(CPU)), [CUDA, CPU], "cpu")
    assert chosen == (spec(CUDA), spec(CPU))
    assert logs[0]["missing"] == [TRT]


def test_nothing_is_logged_when_everything_asked_is_there() -> None:
    with capture_logs() as logs:
        select_providers((spec(CPU),), CPU_MACHINE, "cpu")
    assert logs == []


# -- a session onnxruntime moved to another provider ---------------------------------------


class FakeSession:
    """What onnxruntime hands back when CUDA failed to initialise: a session on CPU."""

    def __init__(self, source: Any, options: Any, providers: list[Any]) -> None:
        self.source, self.options, self.asked = source, options, providers

    def get_providers(self) -> list[str]:
        return [CPU]


def test_a_silent_downgrade_is_refused_or_warned() -> None:
    asked = (spec(CUDA), spec(CPU))
    session = FakeSession(b"", None, [])
    with pytest.raises(ProviderUnavailable) as err:
        check_provider(session, asked, "refuse")
    message = str(err.value)
    assert "\n" not in message
    assert CUDA in message and CPU in message and "TIERMESH_PROVIDER_FALLBACK=cpu" in message
    with capture_logs() as logs:
        assert check_provider(session, asked, "cpu") == CPU
    assert logs[0]["log_level"] == "warning"
    assert logs[0]["requested"] == [CUDA, CPU] and logs[0]["using"] == [CPU]
    assert check_provider(session, (spec(CPU),), "refuse") == CPU


def test_open_session_checks_what_onnxruntime_gave(monkeypatch: pytest.MonkeyPatch) -> None:
    """CUDA listed as available, the session comes back on CPU (libraries missing)."""
    made: list[FakeSession] = []

    def fake_session(source: Any, options: Any, providers: list[Any]) -> FakeSession:
        made.append(FakeSession(source, options, providers))
        return made[-1]

    preloaded: list[bool] = []
    monkeypatch.setattr(ort, "get_available_providers", lambda: [CUDA, CPU])
    monkeypatch.setattr(ort, "InferenceSession", fake_session)
    monkeypatch.setattr(sessions, "_preload_cuda", lambda: preloaded.append(True))
    request = (spec(CUDA, device_id="0"),)
    with pytest.raises(ProviderUnavailable):
        open_session(b"model", session_options(1), request)
    assert made[-1].asked == [(CUDA, {"device_id": "0"})]
    assert preloaded  # CUDA's libraries are loaded before a CUDA session
    with capture_logs() as logs:
        opened = open_session(b"model", session_options(1), request, fallback="cpu", unit="u")
    assert opened.provider == CPU and opened.session is made[-1]
    assert [e["event"] for e in logs] == [
        "execution provider failed to initialise: falling back",
        "onnx session created",
    ]
    assert logs[1]["unit"] == "u" and logs[1]["requested"] == [CUDA]
    assert logs[1]["provider"] == CPU


def test_a_real_session_says_which_provider_it_got() -> None:
    with capture_logs() as logs:
        opened = open_session(build_mlp(), session_options(1), unit=ComputeUnit("mlp", "1", "fp32"))
    assert opened.provider == CPU == opened.session.get_providers()[0]
    (created,) = logs
    assert created["event"] == "onnx session created"
    assert created["unit"] == "mlp@1.fp32"
    assert created["requested"] == [CPU] and created["provider"] == CPU
    with capture_logs() as logs:
        open_session(build_mlp(), session_options(1))  # a tool's: not logged
    assert logs == []


# -- configuration ------------------------------------------------------------------------


def test_a_tier_names_its_providers_with_options() -> None:
    tiers, _ = parse_tiers(
        {
            "edge": {
                "variant": "fp32",
                "max_cost": 64,
                "execution_providers": [
                    "cuda",
                    {"name": "tensorrt", "options": {"trt_fp16_enable": "1"}},
                ],
            },
            "center": {},
        }
    )
    edge, center = tiers
    assert edge.execution_providers == (spec(CUDA), spec(TRT, trt_fp16_enable="1"))
    assert center.execution_providers == ()


@pytest.mark.parametrize("raw", ["cuda", ["tpu"], [42], [{"name": "cuda", "opts": {}}], [["cuda"]]])
def test_a_tier_with_bad_providers_is_refused(raw: Any) -> None:
    with pytest.raises(TierConfigError, match=r"tiers\.edge\.execution_providers"):
        parse_tiers({"edge": {"execution_providers": raw}})


def mlp(tiers: Any = None) -> ModelConfig:
    raw = yaml.safe_load((MODELS / "mlp" / "config.yaml").read_text())
    if tiers is not None:
        raw["tiers"] = tiers
    return parse_config(raw, "mlp")


def test_a_model_config_reads_its_tiers_providers() -> None:
    cfg = mlp({"edge": {"max_cost": 8}, "center": {"execution_providers": ["cuda", "cpu"]}})
    assert [t.execution_providers for t in cfg.tiers] == [(), (spec(CUDA), spec(CPU))]


def test_the_worker_setting_reads_names_or_json(monkeypatch: pytest.MonkeyPatch) -> None:
    defaults = WorkerSettings()
    assert defaults.provider_request == () and defaults.provider_fallback == "refuse"
    monkeypatch.setenv("TIERMESH_EXECUTION_PROVIDERS", '[{"name": "cuda", "options": {"a": 1}}]')
    monkeypatch.setenv("TIERMESH_PROVIDER_FALLBACK", "cpu")
    settings = WorkerSettings()
    assert settings.provider_request == (spec(CUDA, a="1"),)
    assert settings.provider_fallback == "cpu"
    monkeypatch.setenv("TIERMESH_EXECUTION_PROVIDERS", "cuda,gpu")
    with pytest.raises(ValidationError, match=r"TIERMESH_EXECUTION_PROVIDERS.*'gpu'"):
        WorkerSettings()
    monkeypatch.setenv("TIERMESH_EXECUTION_PROVIDERS", "cuda")
    monkeypatch.setenv("TIERMESH_PROVIDER_FALLBACK", "maybe")
    with pytest.raises(ValidationError):
        WorkerSettings()


def test_the_worker_setting_wins_over_the_tier_and_cpu_is_the_default() -> None:
    cfg = mlp({"edge": {"max_cost": 8}, "center": {"execution_providers": ["cuda"]}})
    own = parse_providers("tensorrt,cpu")
    assert provider_choice(own, "cpu", cfg, "center") == ProviderChoice(own, "cpu")
    assert provider_choice((), "refuse", cfg, "center") == ProviderChoice((spec(CUDA),))
    assert provider_choice((), "refuse", cfg, "edge") == ProviderChoice((), "refuse")
    assert provider_choice((), "refuse", mlp(), "center").request == ()  # no tiers at all


# -- where it shows ------------------------------------------------------------------------


def test_model_config_says_what_each_tier_asks_for() -> None:
    assert EXECUTION_PROVIDERS not in model_config(mlp()).config.parameters
    cfg = mlp({"edge": {"max_cost": 8}, "center": {"execution_providers": ["cuda", "cpu"]}})
    parameter = model_config(cfg).config.parameters[EXECUTION_PROVIDERS].string_value
    assert json.loads(parameter) == {"center": [CUDA, CPU]}


def session_info(registry: CollectorRegistry) -> dict[tuple[str, ...], float]:
    return {
        tuple(s.labels[k] for k in ("model", "version", "variant", "tier", "provider")): s.value
        for metric in registry.collect()
        if metric.name == "tiermesh_worker_session_info"
        for s in metric.samples
    }


def test_the_worker_metric_labels_the_provider_each_session_got() -> None:
    registry = CollectorRegistry()
    metrics = WorkerMetrics(registry)
    metrics.unit_loaded(ComputeUnit("mlp", "1", "fp32"), "center", True, CUDA)
    assert session_info(registry) == {("mlp", "1", "fp32", "center", CUDA): 1.0}
    metrics.unit_loaded(
        ComputeUnit("mlp", "1", "fp32"), "center", True, CPU
    )  # opened again, elsewhere
    assert session_info(registry) == {("mlp", "1", "fp32", "center", CPU): 1.0}
    metrics.unit_loaded(ComputeUnit("mlp", "1", "fp32"), "center", False)
    assert session_info(registry) == {}


def test_a_runner_keeps_the_provider_and_no_wide_session_off_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(build_mlp())
    cfg = mlp()
    runner = ModelRunner(cfg, path, 1, wide_threads=2, providers=ProviderChoice(CPU_ONLY))
    assert runner.provider == CPU and runner.wide is not None
    opened: list[Any] = []

    def on_cuda(model: Any, options: Any, request: Any, **kwargs: Any) -> Opened:
        opened.append((request, kwargs["fallback"]))
        return Opened(FakeSession(model, options, []), CUDA)

    monkeypatch.setattr(runner_module, "open_session", on_cuda)
    choice = ProviderChoice((spec(CUDA),), "cpu")
    runner = ModelRunner(cfg, path, 1, wide_threads=2, providers=choice)
    assert runner.provider == CUDA
    assert runner.wide is None  # more CPU threads would not help a CUDA session
    assert opened == [((spec(CUDA),), "cpu")]


def test_tier_specs_stay_hashable_values() -> None:
    a = TierSpec("center", "", 0, (spec(CUDA, device_id="0"),))
    b = dataclasses.replace(a, execution_providers=(spec("cuda", device_id="0"),))
    assert a == b and hash(a) == hash(b)
