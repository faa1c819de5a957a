"""The Postprocess servicer: a whole batch in (a message on a worker's ProcessStream, or a
unary Process call), output steps, delivery per gateway, then the batch's reply."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable

import grpc
import structlog

from tiermesh.core.call_stream import StreamServing
from tiermesh.core.delivery_client import GatewayClients
from tiermesh.core.grpc_errors import grpc_method
from tiermesh.core.jobs import JobResult
from tiermesh.core.output_steps import OutputSteps
from tiermesh.core.repository import ModelRepository, RepositoryError
from tiermesh.core.wire import result_from_proto
from tiermesh.postprocess.metrics import PostprocessMetrics
from tiermesh.v1 import postprocess_pb2, postprocess_pb2_grpc

log = structlog.get_logger("tiermesh.postprocess")


class PostprocessServicer(postprocess_pb2_grpc.PostprocessServicer):
    def __init__(
        self,
        steps: OutputSteps,
        gateways: GatewayClients,
        metrics: PostprocessMetrics | None = None,
        clock_ns: Callable[[], int] = time.time_ns,
        repo: ModelRepository | None = None,
    ) -> None:
        self._repo = repo
        self._tried: set[str] = set()
        self._metrics = metrics
        self._steps = steps
        self._gateways = gateways
        self._clock_ns = clock_ns
        self._streams = StreamServing("postprocess")

    def drain(self) -> None:
        """At stop: each worker's stream ends once the batches it brought are delivered."""
        self._streams.drain()

    async def ProcessStream(
        self,
        request_iterator: AsyncIterator[postprocess_pb2.ResultBatch],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[postprocess_pb2.ProcessReply]:
        async for reply in self._streams.serve(request_iterator, self._process, context):
            yield reply

    @grpc_method
    async def Process(self, request, context):  # type: ignore[no-untyped-def]
        return await self._process(request)

    async def _process(self, request: postprocess_pb2.ResultBatch) -> postprocess_pb2.ProcessReply:
        await self._know({msg.model for msg in request.results})
        done = self._postprocess([result_from_proto(msg) for msg in request.results])
        outcome = await self._gateways.deliver_all(done)
        outcome.count(self._metrics.deliveries if self._metrics is not None else None)
        return postprocess_pb2.ProcessReply(
            delivered=outcome.delivered, undeliverable=outcome.undeliverable
        )

    async def _know(self, models: set[str]) -> None:
        """Re-read the repository once for a model it did not hold when read (one loaded
        through model control after the start), so its output step applies."""
        new = models - self._steps.models - self._tried
        if not new or self._repo is None:
            return
        self._tried |= new
        try:
            await asyncio.to_thread(self._repo.load)
        except (RepositoryError, OSError) as exc:
            log.error("model repository not re-read", problem=str(exc))
            return
        self._steps = OutputSteps.for_models(self._repo.configs)
        log.info("model repository re-read", new_models=sorted(new & self._steps.models))

    def _postprocess(self, results: list[JobResult]) -> list[JobResult]:
        """Every result's output step, the results of one model together. A traced
        request's postprocess span is its gateway's, from its timing."""
        start = self._clock_ns()
        done = [self._steps.apply(r) for r in results]
        end = self._clock_ns()
        if self._metrics is not None and done:
            per_result_s = (end - start) / 1e9 / len(done)
            for model, n in Counter(r.model for r in done).items():
                child = self._metrics.step.labels(model)
                for _ in range(n):
                    child.observe(per_result_s)
        return [r.with_(timing=r.timing.with_(postprocessed_ns=end)) for r in done]
