"""The KServe v2 gRPC door of the gateway (Triton's extensions included): each method
converts the proto request (converters.py), calls the data plane (plane.py) and converts
its answer back. Refusals are MeshErrors, turned into statuses by `grpc_method`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
from google.protobuf import json_format  # type: ignore[import-untyped]
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tiermesh.core.direct_plan import PARAMETER as PLAN_PARAMETER
from tiermesh.core.errors import invalid, shown
from tiermesh.core.grpc_errors import grpc_method
from tiermesh.gateway import converters
from tiermesh.gateway.control import version_parameter
from tiermesh.gateway.live_providers import EXECUTION_PROVIDERS_LIVE
from tiermesh.gateway.plane import Caller, DataPlane
from tiermesh.gateway.stream import stream_infer

# Sent by the Go front door when it reads its models (frontdoor/go/direct.go): ModelConfig
# then carries the model's placement plan; other callers never see it.
PLAN_HEADER = "x-tiermesh-placement"


def caller_of(context: grpc.aio.ServicerContext) -> Caller:
    return Caller(
        tuple(context.invocation_metadata() or ()), context.time_remaining(), context.peer() or ""
    )


class InferenceServicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    """The public servicer; built by the gateway's __main__ over its data plane."""

    def __init__(self, plane: DataPlane) -> None:
        self._plane = plane

    @grpc_method
    async def ServerLive(self, request, context):  # type: ignore[no-untyped-def]
        return service_pb2.ServerLiveResponse(live=True)

    @grpc_method
    async def ServerReady(self, request, context):  # type: ignore[no-untyped-def]
        return service_pb2.ServerReadyResponse(ready=await self._plane.server_ready())

    @grpc_method
    async def ModelReady(self, request, context):  # type: ignore[no-untyped-def]
        ready = await self._plane.model_ready(caller_of(context), request.name, request.version)
        return service_pb2.ModelReadyResponse(ready=ready)

    @grpc_method
    async def ServerMetadata(self, request, context):  # type: ignore[no-untyped-def]
        return converters.server_metadata(self._plane.server_metadata())

    @grpc_method
    async def ModelMetadata(self, request, context):  # type: ignore[no-untyped-def]
        cfg = self._plane.model(caller_of(context), request.name, request.version)
        return converters.model_metadata(cfg)

    @grpc_method
    async def ModelConfig(self, request, context):  # type: ignore[no-untyped-def]
        caller = caller_of(context)
        cfg = self._plane.model(caller, request.name, request.version)
        response = converters.model_config(cfg)
        if (PLAN_HEADER, "1") in caller.metadata:  # the front door reading its models
            # It reads every model every 30 s for its plan: no Redis reads for providers
            # it never looks at.
            plan = self._plane.direct_plan(cfg)
            if plan:
                response.config.parameters[PLAN_PARAMETER].string_value = plan
            return response
        live = await self._plane.providers_live(cfg, request.version)
        if live is not None:
            response.config.parameters[EXECUTION_PROVIDERS_LIVE].string_value = live
        return response

    @grpc_method
    async def ModelInfer(self, request, context):  # type: ignore[no-untyped-def]
        answer = await self._plane.infer(
            request.model_name,
            lambda screen: converters.infer_request(request, screen),
            caller_of(context),
        )
        return converters.infer_response(answer.result, answer.responded_ns, answer.cache_hit)

    async def ModelStreamInfer(
        self, request_iterator: AsyncIterator[Any], context: Any
    ) -> AsyncIterator[Any]:
        async for response in stream_infer(
            self._plane, request_iterator, lambda: caller_of(context)
        ):
            yield response

    @grpc_method
    async def ModelStatistics(self, request, context):  # type: ignore[no-untyped-def]
        docs = await self._plane.statistics_docs(caller_of(context), request.name, request.version)
        return json_format.ParseDict({"model_stats": docs}, service_pb2.ModelStatisticsResponse())

    @grpc_method
    async def RepositoryIndex(self, request, context):  # type: ignore[no-untyped-def]
        _no_other_repository(request.repository_name)
        docs = await self._plane.index_docs(caller_of(context), request.ready)
        return json_format.ParseDict({"models": docs}, service_pb2.RepositoryIndexResponse())

    @grpc_method
    async def RepositoryModelLoad(self, request, context):  # type: ignore[no-untyped-def]
        _no_other_repository(request.repository_name)
        for key in request.parameters:
            if key != "version":
                raise invalid(
                    f"load parameter '{shown(key)}' is not supported: models load from the "
                    "repository as committed (only 'version' may be given)"
                )
        version = version_parameter(request.parameters)
        await self._plane.load(caller_of(context), request.model_name, version)
        return service_pb2.RepositoryModelLoadResponse()

    @grpc_method
    async def RepositoryModelUnload(self, request, context):  # type: ignore[no-untyped-def]
        _no_other_repository(request.repository_name)
        version = version_parameter(request.parameters)
        await self._plane.unload(caller_of(context), request.model_name, version)
        return service_pb2.RepositoryModelUnloadResponse()


def _no_other_repository(name: str) -> None:
    if name:
        raise invalid(f"unknown repository '{shown(name)}': this server has one, named ''")
