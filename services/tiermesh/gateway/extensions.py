"""Triton's extensions of the KServe v2 protocol on the gateway's public servicer:
statistics, the repository index, model control (explicit mode), ModelStreamInfer, and the
extension list in the server metadata.

Each feature has a transport-neutral method (what the REST door calls) and a gRPC method
that converts proto <-> those values; the inference path stays InferenceServicer.infer.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import redis.asyncio as aioredis
from google.protobuf import json_format  # type: ignore[import-untyped]
from tritonclient.grpc import service_pb2

from tiermesh.core.errors import invalid, shown, unavailable
from tiermesh.core.grpc_errors import grpc_method
from tiermesh.core.repository import ModelConfig
from tiermesh.gateway.control import ModelControl, check_allowed, version_parameter
from tiermesh.gateway.pending import PartialCallback
from tiermesh.gateway.requests import InferRequest, find_model
from tiermesh.gateway.servicer import Answer, Caller, InferenceServicer, caller_of
from tiermesh.gateway.statistics import model_stats_doc
from tiermesh.gateway.statistics_store import StatisticsStore
from tiermesh.gateway.stream import stream_infer

Metadata = Sequence[tuple[str, str | bytes]]

# Triton's names of the extensions this server has.
EXTENSIONS = (
    "binary_tensor_data",
    "model_configuration",
    "model_repository",
    "parameters",
    "statistics",
)


class TritonServicer(InferenceServicer):
    """The public servicer with Triton's extensions; built by the gateway's __main__."""

    def __init__(
        self,
        *args: Any,
        control: ModelControl,
        control_enabled: bool,
        stats: StatisticsStore | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(*args, **kw)
        self.control = control
        self._control_enabled = control_enabled
        # The mesh's statistics (every gateway's, through Redis); None: this gateway's only.
        self._stats = stats
        if stats is not None:
            self.statistics = stats.statistics

    # -- transport-neutral ------------------------------------------------------------

    async def infer(
        self,
        model_name: str,
        parse: Callable[[], InferRequest],
        caller: Caller,
        on_partial: PartialCallback | None = None,
    ) -> Answer:
        """InferenceServicer.infer, refusing models unloaded through model control."""
        cfg = self._repo.get(model_name)
        if cfg is None or not self.control.is_served(cfg):
            # Another gateway may have loaded it just now: look (one GET) before refusing.
            await self.control.watch.catch_up()

        def served() -> InferRequest:
            req = parse()
            cfg = self._repo.get(req.model)
            if cfg is not None:
                self.control.check_served(cfg, req.version)
            return req

        return await super().infer(model_name, served, caller, on_partial)

    def _visible(self, metadata: Metadata) -> list[ModelConfig]:
        """The models the caller may use (all of them when the port is unauthenticated)."""
        tenant = self._gate.authenticate(metadata)
        models = list(self._repo.configs.values())
        if tenant is None or tenant.models is None:
            return models
        return [cfg for cfg in models if cfg.name in tenant.models]

    async def statistics_docs(
        self, metadata: Metadata, name: str, version: str
    ) -> list[dict[str, Any]]:
        """Triton's model_stats entries: of every model the caller may use ("" name), or of
        one model (every version, or the named one)."""
        if name:
            self._gate.authorize(metadata, name)
            cfg = find_model(self._repo, name, version)
            models = [cfg]
        else:
            if version:
                raise invalid("a version needs a model name")
            models = sorted(self._visible(metadata), key=lambda c: c.name)
        wanted = [
            (cfg.name, v)
            for cfg in models
            for v in ([version] if version else [ver.version for ver in cfg.versions])
        ]
        if self._stats is None:
            figures = {key: self.statistics.of(*key) for key in wanted}
        else:
            try:
                figures = await self._stats.read(wanted)
            except (aioredis.RedisError, OSError):
                raise unavailable("statistics unavailable (redis down or loading)") from None
        return [model_stats_doc(m, v, figures[(m, v)]) for m, v in wanted]

    async def index_docs(self, metadata: Metadata, ready_only: bool) -> list[dict[str, str]]:
        return await self.control.index(self._visible(metadata), ready_only)

    async def load(self, metadata: Metadata, name: str, version: str = "") -> None:
        self._check_control(metadata)
        await self.control.load(name, version)

    async def unload(self, metadata: Metadata, name: str, version: str = "") -> None:
        self._check_control(metadata)
        await self.control.unload(name, version)

    def _check_control(self, metadata: Metadata) -> None:
        tenant = self._gate.authenticate(metadata)
        check_allowed(self._control_enabled, self._gate.enabled, tenant)

    async def model_ready(self, metadata: Metadata, name: str, version: str) -> bool:
        """ModelReady: loaded (model control) and served by a live worker."""
        self._gate.authorize(metadata, name)
        cfg = self._repo.get(name)
        if cfg is None or self.draining:
            return False
        return await self.control.ready(cfg, version)

    # -- gRPC -------------------------------------------------------------------------

    @grpc_method
    async def ServerMetadata(self, request, context):  # type: ignore[no-untyped-def]
        response = await super().ServerMetadata(request, context)
        response.extensions.extend(EXTENSIONS)
        return response

    @grpc_method
    async def ModelReady(self, request, context):  # type: ignore[no-untyped-def]
        ready = await self.model_ready(caller_of(context).metadata, request.name, request.version)
        return service_pb2.ModelReadyResponse(ready=ready)

    @grpc_method
    async def ModelStatistics(self, request, context):  # type: ignore[no-untyped-def]
        docs = await self.statistics_docs(
            caller_of(context).metadata, request.name, request.version
        )
        return json_format.ParseDict({"model_stats": docs}, service_pb2.ModelStatisticsResponse())

    @grpc_method
    async def RepositoryIndex(self, request, context):  # type: ignore[no-untyped-def]
        _no_other_repository(request.repository_name)
        docs = await self.index_docs(caller_of(context).metadata, request.ready)
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
        await self.load(caller_of(context).metadata, request.model_name, version)
        return service_pb2.RepositoryModelLoadResponse()

    @grpc_method
    async def RepositoryModelUnload(self, request, context):  # type: ignore[no-untyped-def]
        _no_other_repository(request.repository_name)
        version = version_parameter(request.parameters)
        await self.unload(caller_of(context).metadata, request.model_name, version)
        return service_pb2.RepositoryModelUnloadResponse()

    async def ModelStreamInfer(
        self, request_iterator: AsyncIterator[Any], context: Any
    ) -> AsyncIterator[Any]:
        async for response in stream_infer(self, request_iterator, lambda: caller_of(context)):
            yield response


def _no_other_repository(name: str) -> None:
    if name:
        raise invalid(f"unknown repository '{shown(name)}': this server has one, named ''")
