"""Prometheus metrics: one registry per process, served over HTTP in Prometheus text format.

Each service builds its own metric set on the registry made here (no module-level
registries), and `MetricsServer` serves it at http://host:port/metrics.
"""

from __future__ import annotations

import threading
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    CollectorRegistry,
    PlatformCollector,
    ProcessCollector,
    start_http_server,
)

from tiermesh.core.keys import StreamKey

# Seconds: from a fraction of a millisecond (a refusal) to tens of seconds (a long queue).
LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
# The labels every per-request latency carries.
REQUEST_LABELS = ("model", "tier", "priority", "bucket", "variant")
# The labels of a per-stream metric (the worker's batches, the router's stream depths and lag).
STREAM_LABELS = ("model", "version", "variant", "tier", "priority", "bucket")


def stream_labels(key: StreamKey) -> dict[str, str]:
    model, version, variant = key.unit.labels
    return {
        "model": model,
        "version": version,
        "variant": variant,
        "tier": key.tier,
        "priority": str(key.priority),
        "bucket": str(key.bucket),
    }


def new_registry() -> CollectorRegistry:
    """A registry with the process collector (CPU seconds, resident memory, open files)."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    return registry


class MetricsServer:
    """Serves a registry on its own thread; started by a service's __main__, stopped last."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int) -> None:
        self._server: WSGIServer
        self._thread: threading.Thread
        self._server, self._thread = start_http_server(port, addr=host, registry=registry)
        self.port = int(self._server.server_port)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
