"""Model control (Triton's explicit mode) and the repository index, for the whole mesh.

What the mesh serves is every model of the repository folder minus the unloaded set in Redis
(core/serving.py); every load and unload changes that set and increments a generation
counter in one transaction, and every service polls the counter (core/control_watch.py):

- RepositoryModelUnload adds the model (or "model:version") to the set. This gateway
  refuses it at once; other gateways and the routers within `model_control_refresh_ms`
  (UNAVAILABLE, "not loaded"); workers stop reading its streams and heartbeating for it,
  finish what they already read, answer what is still queued UNAVAILABLE and drop the
  sessions (worker/loop.py). It returns once the state is written: the mesh follows.
- RepositoryModelLoad re-reads the repository folder (so a model copied in after the start
  is found), checks every file of the model's versions against its sha256 - a mismatch is
  refused (FAILED_PRECONDITION) and changes nothing - then takes the marks off and waits,
  up to `model_control_load_wait_ms`, until a worker serves the model: workers re-read the
  folder, build sessions from verified bytes, join the consumer groups and heartbeat.
- ModelReady and the repository index say READY only for what is loaded and has a live
  worker.

A model copied into the folder is served once any load (of it or another model) made the
services re-read the folder, or once they restart. A unit a worker already serves keeps its
session when its files change on disk: unload and load it to take the new files.

Control is refused unless the gateway runs with model_control=explicit, and then only a
tenant marked `admin: true` may use it, always: the gateway does not start with explicit
control and no tenants file (core/exposure.py), and a call on a port without API keys is
refused here too.
"""

from __future__ import annotations

import asyncio
import time

import grpc
import redis.asyncio as aioredis
import structlog

from tiermesh.core import keys
from tiermesh.core.control_watch import ControlWatch
from tiermesh.core.errors import (
    MeshError,
    invalid,
    not_found,
    shown,
    unavailable,
    unknown_model,
)
from tiermesh.core.repository import ModelConfig, ModelRepository, RepositoryError
from tiermesh.core.serving import member
from tiermesh.core.tenants import Tenant
from tiermesh.gateway.upstream import Liveness

log = structlog.get_logger("tiermesh.gateway.control")

READY = "READY"
UNAVAILABLE = "UNAVAILABLE"
UNLOADED_REASON = "unloaded"
NO_WORKER_REASON = "no live worker serves it"
# How often a load looks whether a worker serves the model yet.
LOAD_POLL_S = 0.05

__all__ = ["ModelControl", "check_allowed", "member", "version_parameter"]


def check_allowed(enabled: bool, auth_on: bool, tenant: Tenant | None) -> None:
    """PERMISSION_DENIED unless model control is on and the caller is a tenant marked admin.
    Without API keys (`auth_on` false) nobody is: model state is the whole mesh's (it lives
    in Redis), so a keyless caller must not unload models for every gateway."""
    if not enabled:
        raise MeshError(
            grpc.StatusCode.PERMISSION_DENIED,
            "model control is disabled on this server (start the gateway with "
            "TIERMESH_MODEL_CONTROL=explicit, or `tiermesh up --model-control explicit`)",
        )
    if not auth_on:
        raise MeshError(
            grpc.StatusCode.PERMISSION_DENIED,
            "model control needs an admin tenant's API key, and this server takes none "
            "(start it with TIERMESH_TENANTS_FILE naming a tenant marked admin: true)",
        )
    if tenant is None or not tenant.admin:
        name = tenant.name if tenant else ""
        raise MeshError(
            grpc.StatusCode.PERMISSION_DENIED,
            f"tenant '{name}' may not load or unload models (needs admin: true)",
        )


class ModelControl:
    """The control state as this gateway last read it, and the load/unload operations."""

    def __init__(
        self,
        redis: aioredis.Redis,
        repo: ModelRepository,
        liveness: Liveness,
        load_wait_s: float = 30.0,
    ) -> None:
        self._redis = redis
        self._repo = repo
        self._liveness = liveness
        self._load_wait_s = load_wait_s
        self.watch = ControlWatch(redis, repo)

    async def refresh(self) -> None:
        """Read the state now (at start; a Redis that does not answer leaves it empty until
        the watch reads it)."""
        await self.watch.read()

    async def run(self, interval_s: float) -> None:
        """Follow the state until cancelled (owned by the gateway's __main__)."""
        await self.watch.run(interval_s)

    def is_served(self, cfg: ModelConfig, version: str = "") -> bool:
        """Whether (model, version) is loaded ("" = the version requests get by default)."""
        ver = cfg.version(version)
        return self.watch.state.served(cfg, ver.version if ver else cfg.version_for(""))

    def check_served(self, cfg: ModelConfig, version: str = "") -> None:
        """UNAVAILABLE when (model, version) is unloaded."""
        if not self.is_served(cfg, version):
            which = f"model '{cfg.name}'" + (f" version '{version}'" if version else "")
            raise unavailable(f"{which} is not loaded (unloaded through model control)")

    async def ready(self, cfg: ModelConfig, version: str = "") -> bool:
        """Loaded, and a live worker serves a compute unit requests for it go to."""
        ver = cfg.version(version)
        if ver is None or not self.is_served(cfg, version):
            return False
        for variant in sorted(set(cfg.tier_variants.values())):
            if await self._liveness.workers(cfg.unit(ver.version, variant)) > 0:
                return True
        return False

    def _known(
        self, repo: ModelRepository, name: str, version: str, *, loading: bool = False
    ) -> ModelConfig:
        """The model's config; NOT_FOUND in Triton's words when the repository lacks the
        model or version (a load's message starts "failed to load", as Triton's does)."""
        cfg = repo.get(name)
        if cfg is not None and (not version or cfg.version(version) is not None):
            return cfg
        err = unknown_model(name, version if cfg is not None else "")
        prefix = f"failed to load '{shown(name)}': " if loading else ""
        raise not_found(f"{prefix}{err.message} in the model repository")

    async def load(self, name: str, version: str = "") -> None:
        """Serve the model (or version) across the mesh once its files match their sha256;
        returns when a worker serves it."""
        fresh = ModelRepository(self._repo.root)
        try:
            await asyncio.to_thread(fresh.load)
        except RepositoryError as exc:
            log.error("model not loaded: repository unreadable", model=name, problem=str(exc))
            raise MeshError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"model '{shown(name)}' not loaded: the model repository does not read "
                f"({exc}); nothing changed",
            ) from None
        cfg = self._known(fresh, name, version, loading=True)
        versions = [version] if version else [v.version for v in cfg.versions]
        for v in versions:
            try:
                await asyncio.to_thread(fresh.checked_folder, name, v)
            except RepositoryError as exc:
                log.error("model not loaded: files do not check", model=name, problem=str(exc))
                raise MeshError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"model '{name}' version {v} not loaded: its files do not match the "
                    "sha256 checksums recorded in its config (see the gateway log for "
                    "which file); nothing changed",
                ) from None
        gone = [member(name, v) for v in versions] + ([] if version else [member(name)])
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.srem(keys.UNLOADED_MODELS, *gone)
            pipe.incr(keys.CONTROL_GENERATION)
            await pipe.execute()
        await self.watch.reload_repository()
        await self.watch.read()
        log.info("model loaded", model=name, version=version or "*")
        cfg = self._repo.get(name) or cfg
        deadline = time.monotonic() + self._load_wait_s
        while not all([await self.ready(cfg, v) for v in versions]):
            if time.monotonic() >= deadline:
                raise unavailable(
                    f"model '{name}' is loaded but no worker serves it yet (waited "
                    f"{self._load_wait_s:g} s); see the workers' logs"
                )
            await asyncio.sleep(LOAD_POLL_S)

    async def unload(self, name: str, version: str = "") -> None:
        """Stop serving the model (or version) across the mesh; returns once the state is
        written (this gateway refuses it from now on, the rest of the mesh follows)."""
        self._known(self._repo, name, version)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.sadd(keys.UNLOADED_MODELS, member(name, version))
            pipe.incr(keys.CONTROL_GENERATION)
            await pipe.execute()
        await self.watch.read()
        log.info("model unloaded", model=name, version=version or "*")

    async def index(self, models: list[ModelConfig], ready_only: bool) -> list[dict[str, str]]:
        """Triton's repository index: one entry per model version, with its state."""
        out = []
        for cfg in sorted(models, key=lambda c: c.name):
            for ver in cfg.versions:
                served = self.is_served(cfg, ver.version)
                ready = served and await self.ready(cfg, ver.version)
                if ready_only and not ready:
                    continue
                entry = {"name": cfg.name, "version": ver.version}
                entry["state"] = READY if ready else UNAVAILABLE
                if not ready:
                    entry["reason"] = NO_WORKER_REASON if served else UNLOADED_REASON
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
