"""Settings of every service: one class per service on a shared base.

Every field is read from the environment with the prefix ``TIERMESH_`` (for example
``TIERMESH_GATEWAY_PORT``). Settings are built once in a service's ``__main__`` and passed
down; nothing reads the environment anywhere else.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from tiermesh.core.sessions import ProviderError, ProviderRequest, parse_providers


class ServiceSettings(BaseSettings):
    """What every service shares: where Redis and the models are, logs and traces."""

    model_config = SettingsConfigDict(env_prefix="TIERMESH_", extra="ignore")

    redis_url: str = "redis://127.0.0.1:6379/0"
    model_repository: Path = Path("models")
    log_level: str = "info"
    log_format: Literal["auto", "json", "console"] = "auto"
    # One JSON-lines span file per process is written here when set (tests, offline runs);
    # OTLP export follows the standard OTEL_* variables.
    trace_dir: Path | None = None
    shutdown_grace_s: float = Field(default=10.0, ge=0)
    # How long a finished batch job's record and results are kept (its inputs go at once).
    batch_retention_s: int = Field(default=7 * 24 * 3600, gt=0)
    # Prometheus text format at http://metrics_host:metrics_port/metrics (0 picks a port).
    metrics_host: str = "127.0.0.1"
    # Mutual TLS between services (all three PEM files or none; core/tls.py): every internal
    # server requires a client certificate signed by this CA and every internal channel
    # presents this certificate. One certificate serves as both server and client identity.
    internal_tls_ca_file: Path | None = None
    internal_tls_cert_file: Path | None = None
    internal_tls_key_file: Path | None = None
    # The name the Delivery channels (workers and postprocess to each gateway) check a
    # gateway's certificate against, instead of the address dialled: in Kubernetes gateways
    # are dialled at their pod IPs, which no certificate made before the pod runs can name.
    delivery_tls_server_name: str = ""
    # gRPC health, alone and plaintext, on this port too (-1: none), with the service's
    # status: for probes that present no certificate (Kubernetes' grpc probes) where the
    # service's own port wants one.
    health_host: str = "127.0.0.1"
    health_port: int = Field(default=-1, ge=-1)
    # Model control's state (what is unloaded; core/control_watch.py) is polled this often.
    model_control_refresh_ms: int = Field(default=500, gt=0)
    # gRPC's message limit, on the internal hops too: a worker's and postprocess's messages
    # of results are split by it (core/message_bytes.py), and an answer alone over it fails
    # alone (RESOURCE_EXHAUSTED). One value for every service: what a sender splits by is
    # what its receiver takes.
    max_message_bytes: int = Field(default=64 * 1024 * 1024, gt=0)


class GatewaySettings(ServiceSettings):
    gateway_host: str = "127.0.0.1"
    gateway_port: int = 8001
    # The KServe v2 REST door (same checks as the gRPC port; 0 picks a port, -1: none).
    http_host: str = "127.0.0.1"
    http_port: int = Field(default=8000, ge=-1)
    # Triton's model control mode: "explicit" lets an admin load and unload models through
    # the Repository* extension; "none" refuses it.
    model_control: Literal["none", "explicit"] = "none"
    # A model load waits this long for a worker to serve the model before answering.
    model_control_load_wait_ms: int = Field(default=30_000, gt=0)
    metrics_port: int = 8002
    delivery_host: str = "127.0.0.1"
    delivery_port: int = 8011
    # The address postprocess uses to reach this gateway; defaults to host and bound port.
    delivery_advertise: str = ""
    router_address: str = "127.0.0.1:8012"
    # A request on a public door is at most this many bytes: a gRPC message (gRPC refuses a
    # bigger one from its header, RESOURCE_EXHAUSTED), a REST body (413), and what a
    # compressed message may inflate to (decoding.py). Receiving one costs the gateway a few
    # times its size (up to ~4 bytes a byte: gRPC's, Python's and protobuf's copies); the
    # internal hops take max_message_bytes. Defaults to the smaller of 8 MiB and half of
    # max_message_bytes; set, it must be at most that half.
    max_request_bytes: int = Field(default=8 * 1024 * 1024, gt=0)
    # Calls a second whose caller's sampled traceparent this gateway follows (records and
    # passes on sampled); beyond, the call stays on its caller's trace, unsampled.
    caller_traces_per_s: float = Field(default=100.0, gt=0)
    # A public connection (gRPC or REST) with no call for this long is closed; a REST
    # connection whose request headers take longer is too.
    idle_connection_s: float = Field(default=120.0, gt=0)
    # Used when a request sets neither a gRPC deadline nor a `timeout` parameter.
    default_timeout_ms: int = Field(default=30_000, gt=0)
    # Requests this gateway waits on at once; beyond it callers are refused at once.
    max_in_flight: int = Field(default=4096, gt=0)
    retry_after_ms: int = Field(default=100, ge=0)
    # Within that cap, each (model, priority) has its own limit, learnt from how long its
    # requests waited for a worker (gateway/adaptive_limit.py): the target is the shortest
    # wait a class may show before its limit shrinks. false: the fixed cap alone.
    adaptive_limit: bool = True
    target_wait_ms: float = Field(default=10.0, gt=0)
    # Tenants, their API-key hashes, models and limits (YAML); unset = no authentication,
    # which the gateway accepts only on loopback unless `insecure` (core/exposure.py).
    tenants_file: Path | None = None
    # true: the public ports may listen beyond loopback without API keys (logged loudly).
    insecure: bool = False
    # Request headers (metadata) the public port accepts, all of them together.
    max_metadata_bytes: int = Field(default=8192, gt=0)
    # The audit stream keeps about this many entries (approximate MAXLEN).
    audit_max_len: int = Field(default=100_000, gt=0)
    # Per-version outcome counts (for canary judgement) go to Redis this often.
    rollout_flush_ms: int = Field(default=250, gt=0)
    # Triton's ModelStatistics figures go to Redis this often (summed over every gateway).
    statistics_flush_ms: int = Field(default=500, gt=0)
    # TLS on the public port (PEM certificate chain and key, both or neither): when set the
    # port serves TLS only. With a client CA, clients must present a certificate it signed.
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    tls_client_ca_file: Path | None = None
    # Traffic capture (gateway/capture.py; `tiermesh bench capture start|stop` overrides):
    # the share of requests recorded as shapes (0: off), for this long after start (0: no end).
    capture_sample_rate: float = Field(default=0.0, ge=0, le=1)
    capture_window_s: float = Field(default=0.0, ge=0)
    # The capture stream keeps about this many records (approximate MAXLEN).
    capture_max_len: int = Field(default=100_000, gt=0)
    capture_flush_ms: int = Field(default=250, gt=0)
    # Fernet key (`tiermesh bench capture key`) encrypting the contents of tenants whose
    # tenants-file entry sets capture_contents; without it no contents are ever stored.
    capture_contents_key: str = ""
    capture_contents_ttl_s: int = Field(default=86_400, gt=0)
    # Prices per tier (deploy/prices.yaml), exported as gauges for the cost rules.
    prices_file: Path | None = None
    # Batch jobs (gateway/batch_jobs.py), per tenant unless its tenants-file entry says
    # otherwise: unfinished jobs at once, inputs and bytes (as stored) per job.
    batch_max_open_jobs: int = Field(default=8, gt=0)
    batch_max_inputs: int = Field(default=100_000, gt=0)
    batch_max_bytes: int = Field(default=256 * 1024 * 1024, gt=0)
    # A Submit sends all its inputs within this, or ends DEADLINE_EXCEEDED and its job is
    # deleted; a gateway that dies meanwhile leaves keys that expire a minute after it.
    batch_submit_timeout_s: float = Field(default=600.0, gt=0)

    @model_validator(mode="after")
    def _requests_fit_a_message(self) -> GatewaySettings:
        # A request's job crosses the internal hops in one message, beside its annotations.
        half = self.max_message_bytes // 2
        if "max_request_bytes" not in self.model_fields_set:
            self.max_request_bytes = min(self.max_request_bytes, half)
        if self.max_request_bytes > half:
            raise ValueError(
                f"TIERMESH_MAX_REQUEST_BYTES ({self.max_request_bytes}) must be at most half "
                f"of TIERMESH_MAX_MESSAGE_BYTES ({self.max_message_bytes})"
            )
        return self


class RouterSettings(ServiceSettings):
    router_host: str = "127.0.0.1"
    # The gateways' tenants file: without internal mTLS the router checks that the tenant a
    # job names is one of it that may use the model (unset: jobs name no tenant).
    tenants_file: Path | None = None
    router_port: int = 8012
    metrics_port: int = 8022
    retry_after_ms: int = Field(default=200, ge=0)
    # Rollout states are re-read this often (routing never waits on Redis for them).
    rollout_refresh_ms: int = Field(default=1000, gt=0)
    # The rollout controller's round, and the TTL of its lock (another router takes over
    # this long after the evaluating one died).
    rollout_eval_interval_ms: int = Field(default=500, gt=0)
    rollout_lock_ttl_ms: int = Field(default=3000, gt=0)
    # Batch jobs (router/batch_feeder.py): the tier their work is pinned to ("" = the model's last
    # tier), inputs moved per round and job, the most of a job's inputs queued at once.
    batch_tier: str = ""
    batch_feed_chunk: int = Field(default=64, gt=0)
    batch_max_queued: int = Field(default=256, gt=0)
    batch_feed_interval_ms: int = Field(default=20, gt=0)
    # How often the router looks for work stranded on a tier whose workers all died
    # (router/stranded.py): moved to a live tier within a heartbeat TTL plus this.
    stranded_interval_ms: int = Field(default=500, gt=0)


class WorkerSettings(ServiceSettings):
    worker_tier: str = "center"
    # Comma-separated model names this worker serves; empty serves every model.
    worker_models: str = ""
    worker_host: str = "127.0.0.1"
    worker_health_port: int = 8014
    metrics_port: int = 8024
    worker_id: str = ""
    postprocess_address: str = "127.0.0.1:8013"
    # A batch with no output step left to run (a model without one, or pooling in its graph)
    # goes from the worker straight to its gateways; false: every batch through postprocess.
    direct_delivery: bool = True
    delivery_timeout_ms: int = Field(default=5000, gt=0)
    # onnxruntime threads per session call and batches computing at once (worker/lanes.py
    # `plan`); both 0: up to 4 lanes sharing the cores, e.g. two one-thread lanes on 2 cores.
    intra_op_threads: int = Field(default=0, ge=0)
    compute_lanes: int = Field(default=0, ge=0)
    # Lanes compute at this much lower CPU priority than the rest of the worker (and of
    # the request path on the same cores): worker/lanes.py ComputeThreads. 0: the same.
    # 10 by default: benchmarks/scheduling.py, priority-1 p99 beside a flood 16x -> 5.6x.
    compute_nice: int = Field(default=10, ge=0, le=19)
    heartbeat_interval_ms: int = Field(default=1000, gt=0)
    heartbeat_ttl_ms: int = Field(default=10_000, gt=0)
    poll_block_ms: int = Field(default=200, gt=0)
    # Entries another worker left unacknowledged this long are taken over (it died).
    reclaim_interval_ms: int = Field(default=1000, gt=0)
    reclaim_min_idle_ms: int = Field(default=5000, gt=0)
    # An entry delivered more often than this is dead-lettered; its caller gets ABORTED.
    max_deliveries: int = Field(default=3, ge=1)
    # The dead-letter stream of each model and tier keeps this many entries, each with its
    # request's job when that is at most this many bytes (else its ids, size and reason).
    dead_letter_max_len: int = Field(default=1000, gt=0)
    dead_letter_max_payload_bytes: int = Field(default=16 * 1024, ge=0)
    # A batch's requests (their stream entries) add up to at most this many bytes; one
    # bigger request computes alone. Below max_message_bytes: the answers, and the inputs
    # an output step reads, go on in the batch's hand-off. Unset: 16 MiB, or a quarter of
    # a smaller message limit.
    max_batch_bytes: int = Field(default=16 * 1024 * 1024, gt=0)
    # On stop: after deregistering, entries routed here meanwhile are still read this long.
    leave_window_ms: int = Field(default=500, ge=0)
    # Batch jobs: whether this worker takes their (background) work at all - false keeps a
    # pool online-only - and the share of compute time it may give them while online work
    # waits (0: only in the gaps of online work).
    batch_jobs: bool = True
    batch_background_share: float = Field(default=0.0, ge=0, le=1)
    # While online requests keep arriving, background batches leave a compute lane to them
    # and pause whenever online entries were read after waiting longer than this in their
    # queue (worker/scheduler.py). Without online traffic: full speed.
    batch_target_wait_ms: float = Field(default=2.0, ge=0)
    # false: a batch pool worker - it reads only batch-job (background) streams and never
    # registers for online admission. With worker_nice > 0 the process lowers its CPU
    # priority by that much at start (os.nice), so on shared cores online work goes first.
    worker_online: bool = True
    worker_nice: int = Field(default=0, ge=0, le=19)
    # onnxruntime execution providers for every session, in order of preference
    # (core/sessions.py): a comma list of names (cuda, tensorrt, openvino, rocm, migraphx,
    # coreml, cpu, or onnxruntime's own) or a JSON list of {"name": ..., "options": {...}}.
    # Empty: each model's `tiers.<this tier>.execution_providers`, else CPU.
    execution_providers: str = ""
    # A provider asked for that is missing or fails to initialise: `refuse` stops the
    # worker with one line saying so; `cpu` serves on CPU instead, with a warning.
    provider_fallback: Literal["refuse", "cpu"] = "refuse"

    @property
    def model_names(self) -> list[str]:
        return [m.strip() for m in self.worker_models.split(",") if m.strip()]

    @property
    def provider_request(self) -> ProviderRequest:
        """TIERMESH_EXECUTION_PROVIDERS, parsed (checked when the settings are built)."""
        return parse_providers(self.execution_providers)

    @model_validator(mode="after")
    def _providers_are_known(self) -> WorkerSettings:
        try:
            parse_providers(self.execution_providers)
        except ProviderError as exc:
            raise ValueError(f"TIERMESH_EXECUTION_PROVIDERS: {exc}") from None
        return self

    @model_validator(mode="after")
    def _reclaims_often_enough(self) -> WorkerSettings:
        # A worker touches what it holds on each reclaim round once a quarter of the idle
        # time old (worker/streams.py): rounds at least every half of it keep a slow batch
        # from idling into a reclaim.
        if 2 * self.reclaim_interval_ms > self.reclaim_min_idle_ms:
            raise ValueError(
                f"TIERMESH_RECLAIM_INTERVAL_MS ({self.reclaim_interval_ms}) must be at most "
                f"half of TIERMESH_RECLAIM_MIN_IDLE_MS ({self.reclaim_min_idle_ms})"
            )
        return self

    @model_validator(mode="after")
    def _batches_fit_a_message(self) -> WorkerSettings:
        if "max_batch_bytes" not in self.model_fields_set:
            self.max_batch_bytes = min(self.max_batch_bytes, self.max_message_bytes // 4)
        if self.max_batch_bytes >= self.max_message_bytes:
            raise ValueError(
                f"TIERMESH_MAX_BATCH_BYTES ({self.max_batch_bytes}) must be below "
                f"TIERMESH_MAX_MESSAGE_BYTES ({self.max_message_bytes})"
            )
        return self


class PostprocessSettings(ServiceSettings):
    postprocess_host: str = "127.0.0.1"
    postprocess_port: int = 8013
    metrics_port: int = 8023
    delivery_timeout_ms: int = Field(default=5000, gt=0)
