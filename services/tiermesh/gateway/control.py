"""Model control (Triton's explicit mode) and the repository index.

What "loaded" means in this mesh: every model of the repository is served from the start
(workers build their sessions when they start). RepositoryModelUnload marks a model, or one
version of it, unloaded in a Redis set (keys.UNLOADED_MODELS); every gateway re-reads that set
every `model_control_refresh_ms` and refuses requests for what it holds (UNAVAILABLE, as
Triton does for a model that is not loaded), reports it not ready and lists it UNAVAILABLE
in the repository index. RepositoryModelLoad checks the version's files against their sha256
again and takes the mark off. So no request reaches a queue for an unloaded model through
any gateway; workers keep their onnxruntime sessions (releasing them, and loading models
added to the repository after the start, is not done here).

Control is refused unless the gateway runs with model_control=explicit, and then, with a
tenants file, only a tenant marked `admin: true` may use it.
"""

from __future__ import annotations

import asyncio

import grpc
import redis.asyncio as aioredis
import structlog
from redis import exceptions as redis_errors

from tiermesh.core import keys
from tiermesh.core.errors import MeshError, invalid, not_found, shown, unavailable
from tiermesh.core.repository import ModelConfig, ModelRepository, RepositoryError
from tiermesh.gateway.tenants import Tenant

log = structlog.get_logger("tiermesh.gateway.control")

READY = "READY"
UNAVAILABLE = "UNAVAILABLE"
UNLOADED_REASON = "unloaded"


def member(model: str, version: str = "") -> str:
    """The set member standing for a model (every version) or one version of it."""
    return f"{model}:{version}" if version else model


def check_allowed(enabled: bool, auth_on: bool, tenant: Tenant | None) -> None:
    """PERMISSION_DENIED unless model control is on and the caller may use it: any caller
    when the port is unauthenticated, else a tenant marked admin."""
    if not enabled:
        raise MeshError(
            grpc.StatusCode.PERMISSION_DENIED,
            "model control is disabled on this server (start the gateway with "
            "TIERMESH_MODEL_CONTROL=explicit, or `tiermesh up --model-control explicit`)",
        )
    if auth_on and (tenant is None or not tenant.admin):
        name = tenant.name if tenant else ""
        raise MeshError(
            grpc.StatusCode.PERMISSION_DENIED,
            f"tenant '{name}' may not load or unload models (needs admin: true)",
        )


class ModelControl:
    """The unloaded set, as this gateway last read it, and the load/unload operations."""

    def __init__(self, redis: aioredis.Redis, repo: ModelRepository) -> None:
        self._redis = redis
        self._repo = repo
        self._unloaded: frozenset[str] = frozenset()

    async def refresh(self) -> None:
        members = await self._redis.smembers(keys.UNLOADED_MODELS)
        self._unloaded = frozenset(m.decode() if isinstance(m, bytes) else m for m in members)

    async def run(self, interval_s: float) -> None:
        """Re-read the set until cancelled (owned by the gateway's __main__)."""
        while True:
            try:
                await self.refresh()
            except (redis_errors.RedisError, OSError) as exc:
                # The last view stays in force until Redis answers again.
                log.warning("unloaded models not refreshed", error=type(exc).__name__)
            await asyncio.sleep(interval_s)

    def is_served(self, cfg: ModelConfig, version: str = "") -> bool:
        """Whether (model, version) is loaded ("" = the version requests get by default)."""
        ver = cfg.version(version)
        if cfg.name in self._unloaded:
            return False
        return ver is None or member(cfg.name, ver.version) not in self._unloaded

    def check_served(self, cfg: ModelConfig, version: str = "") -> None:
        """UNAVAILABLE when (model, version) is unloaded."""
        if not self.is_served(cfg, version):
            which = f"model '{cfg.name}'" + (f" version '{version}'" if version else "")
            raise unavailable(f"{which} is not loaded (unloaded through model control)")

    def _known(self, name: str, version: str) -> ModelConfig:
        cfg = self._repo.get(name)
        if cfg is None:
            raise not_found(f"unknown model '{shown(name)}' in the model repository")
        if version and cfg.version(version) is None:
            raise not_found(f"model '{name}' has no version '{shown(version)}'")
        return cfg

    async def load(self, name: str, version: str = "") -> None:
        """Serve the model (or version) again once its files still match their sha256."""
        cfg = self._known(name, version)
        versions = [version] if version else [v.version for v in cfg.versions]
        for v in versions:
            try:
                self._repo.checked_folder(name, v)
            except RepositoryError as exc:
                log.error("model not loaded: files do not check", model=name, problem=str(exc))
                raise MeshError(
                    grpc.StatusCode.INTERNAL,
                    f"model '{name}' version {v}: its files do not match the repository's "
                    "checksums; see the gateway log",
                ) from None
        gone = [member(name, v) for v in versions] + ([] if version else [member(name)])
        await self._redis.srem(keys.UNLOADED_MODELS, *gone)
        await self.refresh()
        log.info("model loaded", model=name, version=version or "*")

    async def unload(self, name: str, version: str = "") -> None:
        self._known(name, version)
        await self._redis.sadd(keys.UNLOADED_MODELS, member(name, version))
        await self.refresh()
        log.info("model unloaded", model=name, version=version or "*")

    def index(self, models: list[ModelConfig], ready_only: bool) -> list[dict[str, str]]:
        """Triton's repository index: one entry per model version, with its state."""
        out = []
        for cfg in sorted(models, key=lambda c: c.name):
            for ver in cfg.versions:
                served = self.is_served(cfg, ver.version)
                if ready_only and not served:
                    continue
                entry = {"name": cfg.name, "version": ver.version}
                entry["state"] = READY if served else UNAVAILABLE
                if not served:
                    entry["reason"] = UNLOADED_REASON
                out.append(entry)
        return out


def version_parameter(params: object) -> str:
    """The optional `version` string parameter of a load/unload request."""
    p = params["version"] if "version" in params else None  # type: ignore[operator,index]
    if p is None:
        return ""
    if p.WhichOneof("parameter_choice") != "string_param":
        raise invalid("parameter 'version' must be a string")
    return str(p.string_param)
