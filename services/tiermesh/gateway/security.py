"""What the data plane asks about a call's caller: who it is and whether it may use the
model (auth.py), whether its tenant has room (quota.py), and the audit entry it leaves
(audit.py), each refusal counted in the gateway's metrics.

Without a tenants file every call passes and nothing is audited: the laptop default.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext
from dataclasses import dataclass

import grpc
import redis.asyncio as aioredis
import structlog

from tiermesh.core.errors import MAX_RECORDED_NAME, MeshError, exhausted
from tiermesh.core.settings import GatewaySettings
from tiermesh.core.tenants import Tenant
from tiermesh.gateway.audit import INFER, NO_TENANT, RETRY_S, AuditEntry, AuditLog
from tiermesh.gateway.auth import (
    AuthRefused,
    Tenants,
    authenticate,
    check_model,
    check_statistics,
)
from tiermesh.gateway.auth_throttle import FailedAuth, peer_address
from tiermesh.gateway.metrics import GatewayMetrics
from tiermesh.gateway.quota import Quota, QuotaRefused

log = structlog.get_logger("tiermesh.gateway")
# An audited call refused while the audit log cannot be written is told to retry then.
AUDIT_RETRY_MS = int(RETRY_S * 1000)
# The refusal counter's reason for an address refused before its key was looked at.
THROTTLED = "throttled"
# What `hold` returns when there is nothing to count (reusable: it holds no state).
_NOT_HELD: AbstractAsyncContextManager[None] = nullcontext()


@dataclass(frozen=True)
class Security:
    """Built in __main__ when a tenants file is configured (`for_tenants`)."""

    tenants: Tenants
    quota: Quota
    audit: AuditLog

    @classmethod
    def for_tenants(
        cls,
        tenants: Tenants | None,
        redis: aioredis.Redis,
        settings: GatewaySettings,
        metrics: GatewayMetrics,
        keyless_warning: str,
    ) -> Security | None:
        """The checks for `tenants` (API keys required), or None without a tenants file: then
        `keyless_warning` (check_exposure's) or the default warning is logged."""
        if tenants is None:
            log.warning(
                keyless_warning
                or "the public port is unauthenticated: anyone who reaches it may use every "
                "model; set TIERMESH_TENANTS_FILE to require API keys"
            )
            return None
        audit = AuditLog(redis, settings.audit_max_len, on_lost=metrics.audit_lost.inc)
        log.info("API keys required on the public port", tenants=list(tenants.names))
        return cls(tenants, Quota(redis, settings.retry_after_ms), audit)


class AccessGate:
    def __init__(
        self,
        security: Security | None,
        metrics: GatewayMetrics,
        failures: FailedAuth | None = None,
    ) -> None:
        self._security = security
        self._metrics = metrics
        self._failures = failures if failures is not None else FailedAuth()

    @property
    def enabled(self) -> bool:
        return self._security is not None

    def authorize(
        self, metadata: Iterable[tuple[str, str | bytes]], peer: str, model: str
    ) -> Tenant | None:
        """Called first by every model-level method. The caller's tenant (None when auth is
        off); UNAUTHENTICATED or PERMISSION_DENIED otherwise."""
        tenant = self.authenticate(metadata, peer)
        self.check_model(tenant, model)
        return tenant

    def authenticate(self, metadata: Iterable[tuple[str, str | bytes]], peer: str) -> Tenant | None:
        """The caller's tenant (None when auth is off), or UNAUTHENTICATED; RESOURCE_EXHAUSTED
        for an address that failed too often lately (auth_throttle.py)."""
        if self._security is None:
            return None
        address = peer_address(peer)
        if wait_ms := self._failures.wait_ms(address):
            self._metrics.auth_refusals.labels(reason=THROTTLED).inc()
            raise exhausted("too many failed authentications from this address", wait_ms)
        try:
            return authenticate(self._security.tenants, metadata)
        except AuthRefused as err:
            self._failures.failed(address)
            self._metrics.auth_refusals.labels(reason=err.reason).inc()
            raise

    def check_model(self, tenant: Tenant | None, model: str) -> None:
        """PERMISSION_DENIED unless `tenant` may use `model` (None: auth is off)."""
        if tenant is None:
            return
        try:
            check_model(tenant, model)
        except AuthRefused as err:
            self._metrics.auth_refusals.labels(reason=err.reason).inc()
            raise

    def check_statistics(self, tenant: Tenant | None) -> None:
        """PERMISSION_DENIED unless `tenant` may read ModelStatistics (auth.py)."""
        try:
            check_statistics(tenant)
        except AuthRefused as err:
            self._metrics.auth_refusals.labels(reason=err.reason).inc()
            raise

    def hold(
        self, tenant: Tenant | None, request_id: str, deadline_ns: int
    ) -> AbstractAsyncContextManager[None]:
        """Count the request against its tenant's limits for the body's duration. Refuses
        with RESOURCE_EXHAUSTED (over a limit) or UNAVAILABLE (Redis away) before the body;
        the release runs on every exit and a cancellation cannot interrupt it. Without a
        tenant (auth off) nothing is counted, and nothing is built per request either."""
        if self._security is None or tenant is None:
            return _NOT_HELD
        return self._held(self._security.quota, tenant, request_id, deadline_ns)

    @asynccontextmanager
    async def _held(
        self, quota: Quota, tenant: Tenant, request_id: str, deadline_ns: int
    ) -> AsyncIterator[None]:
        try:
            held = await quota.acquire(tenant, request_id, deadline_ns // 1_000_000)
        except QuotaRefused as err:
            self._metrics.quota_refusals.labels(tenant=err.tenant, kind=err.kind).inc()
            raise
        try:
            yield
        finally:
            await asyncio.shield(quota.release(held))

    def check_audit_room(self) -> None:
        """UNAVAILABLE while the audit log's queue is full (its writes fail): an audited call
        is refused rather than served unrecorded. Nothing to check with auth off."""
        if self._security is not None and not self._security.audit.has_room:
            self._metrics.audit_refusals.inc()
            raise MeshError(
                grpc.StatusCode.UNAVAILABLE,
                "the audit log cannot be written; calls are refused until it can, retry later",
                retry_after_ms=AUDIT_RETRY_MS,
            )

    def audit(
        self,
        *,
        operation: str = INFER,
        time_ms: int,
        tenant: str,
        model: str,
        variant: str,
        outcome: str,
        request_id: str,
        peer: str,
        duration_ms: float,
    ) -> None:
        """Called once as each ModelInfer ends, whatever the outcome; queues its entry.
        Callers check `enabled` first: with auth off there is no entry to build."""
        if self._security is None:
            return
        self._security.audit.record(
            AuditEntry(
                operation=operation,
                time_ms=time_ms,
                tenant=tenant or NO_TENANT,
                model=model[:MAX_RECORDED_NAME],
                variant=variant[:MAX_RECORDED_NAME],
                outcome=outcome,
                request_id=request_id,
                peer=peer,
                duration_ms=duration_ms,
            )
        )
