"""The BatchJobs servicer on the public port (the batch-jobs door of the data plane):
submit a job's inputs, follow it, read its results, cancel it. Authenticated and validated
by the data plane like ModelInfer; a tenant sees only its own jobs (another tenant's job id
answers NOT_FOUND, as an unknown one does)."""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator

import grpc

from tiermesh.batch.plan import FINISHED, JobRecord, job_streams
from tiermesh.batch.store import BatchStore
from tiermesh.core.errors import MeshError, invalid, not_found, shown
from tiermesh.core.grpc_errors import fail_call, grpc_method
from tiermesh.core.jobs import Job
from tiermesh.core.repository import ModelConfig
from tiermesh.core.tensors import BYTES, TensorData
from tiermesh.core.wire import encode_job, tensor_from_proto
from tiermesh.gateway.decoding import messages
from tiermesh.gateway.plane import DataPlane
from tiermesh.gateway.requests import InferRequest, validate, variant_of
from tiermesh.gateway.servicer import caller_of
from tiermesh.v1 import batch_pb2, batch_pb2_grpc

# Results sent per Redis read while streaming them back.
RESULTS_PAGE = 512


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


class BatchJobsServicer(batch_pb2_grpc.BatchJobsServicer):
    def __init__(self, plane: DataPlane, store: BatchStore) -> None:
        self._plane = plane
        self._store = store

    @grpc_method
    async def Submit(self, request_iterator, context):  # type: ignore[no-untyped-def]
        chunks: AsyncIterator[batch_pb2.SubmitChunk] = messages(request_iterator).__aiter__()
        try:
            first = await chunks.__anext__()
        except StopAsyncIteration:
            raise invalid("a job needs at least one chunk naming its model") from None
        tenant = self._plane.authorize(caller_of(context), first.model)
        cfg = self._plane.find(first.model)
        if cfg.generation is not None:
            raise invalid(
                f"model '{cfg.name}' generates text: batch jobs take models that answer in one "
                "pass; send its prompts with ModelInfer or ModelStreamInfer"
            )
        # "" = as online: the tier's variant, else the model's default (batch/feeder.py).
        variant = variant_of(cfg, first.variant) if first.variant else ""
        job = await self._store.create(tenant.name if tenant else "", cfg.name, variant)
        chunk: batch_pb2.SubmitChunk | None = first
        while chunk is not None:
            await self._store.append(job.job_id, self._inputs(cfg, chunk))
            try:
                chunk = await chunks.__anext__()
            except StopAsyncIteration:
                chunk = None
        return to_proto(await self._store.seal(job.job_id))

    def _inputs(self, cfg: ModelConfig, chunk: batch_pb2.SubmitChunk) -> list[bytes]:
        """Each input validated like a ModelInfer request, stored as an internal Job."""
        out = []
        for text in chunk.texts:
            out.append(encode_job(Job("", cfg.name, (text_input(cfg, text),), "")))
        for item in chunk.items:
            tensors = tuple(tensor_from_proto(t) for t in item.inputs)
            validate(cfg, InferRequest(cfg.name, "", tensors))
            out.append(encode_job(Job("", cfg.name, tensors, "")))
        return out

    async def _own(self, context: grpc.aio.ServicerContext, job_id: str) -> JobRecord:
        """The caller's job, or NOT_FOUND (unknown, or another tenant's)."""
        tenant = self._plane.authenticate(caller_of(context))
        job = await self._store.get(job_id) if job_id else None
        if job is None or (tenant is not None and job.tenant != tenant.name):
            raise not_found(f"no batch job '{shown(job_id)}'")
        return job

    @grpc_method
    async def Status(self, request, context):  # type: ignore[no-untyped-def]
        return to_proto(await self._own(context, request.job_id))

    @grpc_method
    async def Cancel(self, request, context):  # type: ignore[no-untyped-def]
        job = await self._own(context, request.job_id)
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
            job = await self._own(context, request.job_id)
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
