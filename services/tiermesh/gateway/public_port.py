"""The gateway's public gRPC port: what it may expose without API keys, the server with its
bounds, and the doors on it (KServe v2 inference, batch jobs)."""

from __future__ import annotations

import grpc
from redis.asyncio import Redis

from tiermesh.batch.store import BatchStore
from tiermesh.core.exposure import PublicPort, StartRefused, public_exposure
from tiermesh.core.server import make_server, public_connection_options
from tiermesh.core.settings import GatewaySettings
from tiermesh.core.telemetry import Telemetry
from tiermesh.gateway.batch_jobs import BatchJobsServicer, caps_of
from tiermesh.gateway.call_spans import CallSpans
from tiermesh.gateway.decoding import (
    PUBLIC_SERVER_OPTIONS,
    add_inference_servicer,
    add_public_servicer,
)
from tiermesh.gateway.plane import DataPlane
from tiermesh.gateway.security import AccessGate
from tiermesh.gateway.servicer import InferenceServicer
from tiermesh.v1 import batch_pb2_grpc

# Calls open at once on the public gRPC port, per TIERMESH_MAX_IN_FLIGHT.
PUBLIC_RPCS_PER_IN_FLIGHT = 2


def check_exposure(settings: GatewaySettings) -> str:
    """StartRefused for explicit model control without API keys, and for a public port
    beyond loopback without them unless TIERMESH_INSECURE (core/exposure.py); else the
    warning to log ("" = none)."""
    ports = [
        PublicPort("gRPC", settings.gateway_host, settings.gateway_port, "TIERMESH_GATEWAY_HOST")
    ]
    if settings.http_port >= 0:
        ports.append(
            PublicPort("REST", settings.http_host, settings.http_port, "TIERMESH_HTTP_HOST")
        )
    decided = public_exposure(
        ports,
        keys=settings.tenants_file is not None,
        insecure=settings.insecure,
        opt_out="TIERMESH_INSECURE=true",
        model_control=settings.model_control,
        control_setting="TIERMESH_MODEL_CONTROL=explicit",
    )
    if decided.refusal:
        raise StartRefused(decided.refusal)
    return decided.warning


def public_server(
    settings: GatewaySettings,
    telemetry: Telemetry,
    plane: DataPlane,
    redis: Redis,
    gate: AccessGate,
) -> grpc.aio.Server:
    """The public port's server (not bound yet) with the inference and batch-jobs doors on
    `plane`. Compressed requests inflate within a bound, unparseable ones get
    INVALID_ARGUMENT (decoding.py)."""
    public = make_server(
        telemetry,
        settings.max_message_bytes,
        settings.max_metadata_bytes,
        intercepted=False,
        extra_options=(
            *PUBLIC_SERVER_OPTIONS,
            *public_connection_options(settings.idle_connection_s),
        ),
        max_receive_bytes=settings.max_request_bytes,
        # The last guard, before any handler runs (and so with no retry-after): the data
        # plane's own limits refuse first, and streams and health watches count here too.
        max_concurrent_rpcs=PUBLIC_RPCS_PER_IN_FLIGHT * settings.max_in_flight,
    )
    spans = CallSpans(telemetry.tracer) if telemetry.exporting else None
    request_limit = settings.max_request_bytes
    add_inference_servicer(InferenceServicer(plane), public, spans, request_limit)
    batch_jobs = BatchJobsServicer(
        plane,
        BatchStore(redis, settings.batch_retention_s),
        gate=gate,
        caps=caps_of(settings),
        submit_timeout_s=settings.batch_submit_timeout_s,
    )
    add_public_servicer(
        batch_pb2_grpc.add_BatchJobsServicer_to_server, batch_jobs, public, spans, request_limit
    )
    return public
