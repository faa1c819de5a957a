"""A compiled load generator (bench/goload/main.go, grpc-go) for offering several times the
mesh's capacity where a Python client cannot: on this 2-core machine the tritonclient.aio
open loop lags by seconds near 2,000 req/s while the mesh sits mostly idle.

`run_load` builds the generator (cached, as the Go front door is built:
tiermesh/frontdoor/build.py) and runs it for one config. In an open loop every arrival of
a seeded Poisson schedule is sent on time from its own goroutine, whatever is outstanding
(no client cap, so no NOT_SENT records); `lag_ms` says how late each send began. In a
closed loop `concurrency` callers send back to back. Calls are spread over `connections`
gRPC connections, each up before the clock starts; a server's cap on calls at once a
connection (the mesh's: 1,024) holds further calls in the client, counted as latency, not
lag: give more connections where more calls than that are outstanding.

Measured on this 2-core machine against benchmarks/go_front_door's bare compiled servicer
(a Python one is the bottleneck first), one 64 B FP32 request, 2 s open loops, two runs
each: 5,000 req/s sent all 10,003 arrivals with 0.73-0.90 CPU s of the generator's own
(~0.4 core, 70-90 us a call), lag p50 0.2 ms / p99 1.1-3.5 ms; 10,000 req/s sent all
20,141 with 0.87-1.30 CPU s (0.45-0.65 core), lag p99 1.1-3.6 ms. Reading 20k records back
takes Python ~0.2 s after the run.

Records come back as the Python runner makes them (`Record`/`Outcome`/`Reply`), so
`tiermesh.bench.stats.figures(run.records, run.wall_s)` reads them unchanged. `start_s` is
an open-loop call's scheduled offset (a closed loop's: when it started); `latency_ms` is
measured from the actual send. Proto types stay in `infer_request`, where requests are
serialised.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from tritonclient.grpc import service_pb2
from tritonclient.utils import serialize_byte_tensor

from tiermesh.bench.calls import reply_of
from tiermesh.bench.records import OK, Outcome, Record
from tiermesh.bench.workload import RequestSpec
from tiermesh.core.v2_parameters import set_parameter
from tiermesh.frontdoor.build import FrontDoorUnavailable, build

SOURCES = Path(__file__).parent / "goload"
# Past duration + deadline: connecting, encoding the records, the process's start and end.
MARGIN_S = 30.0


class LoadUnavailable(FrontDoorUnavailable):
    """The Go toolchain is missing, the build failed or the generator failed to run."""


@dataclass(frozen=True, slots=True)
class LoadRequest:
    """One serialised `inference.ModelInferRequest` and the labels its records carry."""

    data: bytes
    length: str = ""
    priority: int = 0


@dataclass(frozen=True, slots=True)
class LoadConfig:
    """One run. `rate_rps` is for mode "open" (Poisson arrivals, seeded by `seed`),
    `concurrency` for "closed"; `order` "cycle" takes the requests in turn, "random" at
    random by `seed`. `deadline_ms` is each call's gRPC deadline; `metadata` goes on every
    call; `step` is copied into the records. `honour_retry_after` (closed): a caller whose
    call was refused with a retry-after waits that long before its next call, as a client
    with gRPC's retry pushback does; without it, it calls again at once."""

    target: str
    requests: Sequence[LoadRequest]
    duration_s: float
    deadline_ms: float
    mode: Literal["open", "closed"] = "open"
    rate_rps: float = 0.0
    concurrency: int = 0
    seed: int = 0
    order: Literal["cycle", "random"] = "cycle"
    metadata: Mapping[str, str] = field(default_factory=dict)
    connections: int = 4
    step: int = 0
    honour_retry_after: bool = False

    def as_json(self) -> bytes:
        """The generator's stdin."""
        return json.dumps(
            {
                "target": self.target,
                "requests": [base64.b64encode(r.data).decode() for r in self.requests],
                "order": self.order,
                "mode": self.mode,
                "rate_rps": self.rate_rps,
                "concurrency": self.concurrency,
                "duration_s": self.duration_s,
                "seed": self.seed,
                "deadline_ms": self.deadline_ms,
                "metadata": dict(self.metadata),
                "connections": self.connections,
                "honour_retry_after": self.honour_retry_after,
            }
        ).encode()


@dataclass(frozen=True, slots=True)
class LoadRun:
    """What one run left: its records in start order, the generator's own CPU seconds
    (user + sys, getrusage, connecting included) and the wall seconds from the first
    scheduled send to the last reply."""

    records: list[Record]
    cpu_s: float
    wall_s: float


def infer_request(
    model: str, spec: RequestSpec, *, timeout_us: int | None = None, request_id: str = ""
) -> LoadRequest:
    """`spec` as the ModelInferRequest tritonclient would send (raw contents, `priority`
    and `timeout` parameters as it sets them), serialised."""
    request = service_pb2.ModelInferRequest(model_name=model, id=request_id)
    for tensor in spec.inputs:
        request.inputs.add(
            name=tensor.name, datatype=tensor.datatype, shape=list(tensor.array.shape)
        )
        if tensor.datatype == "BYTES":
            request.raw_input_contents.append(serialize_byte_tensor(tensor.array).item())
        else:
            request.raw_input_contents.append(tensor.array.tobytes())
    if spec.priority:
        request.parameters["priority"].uint64_param = spec.priority
    if timeout_us is not None:
        request.parameters["timeout"].int64_param = timeout_us
    for key, value in spec.parameters.items():
        set_parameter(request.parameters[key], value)
    return LoadRequest(bytes(request.SerializeToString()), spec.length, spec.priority)


def binary(cache_dir: Path) -> Path:
    """The generator, built into `cache_dir` unless there; LoadUnavailable when it cannot
    be."""
    try:
        return build(cache_dir, sources=SOURCES)
    except LoadUnavailable:
        raise
    except FrontDoorUnavailable as exc:
        raise LoadUnavailable(f"the Go load generator cannot be built: {exc}") from None


async def run_load(cache_dir: Path, config: LoadConfig) -> LoadRun:
    """Builds (once) and runs the generator for `config`, bounded by duration + deadline
    + MARGIN_S; LoadUnavailable when it cannot be built, fails or overruns. The build
    and the run are off the event loop, so a servicer in this process keeps serving."""
    path = await asyncio.to_thread(binary, cache_dir)
    proc = await asyncio.create_subprocess_exec(
        str(path),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    limit_s = config.duration_s + config.deadline_ms / 1e3 + MARGIN_S
    try:
        out, err = await asyncio.wait_for(proc.communicate(config.as_json()), limit_s)
    except TimeoutError:
        raise LoadUnavailable(f"the load generator ran past {limit_s:.0f} s") from None
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    if proc.returncode != 0:
        raise LoadUnavailable(
            f"the load generator exited {proc.returncode}: {err.decode(errors='replace')}"
        )
    return parse(out, config)


def parse(out: bytes, config: LoadConfig) -> LoadRun:
    """The generator's JSON lines (one a call, then its totals) as a LoadRun."""
    lines = out.splitlines()
    totals = json.loads(lines[-1])
    concurrency = config.concurrency if config.mode == "closed" else 0
    records = [_record(json.loads(line), config, concurrency) for line in lines[:-1]]
    return LoadRun(records, float(totals["cpu_s"]), float(totals["wall_s"]))


def _record(row: dict[str, Any], config: LoadConfig, concurrency: int) -> Record:
    request = config.requests[row["request"]]
    code = str(row["code"])
    reply = reply_of(row.get("params") or {}) if code == OK else None
    retry = row["retry_after_ms"]
    outcome = Outcome(
        code, float(row["latency_ms"]), reply, float(retry) if retry is not None else None
    )
    return Record(
        start_s=float(row["start_s"]),
        length=request.length,
        priority=request.priority,
        step=config.step,
        concurrency=concurrency,
        outcome=outcome,
        lag_ms=float(row["lag_ms"]),
    )
