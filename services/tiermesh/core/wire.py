"""Converters between the domain types and the internal tiermesh.v1 messages.

Only servicers, gRPC clients and stream codecs call these; domain code never sees a proto.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from tiermesh.core.controls import Controls
from tiermesh.core.errors import code_from_int, code_to_int
from tiermesh.core.jobs import GenerationRequest, Job, JobResult, Timing
from tiermesh.core.tensors import TensorData
from tiermesh.v1 import batch_pb2, job_pb2, tensor_pb2


def tensor_to_proto(t: TensorData) -> tensor_pb2.Tensor:
    return tensor_pb2.Tensor(name=t.name, datatype=t.datatype, shape=t.shape, raw=t.raw)


def tensor_from_proto(t: tensor_pb2.Tensor) -> TensorData:
    return TensorData(t.name, t.datatype, tuple(t.shape), t.raw)


# Decoding runs once per request on several hops: an empty field (no trace context, no
# annotations, no aux tensors, as most requests carry) costs a test, not a conversion
# (result_from_proto 13.6 -> 10.9 us with these, timeit).


def _tensors(field: Collection[tensor_pb2.Tensor]) -> tuple[TensorData, ...]:
    return tuple(map(tensor_from_proto, field)) if field else ()


def _mapping(field: Mapping[str, str]) -> dict[str, str]:
    return dict(field) if field else {}


def timing_to_proto(t: Timing) -> job_pb2.Timing:
    return job_pb2.Timing(
        received_ns=t.received_ns,
        routed_ns=t.routed_ns,
        dequeued_ns=t.dequeued_ns,
        batch_start_ns=t.batch_start_ns,
        batch_end_ns=t.batch_end_ns,
        postprocessed_ns=t.postprocessed_ns,
        delivered_ns=t.delivered_ns,
        enqueued_ns=t.enqueued_ns,
    )


def timing_from_proto(t: job_pb2.Timing) -> Timing:
    return Timing(
        received_ns=t.received_ns,
        routed_ns=t.routed_ns,
        dequeued_ns=t.dequeued_ns,
        batch_start_ns=t.batch_start_ns,
        batch_end_ns=t.batch_end_ns,
        postprocessed_ns=t.postprocessed_ns,
        delivered_ns=t.delivered_ns,
        enqueued_ns=t.enqueued_ns,
    )


def job_to_proto(job: Job) -> job_pb2.Job:
    return job_pb2.Job(
        request_id=job.request_id,
        client_request_id=job.client_request_id,
        tenant=job.tenant,
        model=job.model,
        version=job.version,
        variant=job.variant,
        priority=job.priority,
        bucket=job.bucket,
        tier=job.tier,
        deadline_ns=job.deadline_ns,
        gateway=job.gateway,
        inputs=[tensor_to_proto(t) for t in job.inputs],
        requested_outputs=job.requested_outputs,
        timing=timing_to_proto(job.timing),
        trace_context=dict(job.trace_context),
        annotations=dict(job.annotations),
        controls=job.controls.to_wire(),
        generation=generation_to_proto(job.generation) if job.generation else None,
    )


def generation_to_proto(g: GenerationRequest) -> job_pb2.Generation:
    return job_pb2.Generation(
        max_new_tokens=g.max_new_tokens,
        temperature=g.temperature,
        top_p=g.top_p,
        seed=g.seed,
        stop=g.stop,
        stream=g.stream,
        messages=[job_pb2.ChatMessage(role=r, content=c) for r, c in g.messages],
        raw_prompt=g.raw_prompt,
    )


def generation_from_proto(msg: job_pb2.Generation) -> GenerationRequest:
    return GenerationRequest(
        max_new_tokens=msg.max_new_tokens,
        temperature=msg.temperature,
        top_p=msg.top_p,
        seed=msg.seed,
        stop=tuple(msg.stop),
        stream=msg.stream,
        messages=tuple((m.role, m.content) for m in msg.messages),
        raw_prompt=msg.raw_prompt,
    )


def job_from_proto(msg: job_pb2.Job) -> Job:
    return Job(
        request_id=msg.request_id,
        client_request_id=msg.client_request_id,
        tenant=msg.tenant,
        model=msg.model,
        version=msg.version,
        variant=msg.variant,
        priority=msg.priority,
        bucket=msg.bucket,
        tier=msg.tier,
        deadline_ns=msg.deadline_ns,
        gateway=msg.gateway,
        inputs=tuple(map(tensor_from_proto, msg.inputs)),
        requested_outputs=tuple(msg.requested_outputs) if msg.requested_outputs else (),
        timing=timing_from_proto(msg.timing),
        trace_context=_mapping(msg.trace_context),
        annotations=_mapping(msg.annotations),
        controls=Controls.from_wire(msg.controls),
        generation=generation_from_proto(msg.generation) if msg.HasField("generation") else None,
    )


def encode_job(job: Job) -> bytes:
    return bytes(job_to_proto(job).SerializeToString())


def encode_batch_result(index: int, result: JobResult) -> bytes:
    """A batch job's stored result for input `index` (what the JobService streams back)."""
    msg = batch_pb2.BatchResult(
        index=index,
        code=code_to_int(result.code),
        message=result.message,
        outputs=[tensor_to_proto(t) for t in result.outputs],
    )
    data: bytes = msg.SerializeToString()
    return data


def decode_job(data: bytes) -> Job:
    msg = job_pb2.Job()
    msg.ParseFromString(data)
    return job_from_proto(msg)


def result_to_proto(r: JobResult) -> job_pb2.Result:
    return job_pb2.Result(
        request_id=r.request_id,
        client_request_id=r.client_request_id,
        model=r.model,
        version=r.version,
        gateway=r.gateway,
        code=code_to_int(r.code),
        message=r.message,
        outputs=[tensor_to_proto(t) for t in r.outputs],
        timing=timing_to_proto(r.timing),
        trace_context=dict(r.trace_context),
        tier=r.tier,
        priority=r.priority,
        bucket=r.bucket,
        batch_size=r.batch_size,
        annotations=dict(r.annotations),
        controls=r.controls.to_wire(),
        aux=[tensor_to_proto(t) for t in r.aux],
        variant=r.variant,
        worker=r.worker,
        partial=r.partial,
        text_offset=r.text_offset,
        batch_traceparent=r.batch_traceparent,
        direct=r.direct,
    )


def result_from_proto(msg: job_pb2.Result) -> JobResult:
    return JobResult(
        request_id=msg.request_id,
        client_request_id=msg.client_request_id,
        model=msg.model,
        version=msg.version,
        gateway=msg.gateway,
        code=code_from_int(msg.code),
        message=msg.message,
        outputs=_tensors(msg.outputs),
        timing=timing_from_proto(msg.timing),
        trace_context=_mapping(msg.trace_context),
        tier=msg.tier,
        priority=msg.priority,
        bucket=msg.bucket,
        batch_size=msg.batch_size,
        annotations=_mapping(msg.annotations),
        controls=Controls.from_wire(msg.controls),
        aux=_tensors(msg.aux),
        variant=msg.variant,
        worker=msg.worker,
        partial=msg.partial,
        text_offset=msg.text_offset,
        batch_traceparent=msg.batch_traceparent,
        direct=msg.direct,
    )
