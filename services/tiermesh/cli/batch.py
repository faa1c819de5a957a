"""`tiermesh batch submit|status|results|cancel`: argument parsing, the BatchJobs calls
and printing; the decisions (ETA, summary, p99) are tiermesh.batch.plan."""

from __future__ import annotations

import argparse
import json
import struct
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from tiermesh.batch.plan import (
    FINISHED,
    JobRecord,
    bucket_delta,
    eta_s,
    histogram_buckets,
    histogram_quantile,
    summary,
)
from tiermesh.cli.args import (
    Subcommands,
    add_variant_arg,
    existing_file,
    http_url,
    nonempty,
    old_spelling,
    positive_float,
)
from tiermesh.cli.endpoint import add_endpoint_args, endpoint_of
from tiermesh.cli.errors import UsageError
from tiermesh.core.tensors import BYTES, TensorData, split_bytes, to_numpy
from tiermesh.core.wire import tensor_from_proto, tensor_to_proto
from tiermesh.v1 import batch_pb2, batch_pb2_grpc

CHUNK = 1000  # inputs per Submit message
ONLINE_HISTOGRAM = "tiermesh_request_duration_seconds"


def _stub(args: argparse.Namespace) -> tuple[batch_pb2_grpc.BatchJobsStub, list[tuple[str, str]]]:
    """The BatchJobs stub the endpoint options describe (TLS, client certificate, API key)
    and the metadata every call sends."""
    end = endpoint_of(args)
    if end.secure:
        credentials = grpc.ssl_channel_credentials(
            root_certificates=end.ca_file.read_bytes() if end.ca_file else None,
            private_key=end.key_file.read_bytes() if end.key_file else None,
            certificate_chain=end.cert_file.read_bytes() if end.cert_file else None,
        )
        channel = grpc.secure_channel(end.url, credentials)
    else:
        channel = grpc.insecure_channel(end.url)
    return batch_pb2_grpc.BatchJobsStub(channel), (
        [("authorization", f"Bearer {end.api_key}")] if end.api_key else []
    )


def _record(msg: batch_pb2.BatchJob) -> JobRecord:
    return JobRecord(
        msg.job_id, msg.tenant, msg.model, "", msg.status, msg.total, msg.fed, msg.done,
        msg.errors, msg.created_ms, msg.finished_ms, msg.tier,
    )  # fmt: skip


def read_inputs(path: Path) -> Iterator[tuple[str | None, dict[str, Any] | None]]:
    """(text, None) or (None, tensors) per JSONL line: {"text": ...} or {"inputs": {NAME:
    {"datatype": ..., "shape": [...], "data": [...]}}}. UsageError names a bad line."""
    with path.open() as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                doc = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UsageError(f"{path}:{n}: not JSON: {exc}") from None
            if not isinstance(doc, dict):
                raise UsageError(f"{path}:{n}: a line needs 'text' or 'inputs'")
            if "text" in doc:
                yield str(doc["text"]), None
            elif "inputs" in doc:
                yield None, doc["inputs"]
            else:
                raise UsageError(f"{path}:{n}: a line needs 'text' or 'inputs'")


def _tensor(name: str, spec: dict[str, Any]) -> TensorData:
    dtype, shape = str(spec["datatype"]), tuple(int(d) for d in spec["shape"])
    if dtype == BYTES:
        raw = b"".join(
            struct.pack("<I", len(b)) + b for b in (str(x).encode() for x in spec["data"])
        )
    else:
        raw = np.asarray(spec["data"], dtype=_NP[dtype]).reshape(shape).tobytes()
    return TensorData(name, dtype, shape, raw)


_NP = {"FP32": np.float32, "FP64": np.float64, "INT64": np.int64, "INT32": np.int32,
       "FP16": np.float16, "INT8": np.int8, "UINT8": np.uint8, "BOOL": np.bool_}  # fmt: skip


def check_inputs(path: Path) -> int:
    """Read the whole file once before anything is sent: a bad line stops the submission
    with its line number (raised inside the streaming call it would hang it). The count."""
    n = 0
    for n, (_, tensors) in enumerate(read_inputs(path), 1):
        for name, spec in (tensors or {}).items():
            try:
                _tensor(name, spec)
            except (KeyError, TypeError, ValueError) as exc:
                raise UsageError(f"{path}: input {n}: tensor {name!r}: {exc!r}") from None
    if n == 0:
        raise UsageError(f"{path}: no inputs")
    return n


def _chunks(args: argparse.Namespace) -> Iterator[batch_pb2.SubmitChunk]:
    chunk = batch_pb2.SubmitChunk(model=args.model, variant=args.variant)
    n = 0
    for text, tensors in read_inputs(Path(args.input)):
        if text is not None:
            chunk.texts.append(text)
        else:
            assert tensors is not None
            item = chunk.items.add()
            item.inputs.extend(tensor_to_proto(_tensor(k, v)) for k, v in tensors.items())
        n += 1
        if n % CHUNK == 0:
            yield chunk
            chunk = batch_pb2.SubmitChunk()
    yield chunk


def _scrape(url: str) -> dict[float, float]:
    if not url:
        return {}
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return histogram_buckets(r.read().decode(), ONLINE_HISTOGRAM)
    except OSError:
        return {}


def follow(stub: Any, meta: list[tuple[str, str]], job_id: str, interval_s: float) -> JobRecord:
    """A progress bar until the job finishes; ETA from the measured drain rate."""
    from tqdm import tqdm

    job = _record(stub.Status(batch_pb2.JobRef(job_id=job_id), metadata=meta))
    bar = tqdm(total=job.total, initial=job.finished, unit="seq", file=sys.stderr)
    rate, last, last_t = 0.0, job.finished, time.monotonic()
    while job.status not in FINISHED:
        time.sleep(interval_s)
        job = _record(stub.Status(batch_pb2.JobRef(job_id=job_id), metadata=meta))
        now = time.monotonic()
        step = (job.finished - last) / max(now - last_t, 1e-6)
        rate = step if rate == 0 else 0.3 * step + 0.7 * rate
        bar.update(job.finished - last)
        last, last_t = job.finished, now
        eta = eta_s(job, rate)
        bar.set_postfix(rate=f"{rate:.0f}/s", eta="?" if eta is None else f"{eta:.0f}s")
    bar.close()
    return job


def _print_summary(job: JobRecord, p99_s: float | None) -> None:
    s = summary(job, int(time.time() * 1000))
    line = {
        "job": job.job_id, "status": job.status, "inputs": s.inputs, "errors": s.errors,
        "wall_s": round(s.wall_s, 2), "sequences_per_hour": round(s.per_hour),
    }  # fmt: skip
    if p99_s is not None:
        line["online_p99_ms"] = round(p99_s * 1000, 2)
    print(json.dumps(line))


def cmd_batch(args: argparse.Namespace) -> int:
    """The inputs are read before anything is sent; a failed call raises grpc.RpcError
    (the CLI's error line)."""
    if args.action == "submit":
        check_inputs(args.input)
    stub, meta = _stub(args)
    if args.action == "submit":
        before = _scrape(args.metrics_url)
        reply = stub.Submit(_chunks(args), metadata=meta)
        print(reply.job_id)
        if args.wait:
            job = follow(stub, meta, reply.job_id, args.interval_s)
            delta = bucket_delta(before, _scrape(args.metrics_url)) if before else {}
            _print_summary(job, histogram_quantile(0.99, delta) if delta else None)
        return 0
    ref = batch_pb2.JobRef(job_id=args.job)
    if args.action == "status":
        if args.wait:
            _print_summary(follow(stub, meta, args.job, args.interval_s), None)
        else:
            _print_summary(_record(stub.Status(ref, metadata=meta)), None)
    elif args.action == "cancel":
        print(json.dumps({"job": args.job, "status": stub.Cancel(ref, metadata=meta).status}))
    else:
        write_results(stub, meta, args.job, Path(args.out) if args.out else None)
    return 0


def _decoded(t: TensorData) -> Any:
    if t.datatype == BYTES:
        n = int(np.prod(t.shape)) if t.shape else 1
        return [b.decode(errors="replace") for b in split_bytes(t.raw, n, t.name)]
    return to_numpy(t).tolist()


def write_results(stub: Any, meta: list[tuple[str, str]], job_id: str, out: Path | None) -> None:
    """JSONL (stdout or a .jsonl file): one line per input; .npy: the first output of every
    input stacked in index order (numeric outputs)."""
    results = stub.Results(batch_pb2.ResultsRequest(job_id=job_id), metadata=meta)
    if out is not None and out.suffix == ".npy":
        rows = [to_numpy(tensor_from_proto(r.outputs[0]))[0] for r in results if r.outputs]
        np.save(out, np.stack(rows))
        return
    f = out.open("w") if out is not None else sys.stdout
    try:
        for r in results:
            outputs = {t.name: _decoded(tensor_from_proto(t)) for t in r.outputs}
            line = {"index": r.index, "code": r.code, "message": r.message, "outputs": outputs}
            f.write(json.dumps(line) + "\n")
    finally:
        if out is not None:
            f.close()


def add_batch_parser(sub: Subcommands) -> None:
    p = sub.add_parser("batch", help="offline batch jobs: submit, status, results, cancel")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    submit = actions.add_parser("submit", help="submit a JSONL file of inputs")
    submit.add_argument("model", help="the model every input goes to")
    submit.add_argument(
        "input",
        type=existing_file,
        help='JSONL: {"text": ...} or {"inputs": {NAME: {...}}} per line',
    )
    add_variant_arg(submit)
    submit.add_argument("--wait", action="store_true", help="follow it to the end")
    submit.add_argument(
        "--metrics-url",
        type=http_url,
        default="",
        help="the gateway's /metrics, for the online p99 while the job ran (default: none)",
    )
    for name, text in (
        ("status", "a job's progress"),
        ("results", "a finished job's results"),
        ("cancel", "stop a job"),
    ):
        a = actions.add_parser(name, help=text)
        a.add_argument("job", type=nonempty, help="the job id `submit` printed")
        if name == "status":
            a.add_argument("--wait", action="store_true", help="follow it to the end")
        if name == "results":
            a.add_argument("--out", default="", help=".jsonl or .npy (default: JSONL on stdout)")
    for a in actions.choices.values():
        add_endpoint_args(a)
        interval = a.add_argument(
            "--interval-s", type=positive_float, default=0.5, help="progress poll, seconds"
        )
        old_spelling(a, "--interval", interval)
    p.set_defaults(func=cmd_batch)
