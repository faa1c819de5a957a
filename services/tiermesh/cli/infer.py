"""`tiermesh infer`: one request through tritonclient, the answer printed as JSON."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import triton_to_np_dtype


def infer(
    url: str,
    model: str,
    data: str | None,
    text: list[str] | None,
    timeout_us: int | None,
    priority: int,
) -> dict[str, Any]:
    """Send one request built from --data (JSON array) or --text to the model's only
    input; return the outputs and the mesh's timing parameters."""
    client = grpcclient.InferenceServerClient(url)
    meta = client.get_model_metadata(model, as_json=True)
    if len(meta["inputs"]) != 1:
        raise SystemExit(f"model {model} has {len(meta['inputs'])} inputs; infer supports one")
    spec = meta["inputs"][0]
    if spec["datatype"] == "BYTES":
        if not text:
            raise SystemExit(f"model {model} takes text: pass --text")
        array = np.array([[t.encode("utf-8")] for t in text], dtype=np.object_)
    else:
        if data is None:
            raise SystemExit(f"model {model} takes {spec['datatype']}: pass --data '[[...]]'")
        array = np.asarray(json.loads(data), dtype=triton_to_np_dtype(spec["datatype"]))
    inp = grpcclient.InferInput(spec["name"], list(array.shape), spec["datatype"])
    inp.set_data_from_numpy(array)
    result = client.infer(model, [inp], timeout=timeout_us, priority=priority)
    response = result.get_response(as_json=True)
    outputs = {}
    for out in meta["outputs"]:
        value = result.as_numpy(out["name"])
        if value is not None:
            if value.dtype == np.object_:
                value = np.vectorize(lambda b: b.decode("utf-8", "replace"))(value)
            outputs[out["name"]] = value.tolist()
    params = {k: next(iter(v.values())) for k, v in response.get("parameters", {}).items()}
    return {"model": model, "outputs": outputs, "parameters": params}
