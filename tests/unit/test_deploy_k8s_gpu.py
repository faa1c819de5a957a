"""deploy/k8s/components/gpu, rendered offline on the center overlay (and, with every other
component, by test_deploy_k8s.py's checks): center workers take one NVIDIA GPU, run only on
GPU nodes, from the GPU image, and ask onnxruntime for CUDA, refusing to start without it;
the overlay's own node selector (amd64) is kept beside the GPU one. Nothing else changes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tests.unit.test_deploy_k8s import K8S, _build, container_env, of_kind
from tiermesh.core.sessions import parse_providers
from tiermesh.core.settings import WorkerSettings


def _center_with_gpu(where: Path) -> list[dict[str, Any]]:
    rel = Path(os.path.relpath(K8S, where))
    (where / "kustomization.yaml").write_text(
        f"resources: [{rel / 'overlays' / 'center'}]\ncomponents: [{rel / 'components' / 'gpu'}]\n"
    )
    return _build(where)


def test_the_gpu_component_puts_center_workers_on_a_gpu_asking_for_cuda(tmp_path: Path) -> None:
    docs = _center_with_gpu(tmp_path)
    plain = _build(K8S / "overlays" / "center")
    pod = of_kind(docs, "Deployment")["worker-center"]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"kubernetes.io/arch": "amd64", "nvidia.com/gpu.present": "true"}
    assert pod["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    (worker,) = pod["containers"]
    assert worker["image"] == "tiermesh-gpu:0.1.0"
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == 1
    # The CPU and memory bounds of the base stay.
    assert {"cpu", "memory"} <= set(worker["resources"]["limits"])
    env = container_env(docs, worker)
    assert env["TIERMESH_EXECUTION_PROVIDERS"] == "cuda"
    assert env["TIERMESH_PROVIDER_FALLBACK"] == "refuse"
    # What the worker makes of them: CUDA, and no fallback.
    settings = WorkerSettings(
        execution_providers=env["TIERMESH_EXECUTION_PROVIDERS"],
        provider_fallback=env["TIERMESH_PROVIDER_FALLBACK"],
    )
    assert settings.provider_request == parse_providers(["CUDAExecutionProvider"])
    assert settings.provider_fallback == "refuse"
    # Only the center workers change.
    for name, deployment in of_kind(plain, "Deployment").items():
        if name != "worker-center":
            assert of_kind(docs, "Deployment")[name] == deployment, name
