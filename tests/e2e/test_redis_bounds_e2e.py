"""No Redis key the mesh writes grows without a bound (issue 22, acceptance 5).

A keyed `tiermesh up` serves a mix of what users do (unary and streamed calls, a cached
model, REST, a call its caller gives up on, refused calls, a batch job), then every key in
its Redis is listed and classed by its pattern: each class says what bounds it (a TTL, a
trimmed stream, the admission bound of a work stream, or one key per model, tier, tenant of
the configuration). A key that matches no class fails the test: a new kind of key must say
what bounds it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc
import numpy as np
import pytest
import redis
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import UpProcess, running
from tests.tenants import ADMIN_KEY, USER_KEY, write_tenants
from tiermesh.core import keys
from tiermesh.core.redis_client import connect_sync
from tiermesh.core.repository import ModelRepository
from tiermesh.core.settings import GatewaySettings, WorkerSettings
from tiermesh.v1 import batch_pb2, batch_pb2_grpc

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}


@dataclass(frozen=True)
class Bound:
    pattern: str  # a regular expression of the whole key
    why: str
    # Whether the key keeps to its bound; None: a key per configured model (its group 1).
    check: Callable[[redis.Redis, str], bool] | None = None


def _ttl(r: redis.Redis, key: str) -> bool:
    return int(r.pttl(key)) > 0


def _stream_within(n: int) -> Callable[[redis.Redis, str], bool]:
    def within(r: redis.Redis, key: str) -> bool:
        return r.type(key) in (b"stream", "stream") and int(r.xlen(key)) <= n

    return within


def _one(r: redis.Redis, key: str) -> bool:
    return True


def bounds(repo: ModelRepository) -> list[Bound]:
    queue = max(cfg.queue_bound for cfg in repo.configs.values())
    dead = WorkerSettings().dead_letter_max_len
    gateway = GatewaySettings()
    name = r"[^:@{}]+"
    unit = rf"\{{({name})\}}@[^:]+"  # a compute unit, its model's name the hash tag
    tag = rf"\{{({name})\}}"
    return [
        Bound(rf"tm:q:{unit}:[a-z]+:p\d+:b\d+", "admission bound", _stream_within(queue)),
        Bound(rf"tm:dlq:{unit}:[a-z]+", "MAXLEN", _stream_within(dead)),
        Bound(r"tm:audit", "MAXLEN ~", _stream_within(2 * gateway.audit_max_len)),
        Bound(r"tm:capture", "MAXLEN ~", _stream_within(2 * gateway.capture_max_len)),
        Bound(r"tm:\{rollout\}:changes", "MAXLEN ~", _stream_within(2 * keys.CHANGE_LOG_MAX_LEN)),
        Bound(r"tm:cancel:[0-9a-f]+", "TTL", _ttl),
        Bound(rf"tm:enq:{tag}:[0-9a-f]+", "TTL", _ttl),
        Bound(rf"tm:cache:{tag}:e:[0-9a-f]+", "TTL", _ttl),
        Bound(r"tm:quota:\{.*\}:(rate|inflight)", "TTL", _ttl),
        Bound(r"tm:win:.+", "TTL", _ttl),
        Bound(rf"tm:stats:{tag}:batch:.+", "TTL", _ttl),
        Bound(r"tm:capture:content:.+", "TTL", _ttl),
        Bound(r"tm:\{batch\}:job:[0-9a-f]+(:in|:out)?", "TTL", _ttl),
        Bound(r"tm:\{batch\}:open:.*", "TTL", _ttl),
        Bound(r"tm:\{(rollout|batch)\}:(feed:)?lock", "TTL", _ttl),
        Bound(rf"tm:provider:{unit}:[a-z]+:[^:]+", "TTL", _ttl),
        Bound(rf"tm:workers:{unit}:[a-z]+", "one per unit and tier"),
        Bound(rf"tm:rate:{unit}:[a-z]+", "one per unit and tier"),
        Bound(rf"tm:cache:{tag}:index", "one per model"),
        Bound(rf"tm:stats:{tag}:[^:]+", "one per model version"),
        Bound(rf"tm:\{{rollout\}}:({name})", "one per model"),
        Bound(r"tm:\{control\}:(unloaded|generation)", "one", _one),
        Bound(r"tm:capture:control", "one", _one),
        Bound(r"tm:\{batch\}:active", "one; its ids are open jobs'", _one),
    ]


@pytest.fixture(scope="module")
def used(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    """A keyed mesh after a mix of calls."""
    tmp = tmp_path_factory.mktemp("bounds")
    tenants = write_tenants(tmp / "tenants.yaml")
    with running(tmp, extra_env={"TIERMESH_TENANTS_FILE": str(tenants)}) as up:
        client = grpcclient.InferenceServerClient(up.url)
        x = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        x.set_data_from_numpy(np.ones((1, 4), np.float32))
        for model in ("mlp", "mlp_cached", "mlp_cached"):
            client.infer(model, [x], headers=ADMIN)
        text = grpcclient.InferInput("TEXT", [1, 1], "BYTES")
        text.set_data_from_numpy(np.array([[b"bounded"]], dtype=object))
        client.infer("echo", [text], headers=ADMIN)
        for headers in ({}, {"authorization": f"Bearer {USER_KEY}"}):  # refused calls
            with pytest.raises(InferenceServerException):
                client.infer("mlp", [x], headers=headers)
        with pytest.raises(InferenceServerException):  # a caller who gives up at once
            client.infer("mlp", [x], headers=ADMIN, client_timeout=0.000_001)
        with grpc.insecure_channel(up.url) as channel:
            stub = batch_pb2_grpc.BatchJobsStub(channel)
            chunks = iter([batch_pb2.SubmitChunk(model="echo", texts=["a", "b", "c"])])
            job = stub.Submit(chunks, metadata=tuple(ADMIN.items()), timeout=60)
            deadline = time.monotonic() + 60
            while stub.Status(
                batch_pb2.JobRef(job_id=job.job_id), metadata=tuple(ADMIN.items())
            ).status not in ("done", "failed", "cancelled"):
                assert time.monotonic() < deadline, "the batch job never finished"
                time.sleep(0.1)
        yield up


def test_every_key_the_mesh_wrote_has_a_bound(used: UpProcess) -> None:
    r = connect_sync(used.redis_url())
    repo = ModelRepository(used.trace_dir.parent / "models")  # the mesh's own
    repo.load()
    models = set(repo.configs)
    table = bounds(repo)
    names = sorted(k.decode() for k in r.scan_iter(match="*", count=1000))
    assert any(k.startswith("tm:q:") for k in names)
    assert any(k.startswith("tm:{batch}:job:") for k in names)
    unbounded = []
    classes: set[str] = set()
    for key in names:
        bound = next((b for b in table if re.fullmatch(b.pattern, key)), None)
        if bound is None:
            unbounded.append(f"{key}: no class says what bounds it")
            continue
        classes.add(bound.pattern)
        found = re.fullmatch(bound.pattern, key)
        assert found is not None
        if bound.check is None:
            if found.group(1) not in models:
                unbounded.append(f"{key}: names no configured model ({bound.why})")
        elif not bound.check(r, key):
            unbounded.append(f"{key}: not within its bound ({bound.why}), ttl {r.pttl(key)}")
    print(f"\n{len(names)} keys in {len(classes)} classes: " + ", ".join(sorted(classes)))
    assert not unbounded, "\n".join(unbounded)
