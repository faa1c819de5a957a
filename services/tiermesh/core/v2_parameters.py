"""KServe v2 parameters (`InferParameter`, tritonclient's protobuf) written from Python values:
by the gateway on its responses and by the load generator on its requests."""

from __future__ import annotations

from tritonclient.grpc import service_pb2


def set_parameter(param: service_pb2.InferParameter, value: object) -> None:
    """An InferParameter from a Python value, as tritonclient's own request parameters."""
    if isinstance(value, bool):
        param.bool_param = value
    elif isinstance(value, int):
        param.int64_param = value
    elif isinstance(value, float):
        param.double_param = value
    else:
        param.string_param = str(value)
