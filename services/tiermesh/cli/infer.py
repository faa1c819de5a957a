"""`tiermesh infer` and `tiermesh similarity`: requests through tritonclient, answers printed."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import tritonclient.grpc as grpcclient
from tritonclient.utils import triton_to_np_dtype

from tiermesh.cli.errors import UsageError

SHOWN_VALUES = 8
# The first call of a command (the model's metadata) gives up after this long: a gateway
# that accepts connections but never answers is an error, not a hang.
METADATA_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Endpoint:
    """Where the gateway is and how to reach it: TLS (with the CA that signed its
    certificate, and a client certificate when it asks for one) and an API key."""

    url: str = "127.0.0.1:8001"
    api_key: str = ""
    tls: bool = False
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None

    @property
    def secure(self) -> bool:
        return self.tls or self.ca_file is not None or self.cert_file is not None

    def client(self) -> grpcclient.InferenceServerClient:
        return grpcclient.InferenceServerClient(
            self.url,
            ssl=self.secure,
            root_certificates=str(self.ca_file) if self.ca_file else None,
            private_key=str(self.key_file) if self.key_file else None,
            certificate_chain=str(self.cert_file) if self.cert_file else None,
        )

    @property
    def headers(self) -> dict[str, str] | None:
        return {"authorization": f"Bearer {self.api_key}"} if self.api_key else None


def _request(
    client: grpcclient.InferenceServerClient,
    model: str,
    data: Any,
    texts: list[str] | None,
    headers: dict[str, str] | None = None,
) -> tuple[list[grpcclient.InferInput], dict[str, Any]]:
    """The request for the model's only input; UsageError when what was given does not
    fit it (found out from its metadata, the first call)."""
    meta = client.get_model_metadata(
        model, headers=headers, as_json=True, client_timeout=METADATA_TIMEOUT_S
    )
    if len(meta["inputs"]) != 1:
        raise UsageError(f"model {model} has {len(meta['inputs'])} inputs; infer supports one")
    spec = meta["inputs"][0]
    if spec["datatype"] == "BYTES":
        if not texts:
            raise UsageError(f"model {model} takes text: pass it as arguments, not --data")
        array = np.array([[t.encode("utf-8")] for t in texts], dtype=np.object_)
    else:
        if data is None:
            raise UsageError(f"model {model} takes {spec['datatype']}: pass --data '[[...]]'")
        try:
            array = np.asarray(data, dtype=triton_to_np_dtype(spec["datatype"]))
        except (TypeError, ValueError) as exc:
            raise UsageError(f"--data does not fit {spec['datatype']}: {exc}") from None
    inp = grpcclient.InferInput(spec["name"], list(array.shape), spec["datatype"])
    inp.set_data_from_numpy(array)
    return [inp], meta


def _summary(value: npt.NDArray[Any]) -> Any:
    """Short vectors as they are; long ones (embeddings) as their first values and norm."""
    if value.dtype == np.object_:
        return np.vectorize(lambda b: b.decode("utf-8", "replace"))(value).tolist()
    if value.ndim == 2 and value.shape[1] > SHOWN_VALUES:
        return [
            {
                "first": [round(float(v), 6) for v in row[:SHOWN_VALUES]],
                "dims": int(row.shape[0]),
                "norm": round(float(np.linalg.norm(row)), 6),
            }
            for row in value
        ]
    return value.tolist()


def infer(
    endpoint: Endpoint,
    model: str,
    data: Any,
    texts: list[str] | None,
    timeout_us: int | None,
    priority: int,
    variant: str = "",
) -> dict[str, Any]:
    """Send one request built from --data (a parsed JSON array) or texts to the model's only input;
    return the outputs (long vectors summarised) and the mesh's timing parameters."""
    client = endpoint.client()
    inputs, meta = _request(client, model, data, texts, endpoint.headers)
    params = {"variant": variant} if variant else None
    result = client.infer(
        model,
        inputs,
        timeout=timeout_us,
        priority=priority,
        parameters=params,
        headers=endpoint.headers,
    )
    response = result.get_response(as_json=True)
    outputs = {}
    for out in meta["outputs"]:
        value = result.as_numpy(out["name"])
        if value is not None:
            outputs[out["name"]] = _summary(value)
    found = {k: next(iter(v.values())) for k, v in response.get("parameters", {}).items()}
    return {"model": model, "outputs": outputs, "parameters": found}


def similarity(endpoint: Endpoint, model: str, a: str, b: str, variant: str = "") -> float:
    """Cosine similarity of the embeddings of two texts, computed in one request."""
    client = endpoint.client()
    inputs, meta = _request(client, model, None, [a, b], endpoint.headers)
    params = {"variant": variant} if variant else None
    result = client.infer(model, inputs, parameters=params, headers=endpoint.headers)
    vectors = result.as_numpy(meta["outputs"][0]["name"]).astype(np.float64)
    u, v = vectors[0], vectors[1]
    return float(u @ v / (np.linalg.norm(u) * np.linalg.norm(v)))
