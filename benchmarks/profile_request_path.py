"""Where the request path spends its CPU: every mesh process under py-spy at concurrency 32.

Starts the mesh as benchmarks/mesh_vs_raw.py does (`tiermesh up` on a private repository
holding minilm-l3, FP32 everywhere), warms it, then drives the 70/25/5 mix closed-loop
(text requests, tokenized by the router, unless --ids) while `py-spy record` samples the
gateway, router, worker and postprocess for --seconds. Per process it writes the top frames
by own time and by total time (the share of samples a function is on the stack) as text,
into --out (default benchmarks/profile/), one file per process plus summary.txt.

    .venv/bin/python benchmarks/profile_request_path.py [--seconds 20] [--ids] [--out DIR]

py-spy needs ptrace rights over the children (root, or kernel.yama.ptrace_scope 0). The
onnxruntime threads show as native frames with --native; without it their time shows as
the Python line that called session.run. All traffic goes to 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import tritonclient.grpc.aio as grpcaio

sys.path.insert(0, str(Path(__file__).resolve().parent))

import mesh_vs_raw as mvr

from tiermesh.bench import runner
from tiermesh.bench.calls import Sender
from tiermesh.bench.workload import RequestSpec
from tiermesh.core.model_files import mirror_model
from tiermesh.up.processes import free_port
from tiermesh.up.supervisor import Mesh, UpOptions

PROFILED = ("gateway", "router", "worker", "postprocess")
TOP = 25


def py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(found).exists():
        raise SystemExit("py-spy not found: .venv/bin/pip install py-spy (make .venv installs it)")
    return found


def top_frames(collapsed: str) -> tuple[int, list[tuple[str, int]], list[tuple[str, int]]]:
    """(samples, top by own samples, top by samples on the stack) of py-spy's raw format:
    one line per distinct stack, `frame;frame;...;leaf COUNT`."""
    own: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    samples = 0
    for line in collapsed.splitlines():
        stack, _, count_s = line.rpartition(" ")
        if not stack or not count_s.isdigit():
            continue
        count = int(count_s)
        samples += count
        frames = [_short(f) for f in stack.split(";")]
        if not frames:
            continue
        own[frames[-1]] += count
        for f in set(frames):
            total[f] += count
    return samples, own.most_common(TOP), total.most_common(TOP)


def _short(frame: str) -> str:
    """`function (path/to/module.py:line)` with the path cut to the package."""
    for cut in ("site-packages/", "services/", "lib/python3"):
        i = frame.find(cut)
        if i >= 0:
            j = frame.rfind("(", 0, i)
            return frame[: j + 1] + frame[i + len(cut) :]
    return frame


def render(name: str, samples: int, own: list[tuple[str, int]], tot: list[tuple[str, int]]) -> str:
    lines = [f"== {name}: {samples} samples", "-- own time (leaf frames)"]
    lines += [f"{100 * c / max(samples, 1):6.1f}%  {f}" for f, c in own]
    lines.append("-- total time (on the stack)")
    lines += [f"{100 * c / max(samples, 1):6.1f}%  {f}" for f, c in tot]
    return "\n".join(lines)


def service_pids(mesh: Mesh) -> dict[str, int]:
    """The profiled services' pids, by name (`worker`, `worker-2`, ... for replicas)."""
    out: dict[str, int] = {}
    for s in mesh.services:
        if s.name in PROFILED:
            name, k = s.name, 2
            while name in out:
                name, k = f"{s.name}-{k}", k + 1
            out[name] = s.proc.pid
    return out


async def drive(
    client: grpcaio.InferenceServerClient, model: str, specs: list[RequestSpec], seconds: float
) -> tuple[int, float]:
    send = Sender(client, model, mvr.TIMEOUT_S)
    rec = runner.RunRecorder()

    def cycle() -> Iterator[RequestSpec]:
        while True:
            yield from specs

    t0 = time.perf_counter()
    await runner.closed_loop(
        send, cycle(), rec, concurrency=32, limit=10**9, until=rec.clock() + seconds
    )
    return sum(r.ok for r in rec.records), time.perf_counter() - t0


async def run(args: argparse.Namespace) -> int:
    spy = py_spy()
    inputs = mvr.make_inputs(0, 1000, mvr.MIXES[args.mix])
    if args.ids:
        model = mvr.IDS_MODEL
        specs = [mvr.spec_ids(i, n, ids) for i, (n, _, ids) in enumerate(inputs)]
    else:
        model = mvr.MODEL
        specs = [mvr.spec_text(i, n, t) for i, (n, t, _) in enumerate(inputs)]
    args.out.mkdir(parents=True, exist_ok=True)
    # --traced: every call sampled, its spans exported to this script's OTLP sink
    sink = await mvr.OtlpSink.start() if args.traced else None
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": sink.endpoint} if sink is not None else {}
    with tempfile.TemporaryDirectory(prefix="tiermesh-profile-") as tmp:
        repo = mirror_model(
            mvr.REPO_ROOT / "models" / mvr.MODEL, Path(tmp) / "models", mvr.fp32_up_to_256
        )
        port = free_port()
        mesh = Mesh(
            UpOptions(
                port=port,
                data_dir=Path(tmp) / "data",
                model_repository=repo,
                http_port=0,
                metrics_port=0,
                grace_s=5.0,
                extra_env=env,
            )
        )
        mesh.start()
        client = grpcaio.InferenceServerClient(f"127.0.0.1:{port}")
        try:
            await drive(client, model, specs, 3.0)  # warm: sessions, connections, caches
            pids = service_pids(mesh)
            spies = {
                name: await asyncio.create_subprocess_exec(
                    *[
                        spy,
                        "record",
                        "--pid",
                        str(pid),
                        "--duration",
                        str(int(args.seconds)),
                        "--rate",
                        str(args.rate),
                        "--format",
                        "raw",
                        "--nonblocking",
                        *(["--native"] if args.native else []),
                        *(["--gil"] if args.gil else []),
                        "--output",
                        str(Path(tmp) / f"{name}.txt"),
                    ],
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=asyncio.subprocess.PIPE,
                )
                for name, pid in pids.items()
            }
            ok, wall = await drive(client, model, specs, args.seconds)
            for name, proc in spies.items():
                _, err = await asyncio.wait_for(proc.communicate(), args.seconds + 60)
                if proc.returncode != 0:
                    print(f"py-spy on {name} failed: {err.decode().strip()}", file=sys.stderr)
        finally:
            await client.close()
            mesh.stop()
            if sink is not None:
                await sink.stop()
        parts = [
            f"profile_request_path {time.strftime('%Y-%m-%d %H:%M')} commit {mvr.git_commit()}: "
            f"{model} at concurrency 32, {ok} answers in {wall:.1f} s ({ok / wall:.0f} req/s), "
            f"py-spy at {args.rate} Hz{', every call traced' if args.traced else ''}; shares are "
            "of each process's samples"
        ]
        for name in pids:
            path = Path(tmp) / f"{name}.txt"
            if not path.exists():
                continue
            text = render(name, *top_frames(path.read_text()))
            (args.out / f"{name}.txt").write_text(text + "\n")
            parts.append(text)
    summary = "\n\n".join(parts)
    (args.out / "summary.txt").write_text(summary + "\n")
    print(summary)
    return 0


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--seconds", type=int, default=20)
    p.add_argument("--mix", choices=sorted(mvr.MIXES), default="default", help="as mesh_vs_raw.py")
    p.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    p.add_argument("--ids", action="store_true", help="pre-tokenized ids instead of text")
    p.add_argument("--native", action="store_true", help="include native frames")
    p.add_argument(
        "--gil",
        action="store_true",
        help="only samples of the thread holding the GIL: where Python code spends CPU "
        "(without it, a thread waiting in grpc's poller or a lock can count too)",
    )
    p.add_argument(
        "--traced",
        action="store_true",
        help="every call traced, spans exported over OTLP to a sink this script runs",
    )
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "profile")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    return asyncio.run(run(parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
