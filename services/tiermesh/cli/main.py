"""The `tiermesh` command: argument parsing and wiring only."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from tiermesh.cli.batch import add_batch_parser
from tiermesh.cli.bench import add_bench_parser
from tiermesh.cli.keys import add_keys_parser
from tiermesh.cli.optimize import add_optimize_parser
from tiermesh.cli.probe import add_probe_parser
from tiermesh.cli.profile import add_profile_parser
from tiermesh.cli.rollout import add_rollout_parser
from tiermesh.core.builtin_models import build_into
from tiermesh.core.repository import ModelRepository, RepositoryError

if TYPE_CHECKING:
    from tiermesh.cli.infer import Endpoint
    from tiermesh.up.tls import TlsFiles


def _repo_path(args: argparse.Namespace) -> Path:
    return Path(args.repository or os.environ.get("TIERMESH_MODEL_REPOSITORY", "models"))


def cmd_up(args: argparse.Namespace) -> int:
    from tiermesh.up.supervisor import UpOptions, run

    return run(
        UpOptions(
            host=args.host,
            port=args.port,
            redis_url=os.environ.get("TIERMESH_REDIS_URL", ""),
            data_dir=Path(args.data_dir),
            model_repository=_repo_path(args),
            grace_s=args.grace,
            metrics_port=args.metrics_port,
            http_port=args.http_port,
            model_control=args.model_control,
            trace_ui=os.environ.get("TIERMESH_TRACE_UI", "") not in ("", "0", "false"),
            tiers=tuple(t.strip() for t in args.tiers.split(",") if t.strip()),
            edge_threads=args.edge_threads,
            batch_pool=args.batch_pool,
            edge_link_ms=args.edge_link_ms,
            tls=_tls_files(args),
        )
    )


# `tiermesh up` TLS file -> where `--tls-dir` finds it (a DevCerts field; "": not there).
IN_TLS_DIR = {
    "tls_cert": "server_cert",
    "tls_key": "server_key",
    "tls_client_ca": "",
    "internal_tls_ca": "ca",
    "internal_tls_cert": "internal_cert",
    "internal_tls_key": "internal_key",
}


def _tls_files(args: argparse.Namespace) -> TlsFiles:
    """Each file: its flag, else what --tls-dir holds, else its TIERMESH_ variable (which
    the services would read anyway, so the supervisor must know it too)."""
    from tiermesh.up.certs import DevCerts
    from tiermesh.up.tls import ENV, TlsFiles

    in_dir = DevCerts.at(Path(args.tls_dir)) if args.tls_dir else None
    found: dict[str, Path | None] = {}
    for name, field in IN_TLS_DIR.items():
        value = getattr(args, name) or ""
        if not value and in_dir is not None and field:
            value = getattr(in_dir, field)
        value = value or os.environ.get(ENV[name], "")
        found[name] = Path(value) if value else None
    return TlsFiles(**found)


def cmd_certs(args: argparse.Namespace) -> int:
    from tiermesh.up.certs import write_dev_certs

    made = write_dev_certs(Path(args.directory), extra_names=args.name or [])
    print(
        f"wrote a CA and certificates for 127.0.0.1, ::1, localhost"
        f"{''.join(', ' + n for n in args.name or [])} into {args.directory}\n"
        f"  tiermesh up --tls-dir {args.directory}   "
        "(public TLS with server.pem, internal mTLS with internal.pem)\n"
        f"  clients trust {made.ca}"
    )
    return 0


def endpoint_of(args: argparse.Namespace) -> Endpoint:
    from tiermesh.cli.infer import Endpoint

    return Endpoint(
        url=args.url,
        api_key=args.api_key or os.environ.get("TIERMESH_API_KEY", ""),
        tls=args.tls,
        ca_file=args.tls_ca,
        cert_file=args.tls_client_cert,
        key_file=args.tls_client_key,
    )


def add_endpoint_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default="127.0.0.1:8001")
    p.add_argument(
        "--api-key",
        default="",
        help="tenant API key (default: $TIERMESH_API_KEY, kept out of history)",
    )
    p.add_argument("--tls", action="store_true", help="TLS with the system's trusted CAs")
    p.add_argument(
        "--tls-ca", type=Path, help="CA that signed the gateway's certificate (implies --tls)"
    )
    p.add_argument("--tls-client-cert", type=Path, help="client certificate, when the port asks")
    p.add_argument("--tls-client-key", type=Path, help="its private key")


def cmd_infer(args: argparse.Namespace) -> int:
    from tiermesh.cli.infer import infer

    texts = [*(args.texts or []), *(args.text or [])]
    answer = infer(
        endpoint_of(args),
        args.model,
        args.data,
        texts,
        args.timeout_us,
        args.priority,
        args.variant,
    )
    print(json.dumps(answer, indent=2))
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    from tiermesh.cli.generate import Ask, run

    ask = Ask(
        args.prompt, args.max_new_tokens, args.temperature, args.top_p, args.seed, tuple(args.stop)
    )
    return run(endpoint_of(args), args.model, ask, stream=not args.no_stream)


def cmd_similarity(args: argparse.Namespace) -> int:
    from tiermesh.cli.infer import similarity

    print(f"{similarity(endpoint_of(args), args.model, args.a, args.b, args.variant):.6f}")
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    """build: the built-in models; fetch: the real ones; both then verify what they made.
    verify: every model's checksums; list: what the repository holds."""
    root = _repo_path(args)
    made: list[str] | None = None
    try:
        if args.action == "build":
            made = [path.parent.parent.name for path in build_into(root)]
        elif args.action == "fetch":
            made = _fetch(root, args)
    except (ValueError, RuntimeError) as exc:
        print(f"tiermesh models {args.action}: {exc}", file=sys.stderr)
        return 1
    repo = ModelRepository(root)
    try:
        for name, cfg in repo.load().items():
            if made is not None and cfg.queue_model not in made:
                continue
            checked = args.action != "list"
            if checked:
                repo.checked_folder(name)
            versions = [v.version for v in cfg.versions]
            print(
                f"{name}: versions {versions}, variants {sorted(cfg.variants)}, "
                f"max_batch_size {cfg.max_batch_size}" + (" (sha256 ok)" if checked else "")
            )
    except RepositoryError as exc:
        print(f"tiermesh models: {exc}", file=sys.stderr)
        return 1
    return 0


def _fetch(root: Path, args: argparse.Namespace) -> list[str]:
    """Fetches the named models (all when none is named); returns the names fetched."""
    from tiermesh.convert import smollm2
    from tiermesh.convert.fetch import default_cache_dir
    from tiermesh.convert.minilm import MODELS, fetch_minilm

    known = [*MODELS, smollm2.NAME]
    names = list(dict.fromkeys(args.names or known))
    if unknown := [n for n in names if n not in known]:
        raise ValueError(f"unknown model(s) {unknown}; known: {known}")
    cache = Path(args.cache_dir) if args.cache_dir else default_cache_dir()
    made: list[str] = []
    if minilm := [n for n in names if n in MODELS]:
        made += fetch_minilm(root, cache, progress=True, which=minilm)
    if smollm2.NAME in names:
        smollm2.fetch_smollm2(root, cache, progress=True)
        made.append(smollm2.NAME)
    return made


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tiermesh", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="run the whole mesh locally until Ctrl-C")
    up.add_argument("--host", default="127.0.0.1")
    up.add_argument("--port", type=int, default=8001)
    up.add_argument("--data-dir", default=".tiermesh", help="private redis data (AOF) lives here")
    up.add_argument("--repository", default=None, help="model repository (default: models)")
    up.add_argument("--grace", type=float, default=10.0, help="drain grace per service, seconds")
    up.add_argument(
        "--metrics-port", type=int, default=8002, help="gateway's Prometheus port (0: any free)"
    )
    up.add_argument(
        "--http-port", type=int, default=8000, help="KServe v2 REST port (0: any free, -1: none)"
    )
    up.add_argument(
        "--model-control",
        choices=("none", "explicit"),
        default="none",
        help="explicit: clients may load/unload models (an admin tenant with a tenants file)",
    )
    up.add_argument("--tiers", default="center,edge", help="worker tiers to start")
    up.add_argument(
        "--edge-threads", type=int, default=1, help="onnxruntime threads of the edge worker"
    )
    up.add_argument(
        "--batch-pool",
        action="store_true",
        help="one more center worker for batch jobs only, at nice 19 (the online workers "
        "then take none): batch work on a pool of its own",
    )
    up.add_argument(
        "--edge-link-ms",
        type=float,
        default=0.0,
        help="added round trip (ms) between the edge worker and redis/postprocess (0: none)",
    )
    tls = up.add_argument_group(
        "TLS", "each file defaults to its TIERMESH_ variable (e.g. TIERMESH_TLS_CERT_FILE)"
    )
    tls.add_argument("--tls-cert", help="PEM certificate (chain): the public port serves TLS only")
    tls.add_argument("--tls-key", help="PEM private key of --tls-cert")
    tls.add_argument("--tls-client-ca", help="require client certificates signed by this CA")
    tls.add_argument("--internal-tls-ca", help="mTLS between services: the CA they trust")
    tls.add_argument("--internal-tls-cert", help="mTLS: certificate every service presents")
    tls.add_argument("--internal-tls-key", help="mTLS: private key of --internal-tls-cert")
    tls.add_argument(
        "--tls-dir",
        help="what `tiermesh certs DIR` wrote: public TLS with server.pem/server.key, "
        "internal mTLS with ca.pem and internal.pem/internal.key (flags above win)",
    )
    up.set_defaults(func=cmd_up)

    certs = sub.add_parser(
        "certs", help="write a development CA and certificates for 127.0.0.1 / localhost"
    )
    certs.add_argument("directory")
    certs.add_argument("--name", action="append", help="another DNS name or IP (repeatable)")
    certs.set_defaults(func=cmd_certs)

    inf = sub.add_parser("infer", help="send one request with tritonclient")
    inf.add_argument("texts", nargs="*", help="texts for a model that takes text")
    add_endpoint_args(inf)
    inf.add_argument("--model", default="mlp")
    inf.add_argument("--data", help="JSON array for a numeric input, batch first")
    inf.add_argument("--text", action="append", help="text for a BYTES input (repeatable)")
    inf.add_argument("--timeout-us", type=int, default=None)
    inf.add_argument("--priority", type=int, default=0)
    inf.add_argument("--variant", default="", help="fp32, int8, ... (default: the model's)")
    inf.set_defaults(func=cmd_infer)

    gen = sub.add_parser(
        "generate", help="one prompt to a generative model; the answer printed as it comes"
    )
    gen.add_argument("prompt")
    add_endpoint_args(gen)
    gen.add_argument("--model", default="smollm2")
    gen.add_argument("--max-new-tokens", type=int, default=None)
    gen.add_argument("--temperature", type=float, default=None, help="0 (default): greedy")
    gen.add_argument("--top-p", type=float, default=None)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--stop", action="append", default=[], help="a stop string (repeatable)")
    gen.add_argument("--no-stream", action="store_true", help="ModelInfer: the whole answer")
    gen.set_defaults(func=cmd_generate)

    sim = sub.add_parser("similarity", help="cosine similarity of two texts' embeddings")
    sim.add_argument("a")
    sim.add_argument("b")
    add_endpoint_args(sim)
    sim.add_argument("--model", default="minilm-l6")
    sim.add_argument("--variant", default="")
    sim.set_defaults(func=cmd_similarity)

    models = sub.add_parser("models", help="build, verify or list the model repository")
    models.add_argument("action", choices=["build", "fetch", "verify", "list"])
    models.add_argument("names", nargs="*", help="fetch: which models (default: all)")
    models.add_argument("--repository", default=None)
    models.add_argument("--cache-dir", default=None, help="fetch: downloads and conversions")
    models.set_defaults(func=cmd_models)

    add_bench_parser(sub)
    add_profile_parser(sub)
    add_optimize_parser(sub)
    add_keys_parser(sub)
    add_rollout_parser(sub)
    add_probe_parser(sub)
    add_batch_parser(sub, add_endpoint_args)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
