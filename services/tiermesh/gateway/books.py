"""The gateway's books for the calls its Go front door answered itself (frontdoor/go,
books.go): ModelStatistics, the latency histograms, the rollout counts and output drift,
the cancellation mark of a caller who left, and traffic capture (the door samples its
calls at the share each reply gives it and sends those with their job). The door reports
them in batches on the internal port (books.proto); each entry is booked as the gateway
books a call it answered (dispatch.py), so the figures count every call on the public
port. The door counts its own `tiermesh_requests_total`; nothing here counts it again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from opentelemetry.trace import SpanContext, TraceFlags
from opentelemetry.trace.span import TraceState

from tiermesh.core.errors import code_from_int
from tiermesh.core.grpc_errors import grpc_method
from tiermesh.core.jobs import Job, JobResult
from tiermesh.core.repository import ModelRepository
from tiermesh.core.wire import job_from_proto, result_from_proto
from tiermesh.gateway.call_spans import call_span_of, call_status
from tiermesh.gateway.capture import Capture, Observed
from tiermesh.gateway.dispatch import Dispatcher
from tiermesh.gateway.facts import response_facts
from tiermesh.gateway.hop_spans import Hops, HopSpans
from tiermesh.gateway.upstream import Cancellations
from tiermesh.rollout.recorder import OutcomeRecorder
from tiermesh.v1 import books_pb2, books_pb2_grpc

# The SERVER span of a ModelInfer call, named and described as CallSpans does it.
MODEL_INFER, CALL_ATTRIBUTES = call_span_of("inference.GRPCInferenceService", "ModelInfer")


@dataclass(frozen=True, slots=True)
class Mirror:
    """The router mirrored a copy of a call to the canary as `shadow_request_id`."""

    shadow_request_id: str
    model: str
    deadline_ns: int


@dataclass(frozen=True, slots=True)
class DoorTrace:
    """A traced call's span ids as the door chose them, and where its job was placed."""

    trace_id: int
    span_id: int
    route_span_id: int
    parent_span_id: int  # 0: the trace starts at the door
    tracestate: str = ""
    stream: str = ""
    entry_id: str = ""
    route_began_ns: int = 0
    route_ended_ns: int = 0
    client_request_id: str = ""
    placed_here: bool = False  # the door queued the job itself, not the router


@dataclass(frozen=True, slots=True)
class DoorCall:
    """One call the front door answered or refused (books.proto, Entry)."""

    request_id: str
    model: str
    version: str  # as the caller named it ("" = the default)
    code: grpc.StatusCode
    received_ns: int
    ended_ns: int
    routed: bool = False
    routed_version: str = ""
    shadow_request_id: str = ""
    result: JobResult | None = None
    caller_left: bool = False
    ms_left: int = 0
    job: Job | None = None  # a call the door sampled for traffic capture
    trace: DoorTrace | None = None  # a traced call: its spans are written here


@dataclass(frozen=True, slots=True)
class DoorRefusals:
    """Calls the door ended without placing them, counted together (books.proto, Refused)."""

    model: str
    version: str  # as the callers named it ("" = the default)
    count: int
    total_ns: int


class DoorBooks:
    """Books what the door reports; owned by the gateway's __main__."""

    def __init__(
        self,
        repo: ModelRepository,
        dispatcher: Dispatcher,
        cancellations: Cancellations,
        recorder: OutcomeRecorder | None,
        capture: Capture | None = None,
        hop_spans: HopSpans | None = None,
    ) -> None:
        self._repo = repo
        self._dispatch = dispatcher
        self._cancellations = cancellations
        self._recorder = recorder
        self._capture = capture
        self._hop_spans = hop_spans

    def capture_rate(self) -> float:
        """The share of its calls the door is to send with their job (capture on)."""
        return self._capture.rate_now() if self._capture is not None else 0.0

    async def record(
        self,
        mirrors: Iterable[Mirror],
        calls: Sequence[DoorCall],
        shadows: Iterable[JobResult],
        refused: Sequence[DoorRefusals] = (),
    ) -> int:
        """Book the mirrored copies first (a call's or a canary's answer pairs with them),
        then each call and each canary answer; the callers who left are marked, all marks
        at once. Returns how many calls were booked."""
        recorder = self._recorder
        if recorder is not None:
            for m in mirrors:
                recorder.mirrored(m.shadow_request_id, m.model, m.deadline_ns)
        for call in calls:
            self._book(call)
        for r in refused:
            if (cfg := self._repo.get(r.model)) is not None:  # as _book books a failed call
                version = cfg.version_for(r.version)
                self._dispatch.statistics.failed_many(cfg.name, version, r.count, r.total_ns)
        if recorder is not None:
            for result in shadows:
                recorder.shadow(result)
        left = [c for c in calls if c.caller_left]
        if left:
            await asyncio.gather(*(self._cancellations.mark(c.request_id, c.ms_left) for c in left))
        return len(calls) + sum(r.count for r in refused)

    def _book(self, call: DoorCall) -> None:
        result = call.result
        if call.job is not None and self._capture is not None:  # sampled at the door
            self._capture.keep(
                Observed(
                    call.request_id,
                    call.model,
                    "",
                    call.code.name,
                    call.received_ns,
                    call.ended_ns,
                    call.job,
                    result,
                )
            )
        if call.trace is not None and self._hop_spans is not None:
            self._spans(call, call.trace, self._hop_spans)
        if call.code == grpc.StatusCode.OK and result is not None:
            self._dispatch.computed(result, call.ended_ns)
        else:
            cfg = self._repo.get(call.model)
            if cfg is not None:  # as plane.py books a call that ended without an answer
                version = cfg.version_for(call.version)
                statistics = self._dispatch.statistics
                statistics.failed(cfg.name, version, call.received_ns, call.ended_ns)
        recorder = self._recorder
        if recorder is None or not call.routed:
            return
        version = (result.version if result is not None else "") or call.routed_version
        recorder.answered(call.model, version, call.code, call.received_ns, call.ended_ns)
        if call.shadow_request_id and result is not None:
            recorder.primary(call.shadow_request_id, result)

    @staticmethod
    def _spans(call: DoorCall, t: DoorTrace, spans: HopSpans) -> None:
        """The call's SERVER span, as CallSpans and the data plane write the gateway's own
        (rpc.* attributes, status, request ids, the response's facts), and its hop spans."""
        flags = TraceFlags(TraceFlags.SAMPLED)
        state = TraceState.from_header([t.tracestate]) if t.tracestate else None
        root = SpanContext(t.trace_id, t.span_id, False, flags, state)
        route = SpanContext(t.trace_id, t.route_span_id, False, flags, state)
        parent = (
            SpanContext(t.trace_id, t.parent_span_id, True, flags, state)
            if t.parent_span_id
            else None
        )
        hops = Hops(root, route, spans)
        result = call.result
        attributes: dict[str, Any] = {
            **CALL_ATTRIBUTES,
            "rpc.grpc.status_code": call.code.value[0],
            "tiermesh.request_id": call.request_id,
            "tiermesh.client_request_id": t.client_request_id,
        }
        if call.code == grpc.StatusCode.OK and result is not None:
            attributes.update(response_facts(result, call.ended_ns))
        status = call_status(call.code, result.message if result else "")
        spans.served(MODEL_INFER, hops, parent, call.received_ns, call.ended_ns, attributes, status)
        if call.routed:
            placed = hops.placed(
                t.stream, t.entry_id, t.route_began_ns, t.route_ended_ns, t.placed_here
            )
            placed.write(result)


def door_trace(msg: books_pb2.Trace) -> DoorTrace:
    return DoorTrace(
        trace_id=int.from_bytes(msg.trace_id, "big"),
        span_id=msg.span_id,
        route_span_id=msg.route_span_id,
        parent_span_id=msg.parent_span_id,
        tracestate=msg.tracestate,
        stream=msg.stream,
        entry_id=msg.entry_id,
        route_began_ns=msg.route_began_ns,
        route_ended_ns=msg.route_ended_ns,
        client_request_id=msg.client_request_id,
        placed_here=msg.placed_here,
    )


def door_call(entry: books_pb2.Entry) -> DoorCall:
    """The domain form of one reported call."""
    return DoorCall(
        request_id=entry.request_id,
        model=entry.model,
        version=entry.version,
        code=code_from_int(entry.code),
        received_ns=entry.received_ns,
        ended_ns=entry.ended_ns,
        routed=entry.routed,
        routed_version=entry.routed_version,
        shadow_request_id=entry.shadow_request_id,
        result=result_from_proto(entry.result) if entry.HasField("result") else None,
        caller_left=entry.caller_left,
        ms_left=entry.ms_left,
        job=job_from_proto(entry.job) if entry.HasField("job") else None,
        trace=door_trace(entry.trace) if entry.HasField("trace") else None,
    )


class BooksServicer(books_pb2_grpc.BooksServicer):
    """The front door's Record calls, on the gateway's internal port."""

    def __init__(self, books: DoorBooks) -> None:
        self._books = books

    @grpc_method
    async def Record(self, request, context):  # type: ignore[no-untyped-def]
        mirrors = [Mirror(m.shadow_request_id, m.model, m.deadline_ns) for m in request.mirrored]
        calls = [door_call(entry) for entry in request.entries]
        shadows = [result_from_proto(msg) for msg in request.shadows]
        refused = [DoorRefusals(r.model, r.version, r.count, r.total_ns) for r in request.refused]
        booked = await self._books.record(mirrors, calls, shadows, refused)
        return books_pb2.Recorded(entries=booked, capture_rate=self._books.capture_rate())
