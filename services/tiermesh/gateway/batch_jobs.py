"""The BatchJobs servicer on the public port (the batch-jobs door of the data plane):
submit a job's inputs, follow it, read its results, cancel it. Authenticated and validated
by the data plane like ModelInfer; a tenant sees only its own jobs (another tenant's job id
answers NOT_FOUND, as an unknown one does).

A Submit is held to the same limits as online work: it takes a token of its tenant's rate
limit and an in-flight slot while its inputs arrive (the gate's hold, as ModelInfer does);
its tenant may have at most `max_open_jobs` unfinished jobs, each of at most `max_inputs`
inputs and `max_bytes` bytes (batch/limits.py: RESOURCE_EXHAUSTED naming the cap before the
chunk that crosses it is stored); every input is validated as a ModelInfer request is
(texts: UTF-8 and a tokenized model's max_text_bytes); and it must end within
`submit_timeout_s`. A Submit that does not end well (refused, cancelled by its client,
timed out, Redis failing) deletes its job: its caller never learnt the job's id, so
nothing could ever read it. Should the delete itself fail (or the gateway die), the job's
keys expire a minute after the Submit's timeout.
"""

from __future__ import annotations

import asyncio
import struct
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import nullcontext

import grpc
import structlog
from redis.exceptions import RedisError

from tiermesh.batch.limits import BatchCaps, JobBudget, open_jobs_refused
from tiermesh.batch.plan import FINISHED, JobRecord, job_streams
from tiermesh.batch.store import BatchStore
from tiermesh.core.errors import MeshError, deadline_exceeded, invalid, not_found, shown
from tiermesh.core.grpc_errors import fail_call, grpc_method
from tiermesh.core.jobs import Job
from tiermesh.core.repository import ModelConfig
from tiermesh.core.settings import GatewaySettings
from tiermesh.core.tenants import Tenant
from tiermesh.core.tensors import BYTES, TensorData
from tiermesh.core.wire import encode_job, tensor_from_proto
from tiermesh.gateway.decoding import messages
from tiermesh.gateway.plane import Caller, DataPlane
from tiermesh.gateway.requests import InferRequest, validate, variant_of
from tiermesh.gateway.security import AccessGate
from tiermesh.gateway.servicer import caller_of
from tiermesh.v1 import batch_pb2, batch_pb2_grpc

log = structlog.get_logger("tiermesh.gateway")

# Results sent per Redis read while streaming them back.
RESULTS_PAGE = 512
# GatewaySettings.batch_submit_timeout_s's default.
DEFAULT_SUBMIT_TIMEOUT_S = 600.0
# A loading job's keys outlive its Submit's timeout by this much.
LOADING_SLACK_S = 60
# Inputs validated and encoded between two yields to the event loop (~20 us each: ~5 ms).
INPUTS_PER_YIELD = 256


def caps_of(settings: GatewaySettings) -> BatchCaps:
    """The batch-job caps of a tenant whose tenants-file entry sets none."""
    return BatchCaps(
        max_open_jobs=settings.batch_max_open_jobs,
        max_inputs=settings.batch_max_inputs,
        max_bytes=settings.batch_max_bytes,
    )


def tenant_caps(caps: BatchCaps, tenant: Tenant | None) -> BatchCaps:
    """`caps` with the tenant's own (its tenants-file entry's `batch:`) in their place."""
    if tenant is None:
        return caps
    return caps.overridden(
        tenant.batch_max_open_jobs, tenant.batch_max_inputs, tenant.batch_max_bytes
    )


def text_input(cfg: ModelConfig, text: str) -> TensorData:
    """One text as the model's only input: a BYTES tensor of one element (batch of one)."""
    if len(cfg.inputs) != 1 or cfg.inputs[0].datatype != BYTES:
        raise invalid(f"model '{cfg.name}' does not take a single text input; send tensors")
    spec = cfg.inputs[0]
    data = text.encode()
    shape = (1,) * (len(spec.dims) + (1 if cfg.max_batch_size > 0 else 0))
    return TensorData(spec.name, BYTES, shape, struct.pack("<I", len(data)) + data)


def to_proto(job: JobRecord) -> batch_pb2.BatchJob:
    return batch_pb2.BatchJob(
        job_id=job.job_id,
        model=job.model,
        status=job.status,
        total=job.total,
        done=job.done,
        errors=job.errors,
        fed=job.fed,
        created_ms=job.created_ms,
        finished_ms=job.finished_ms,
        tenant=job.tenant,
        tier=job.tier,
    )


def _tensors(cfg: ModelConfig, chunk: batch_pb2.SubmitChunk) -> Iterator[tuple[TensorData, ...]]:
    for text in chunk.texts:
        yield (text_input(cfg, text),)
    for item in chunk.items:
        yield tuple(tensor_from_proto(t) for t in item.inputs)


async def _inputs(cfg: ModelConfig, chunk: batch_pb2.SubmitChunk, budget: JobBudget) -> list[bytes]:
    """The chunk's inputs, each validated like a ModelInfer request (the model's inputs,
    UTF-8, a tokenized model's max_text_bytes) and encoded as an internal Job, within the
    job's caps: the chunk is refused before anything of it is stored."""
    budget.count(len(chunk.texts) + len(chunk.items))
    out = []
    for tensors in _tensors(cfg, chunk):
        validate(cfg, InferRequest(cfg.name, "", tensors))
        payload = encode_job(Job("", cfg.name, tensors, ""))
        budget.store(len(payload))
        out.append(payload)
        if len(out) % INPUTS_PER_YIELD == 0:
            await asyncio.sleep(0)  # other calls share this event loop
    return out


async def _client_waits(context: grpc.aio.ServicerContext) -> None:
    """CANCELLED unless the client is still waiting for its reply. grpc.aio ends a request
    stream alike when the client has sent everything and when it cancelled the call (the
    cancellation reaches the handler only later, if at all before it returns); sending the
    reply's headers tells them apart: that fails on a cancelled call."""
    try:
        await context.send_initial_metadata(())
    except asyncio.CancelledError:
        raise
    except Exception:  # cygrpc's ExecuteBatchError, UsageError: the call has ended
        raise MeshError(grpc.StatusCode.CANCELLED, "the call ended before the job") from None


def _ended_meanwhile() -> MeshError:
    return MeshError(
        grpc.StatusCode.ABORTED, "the batch job ended while its inputs arrived (cancelled)"
    )


class BatchJobsServicer(batch_pb2_grpc.BatchJobsServicer):
    """`gate` is the data plane's (None: no tenant is counted, as with auth off); `caps`
    apply to every tenant whose tenants-file entry does not override them, and to the
    unauthenticated port's callers as one tenant."""

    def __init__(
        self,
        plane: DataPlane,
        store: BatchStore,
        *,
        gate: AccessGate | None = None,
        caps: BatchCaps | None = None,
        submit_timeout_s: float = DEFAULT_SUBMIT_TIMEOUT_S,
        clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self._plane = plane
        self._store = store
        self._gate = gate
        self._caps = caps or BatchCaps()
        self._submit_timeout_s = submit_timeout_s
        self._clock_ns = clock_ns

    @grpc_method
    async def Submit(self, request_iterator, context):  # type: ignore[no-untyped-def]
        chunks: AsyncIterator[batch_pb2.SubmitChunk] = messages(request_iterator).__aiter__()
        try:
            first = await chunks.__anext__()
        except StopAsyncIteration:
            raise invalid("a job needs at least one chunk naming its model") from None
        caller = caller_of(context)
        return await self._plane.audited(
            caller,
            "batch.submit",
            first.model,
            lambda: self._submit(context, caller, first, chunks),
        )

    async def _submit(
        self,
        context: grpc.aio.ServicerContext,
        caller: Caller,
        first: batch_pb2.SubmitChunk,
        chunks: AsyncIterator[batch_pb2.SubmitChunk],
    ) -> batch_pb2.BatchJob:
        tenant = self._plane.authorize(caller, first.model)
        cfg = self._plane.find(first.model)
        if cfg.generation is not None:
            raise invalid(
                f"model '{cfg.name}' generates text: batch jobs take models that answer in one "
                "pass; send its prompts with ModelInfer or ModelStreamInfer"
            )
        # "" = as online: the tier's variant, else the model's default (router/batch_feeder.py).
        variant = variant_of(cfg, first.variant) if first.variant else ""
        timeout_s = self._submit_timeout_s
        if caller.time_remaining_s is not None:
            timeout_s = min(timeout_s, caller.time_remaining_s)
        # The tenant's quota before anything is stored, as for ModelInfer: every Submit
        # takes a token, and an in-flight slot while its inputs arrive.
        held = (
            self._gate.hold(tenant, uuid.uuid4().hex, self._clock_ns() + int(timeout_s * 1e9))
            if self._gate is not None
            else nullcontext()
        )
        async with held:
            deadline = asyncio.timeout(timeout_s)
            try:
                async with deadline:
                    job = await self._load(context, cfg, variant, tenant, first, chunks)
            except TimeoutError:
                if not deadline.expired():
                    raise
                raise deadline_exceeded(
                    f"a batch job's inputs must all arrive within {timeout_s:g} s"
                ) from None
        return to_proto(job)

    async def _load(
        self,
        context: grpc.aio.ServicerContext,
        cfg: ModelConfig,
        variant: str,
        tenant: Tenant | None,
        first: batch_pb2.SubmitChunk,
        chunks: AsyncIterator[batch_pb2.SubmitChunk],
    ) -> JobRecord:
        """A new job of the chunks' inputs, sealed; deleted again unless this returns."""
        owner = tenant.name if tenant else ""
        caps = tenant_caps(self._caps, tenant)
        job = await self._store.create(
            owner,
            cfg.name,
            variant,
            max_open=caps.max_open_jobs,
            loading_ttl_ms=int((self._submit_timeout_s + LOADING_SLACK_S) * 1000),
        )
        if job is None:
            raise open_jobs_refused(owner, caps.max_open_jobs)
        try:
            budget = JobBudget(caps)
            chunk: batch_pb2.SubmitChunk | None = first
            while chunk is not None:
                if await self._store.append(job.job_id, await _inputs(cfg, chunk, budget)) < 0:
                    raise _ended_meanwhile()
                chunk = await anext(chunks, None)
            await _client_waits(context)
            sealed = await self._store.seal(job.job_id, owner)
            if sealed is None:
                raise _ended_meanwhile()
            return sealed
        except BaseException:
            await self._discard(job.job_id, owner)
            raise

    async def _discard(self, job_id: str, owner: str) -> None:
        """Delete the job of a Submit that did not end well; a cancellation cannot stop it
        (a second one leaves it running on its own). Should Redis fail, the keys expire."""
        try:
            await asyncio.shield(self._store.discard(job_id, owner))
        except (RedisError, OSError) as exc:
            log.warning("batch job of a failed submit left to expire", error=type(exc).__name__)

    async def _own(self, context: grpc.aio.ServicerContext, job_id: str, call: str) -> JobRecord:
        """The caller's job, or NOT_FOUND (unknown, or another tenant's); the call audited."""
        caller = caller_of(context)

        async def find() -> JobRecord:
            tenant = self._plane.authenticate(caller)
            job = await self._store.get(job_id) if job_id else None
            if job is None or (tenant is not None and job.tenant != tenant.name):
                raise not_found(f"no batch job '{shown(job_id)}'")
            return job

        return await self._plane.audited(caller, call, "", find, request_id=job_id)

    @grpc_method
    async def Status(self, request, context):  # type: ignore[no-untyped-def]
        return to_proto(await self._own(context, request.job_id, "batch.status"))

    @grpc_method
    async def Cancel(self, request, context):  # type: ignore[no-untyped-def]
        job = await self._own(context, request.job_id, "batch.cancel")
        if job.status in FINISHED:
            return to_proto(job)
        cfg = self._plane.config(job.model)
        streams = job_streams(cfg, job) if cfg is not None else []
        done = await self._store.cancel(job.job_id, streams)
        if done is None:
            raise not_found(f"no batch job '{shown(request.job_id)}'")
        return to_proto(done)

    async def Results(
        self, request: batch_pb2.ResultsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[batch_pb2.BatchResult]:
        """Streamed (an async generator, as the tracing interceptor wants): refusals end
        the stream with their status before the first result."""
        try:
            job = await self._own(context, request.job_id, "batch.results")
        except MeshError as err:
            fail_call(context, err.code, err.message)
            return
        end = job.total if not request.limit else min(job.total, request.start + request.limit)
        for start in range(request.start, end, RESULTS_PAGE):
            page = await self._store.results(job.job_id, start, min(RESULTS_PAGE, end - start))
            for _, payload in page:
                msg = batch_pb2.BatchResult()
                msg.ParseFromString(payload)
                yield msg
