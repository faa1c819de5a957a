"""`tiermesh up` and `tiermesh certs`: argument parsing, the checks made before any process
starts (what the public ports expose, TLS files, the model repository, Redis, the ports),
and the wiring."""

from __future__ import annotations

import argparse
import errno
import os
import re
import shutil
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from tiermesh.cli import GRPC_VERBOSITY, GRPC_VERBOSITY_CHOSEN
from tiermesh.cli.args import (
    Subcommands,
    add_repository_arg,
    nonneg_float,
    old_spelling,
    port,
    port_or_off,
    positive_int,
    repository_of,
)
from tiermesh.cli.errors import CliError, UsageError
from tiermesh.core.exposure import TENANTS_ENV, Exposure, PublicPort, public_exposure
from tiermesh.up.tls import ENV as TLS_ENV
from tiermesh.up.tls import INTERNAL_TLS_ENV, INTERNAL_TLS_MODES

if TYPE_CHECKING:
    from tiermesh.up.tls import TlsFiles

# `tiermesh up` TLS file -> where `--tls-dir` finds it (a DevCerts field; "": not there).
# Internal mTLS from --tls-dir is its one certificate per service (TlsFiles.internal_tls_dir),
# unless a shared certificate is given: then the folder's CA is the one it trusts.
IN_TLS_DIR = {
    "tls_cert": "server_cert",
    "tls_key": "server_key",
    "tls_client_ca": "",
    "internal_tls_ca": "",
    "internal_tls_cert": "",
    "internal_tls_key": "",
}


def tls_files(args: argparse.Namespace) -> TlsFiles:
    """Each file: its flag, else what --tls-dir holds, else its TIERMESH_ variable (which
    the services would read anyway, so the supervisor must know it too)."""
    from tiermesh.up.certs import DevCerts
    from tiermesh.up.tls import TlsFiles

    in_dir = DevCerts.at(Path(args.tls_dir)) if args.tls_dir else None
    found: dict[str, Path | None] = {}
    for name, field in IN_TLS_DIR.items():
        value = getattr(args, name) or ""
        if not value and in_dir is not None and field:
            value = getattr(in_dir, field)
        value = value or os.environ.get(TLS_ENV[name], "")
        found[name] = Path(value) if value else None
    folder = None
    if in_dir is not None:
        if found["internal_tls_cert"] or found["internal_tls_key"]:
            found["internal_tls_ca"] = found["internal_tls_ca"] or in_dir.ca
        elif not found["internal_tls_ca"]:
            folder = in_dir.ca.parent
    return TlsFiles(**found, internal_tls_dir=folder)


def internal_tls_mode(args: argparse.Namespace) -> str:
    return str(args.internal_tls or os.environ.get(INTERNAL_TLS_ENV, "") or "on")


def redis_size(text: str) -> str:
    """A redis memory size: digits with an optional unit (b, kb, mb, gb); 0 = no limit."""
    if not re.fullmatch(r"\d+(b|kb|mb|gb)?", text.strip().lower()):
        raise argparse.ArgumentTypeError(f"{text!r}: a size such as 512mb or 2gb (0: no limit)")
    return text.strip().lower()


def tiers(text: str) -> tuple[str, ...]:
    from tiermesh.up.supervisor import WORKERS

    named = tuple(t.strip() for t in text.split(",") if t.strip())
    if not named or any(t not in WORKERS for t in named):
        raise argparse.ArgumentTypeError(
            f"{text!r}: give one or more of {', '.join(WORKERS)}, comma-separated"
        )
    return named


def _port_free(host: str, number: int, flag: str) -> None:
    """Refuse a port something already listens on: the service would die at start."""
    if number <= 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        socket.create_server((host, number), family=family).close()
    except socket.gaierror:
        raise UsageError(f"--host {host}: no such address") from None
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise CliError(
                f"{host}:{number} is in use", f"stop what listens there, or give another {flag}"
            ) from None
        if exc.errno == errno.EADDRNOTAVAIL:
            raise UsageError(f"--host {host}: not an address of this machine") from None
        raise


def _redis_answers(url: str) -> None:
    """The Redis of TIERMESH_REDIS_URL answers, and takes its credentials (every service
    would fail without it). Messages name its address, never its password."""
    import redis

    from tiermesh.core.redis_client import connect_sync, refuses_credentials, where

    try:
        client = connect_sync(url, socket_connect_timeout=1.0, socket_timeout=5.0)
    except ValueError as exc:
        raise UsageError(f"TIERMESH_REDIS_URL={url}: {exc}") from None
    try:
        client.ping()
    except redis.RedisError as exc:
        if refuses_credentials(exc):
            raise CliError(
                f"Redis at {where(url)} refused the credentials of TIERMESH_REDIS_URL: {exc}",
                "give its password (and user) in the URL: redis://[USER]:PASSWORD@HOST:PORT/0",
            ) from None
        raise CliError(
            f"cannot reach Redis at {where(url)}: {exc}",
            "start it, or unset TIERMESH_REDIS_URL for a private one",
        ) from None
    finally:
        client.close()


def exposure(args: argparse.Namespace, tenants_file: str) -> Exposure:
    """What the mesh's public ports expose without API keys (core/exposure.py): explicit
    model control without keys is refused, so is a keyless --host beyond loopback unless
    --insecure (then a warning says what is open)."""
    ports = [PublicPort("gRPC", args.host, args.port, "--host")]
    if args.http_port >= 0:
        ports.append(PublicPort("REST", args.host, args.http_port, "--host"))
    return public_exposure(
        ports,
        keys=bool(tenants_file),
        insecure=args.insecure,
        opt_out="--insecure",
        model_control=args.model_control,
        control_setting="--model-control explicit",
    )


def check_up(args: argparse.Namespace, redis_url: str) -> tuple[TlsFiles, str]:
    """Everything `up` can find wrong before it starts a process; its TLS files and the
    warning to say loudly at start ("" = none)."""
    from tiermesh.core.repository import ModelRepository
    from tiermesh.core.tls import TlsConfigError
    from tiermesh.up.redis_server import INSTALL_HINT
    from tiermesh.up.tls import check_internal_mode, mesh_tls

    exposed = exposure(args, os.environ.get(TENANTS_ENV, ""))
    if exposed.refusal:
        raise UsageError(exposed.refusal)
    files = tls_files(args)
    try:
        check_internal_mode(internal_tls_mode(args), files)
        mesh_tls(files)
    except TlsConfigError as exc:
        raise UsageError(str(exc)) from None
    _port_free(args.host, args.port, "--port")
    _port_free(args.host, args.http_port, "--http-port")
    _port_free("127.0.0.1", args.metrics_port, "--metrics-port")
    ModelRepository(repository_of(args)).load()  # RepositoryError: a runtime error
    if redis_url:
        _redis_answers(redis_url)
    elif shutil.which("redis-server") is None:
        raise CliError(INSTALL_HINT)
    return files, exposed.warning


def cmd_up(args: argparse.Namespace) -> int:
    from tiermesh.up.supervisor import UpOptions, run

    redis_url = os.environ.get("TIERMESH_REDIS_URL", "")
    tls, warning = check_up(args, redis_url)
    if warning:  # said now, and again in the banner once the mesh serves
        print(f"tiermesh up: {warning}", file=sys.stderr, flush=True)
    if not GRPC_VERBOSITY_CHOSEN:  # the services log as they would started alone
        os.environ.pop(GRPC_VERBOSITY, None)
    return run(
        UpOptions(
            host=args.host,
            port=args.port,
            redis_url=redis_url,
            data_dir=Path(args.data_dir),
            model_repository=repository_of(args),
            grace_s=args.grace_s,
            metrics_port=args.metrics_port,
            http_port=args.http_port,
            model_control=args.model_control,
            trace_ui=os.environ.get("TIERMESH_TRACE_UI", "") not in ("", "0", "false"),
            tiers=args.tiers,
            edge_threads=args.edge_threads,
            batch_pool=args.batch_pool,
            edge_link_ms=args.edge_link_ms,
            tls=tls,
            internal_tls=internal_tls_mode(args),
            redis_maxmemory=args.redis_maxmemory,
            front_door=args.front_door or "",
            center_workers=args.center_workers or 0,
            insecure_warning=warning,
        )
    )


def cmd_certs(args: argparse.Namespace) -> int:
    from tiermesh.up.certs import write_dev_certs

    made = write_dev_certs(Path(args.directory), extra_names=args.name or [])
    print(
        f"wrote a CA and certificates for 127.0.0.1, ::1, localhost"
        f"{''.join(', ' + n for n in args.name or [])} into {args.directory}\n"
        f"  tiermesh up --tls-dir {args.directory}   "
        "(public TLS with server.pem, internal mTLS with a certificate per service)\n"
        f"  clients trust {made.ca}"
    )
    return 0


def add_up_parser(sub: Subcommands) -> None:
    up = sub.add_parser("up", help="run the whole mesh locally until Ctrl-C")
    up.add_argument(
        "--host",
        default="127.0.0.1",
        help="address of the public ports; one beyond loopback needs API keys "
        f"(${TENANTS_ENV}) or --insecure",
    )
    up.add_argument(
        "--insecure",
        action="store_true",
        help="let --host be beyond loopback without API keys: anyone who reaches it may "
        "call every model (logged loudly at start)",
    )
    up.add_argument("--port", type=port, default=8001, help="the gateway's KServe v2 gRPC port")
    up.add_argument("--data-dir", default=".tiermesh", help="private redis data (AOF) lives here")
    add_repository_arg(up)
    grace = up.add_argument(
        "--grace-s", type=nonneg_float, default=10.0, help="drain grace per service, seconds"
    )
    old_spelling(up, "--grace", grace)
    up.add_argument(
        "--metrics-port", type=port, default=8002, help="gateway's Prometheus port (0: any free)"
    )
    up.add_argument(
        "--http-port",
        type=port_or_off,
        default=8000,
        help="KServe v2 REST port (0: any free, -1: none)",
    )
    up.add_argument(
        "--model-control",
        choices=("none", "explicit"),
        default="none",
        help="explicit: an admin tenant may load/unload models (needs API keys: "
        f"${TENANTS_ENV} with a tenant marked admin: true)",
    )
    up.add_argument(
        "--tiers", type=tiers, default="center,edge", help="worker tiers to start, comma-separated"
    )
    up.add_argument(
        "--edge-threads",
        type=positive_int,
        default=1,
        help="onnxruntime threads of the edge worker",
    )
    up.add_argument(
        "--batch-pool",
        action="store_true",
        help="one more center worker for batch jobs only, at nice 19 (the online workers "
        "then take none): batch work on a pool of its own",
    )
    up.add_argument(
        "--center-workers",
        type=positive_int,
        default=None,
        help="online worker processes on the center tier, each with its own onnxruntime "
        "session (set TIERMESH_INTRA_OP_THREADS so that they share the cores); default: "
        "$TIERMESH_CENTER_WORKERS, else 1",
    )
    up.add_argument(
        "--front-door",
        choices=("auto", "go", "python"),
        default=None,
        help="the public gRPC port's process: the Go front door in front of the Python "
        "gateway (built from Debian's Go packages: make frontdoor), or the Python gateway "
        "itself; auto: go unless public TLS, API keys, explicit model control or a sampler other "
        "than OpenTelemetry's default are configured (the Go door does not do them yet) or "
        "the Go toolchain is missing; default: $TIERMESH_FRONT_DOOR, else auto",
    )
    up.add_argument(
        "--redis-maxmemory",
        type=redis_size,
        default="1gb",
        help="the private redis-server's memory bound (maxmemory-policy noeviction: past it "
        "writes are refused, no queued work is evicted); 0: none (default: 1gb)",
    )
    up.add_argument(
        "--edge-link-ms",
        type=nonneg_float,
        default=0.0,
        help="added round trip (ms) between the edge worker and redis/postprocess (0: none)",
    )
    tls = up.add_argument_group(
        "TLS",
        "each file defaults to its TIERMESH_ variable, else none: the public port in "
        "plaintext, the internal hops in mTLS with certificates made at start",
    )
    for flag, text in (
        ("--tls-cert", "the server's PEM certificate (chain): the public port serves TLS only"),
        ("--tls-key", "PEM private key of --tls-cert"),
        ("--tls-client-ca", "require client certificates signed by this CA"),
        ("--internal-tls-ca", "mTLS between services: the CA they trust"),
        ("--internal-tls-cert", "mTLS: certificate every service presents"),
        ("--internal-tls-key", "mTLS: private key of --internal-tls-cert"),
    ):
        variable = TLS_ENV[flag.removeprefix("--").replace("-", "_")]
        tls.add_argument(flag, help=f"{text} (default: ${variable})")
    tls.add_argument(
        "--tls-dir",
        help="what `tiermesh certs DIR` wrote: public TLS with server.pem/server.key, "
        "internal mTLS with ca.pem and a certificate per service, SERVICE.pem/SERVICE.key "
        "(flags above win; default: none)",
    )
    tls.add_argument(
        "--internal-tls",
        choices=INTERNAL_TLS_MODES,
        default=None,
        help="mutual TLS between the services, each presenting its own certificate and "
        "taking calls only from the services that make them: on (the files above, else a "
        "CA and a certificate per service made at every start in --data-dir/tls) or off "
        f"(plaintext, said loudly at start); default: ${INTERNAL_TLS_ENV}, else on",
    )
    up.set_defaults(func=cmd_up)

    certs = sub.add_parser(
        "certs", help="write a development CA and certificates for 127.0.0.1 / localhost"
    )
    certs.add_argument("directory", help="where to write them (made if missing)")
    certs.add_argument(
        "--name",
        action="append",
        help="another DNS name or IP (repeatable; default: loopback names only)",
    )
    certs.set_defaults(func=cmd_certs)
