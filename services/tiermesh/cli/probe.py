"""`tiermesh probe ADDRESS`: one grpc.health.v1 Check, for container healthchecks.

Exits 0 only when the server answers SERVING; 1 for any other status (NOT_SERVING while a
service drains or starts), 2 when it cannot be asked at all (refused, timed out, TLS
failure). Used by the image's HEALTHCHECK, docker-compose and the Kubernetes exec probes
of the TLS component (Kubernetes' own `grpc:` probes speak plaintext only). Run it as
`python -m tiermesh.cli.probe` where start-up time matters: it imports only grpc.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

# The address probed when none is given: the image sets it per service where the default
# (the gateway's public port) is not the one to ask.
ADDRESS_ENV = "TIERMESH_PROBE_ADDRESS"
DEFAULT_ADDRESS = "127.0.0.1:8001"
# `--internal-tls` reads the services' own mutual-TLS files from these variables.
INTERNAL_TLS_ENV = (
    "TIERMESH_INTERNAL_TLS_CA_FILE",
    "TIERMESH_INTERNAL_TLS_CERT_FILE",
    "TIERMESH_INTERNAL_TLS_KEY_FILE",
)

SERVING = 0
NOT_SERVING = 1
UNREACHABLE = 2


def add_probe_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "address",
        nargs="?",
        default=None,
        help=f"host:port to ask (default: ${ADDRESS_ENV}, else {DEFAULT_ADDRESS})",
    )
    p.add_argument("--service", default="", help="health service name ('' = the server)")
    p.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for the answer")
    p.add_argument("--tls-ca", type=Path, help="CA that signed the server's certificate (TLS)")
    p.add_argument("--tls-cert", type=Path, help="client certificate, when the port asks")
    p.add_argument("--tls-key", type=Path, help="its private key")
    p.add_argument("--tls-server-name", default="", help="name to check the certificate against")
    p.add_argument(
        "--internal-tls",
        action="store_true",
        help="mutual TLS with the files in " + ", ".join(INTERNAL_TLS_ENV),
    )
    p.add_argument("--quiet", action="store_true", help="print nothing")


def _credentials(args: argparse.Namespace) -> grpc.ChannelCredentials | None:
    ca, cert, key = args.tls_ca, args.tls_cert, args.tls_key
    if args.internal_tls:
        missing = [name for name in INTERNAL_TLS_ENV if not os.environ.get(name)]
        if missing:
            raise ValueError(f"--internal-tls: {', '.join(missing)} not set")
        ca, cert, key = (Path(os.environ[name]) for name in INTERNAL_TLS_ENV)
    if (cert is None) != (key is None):
        raise ValueError("--tls-cert and --tls-key go together")
    if ca is None and cert is None:
        return None
    return grpc.ssl_channel_credentials(
        root_certificates=ca.read_bytes() if ca else None,
        private_key=key.read_bytes() if key else None,
        certificate_chain=cert.read_bytes() if cert else None,
    )


def check(
    address: str,
    *,
    service: str = "",
    timeout_s: float = 3.0,
    credentials: grpc.ChannelCredentials | None = None,
    server_name: str = "",
) -> tuple[int, str]:
    """Ask once; (exit code, what was seen). Never raises for a server that cannot answer."""
    options = [("grpc.ssl_target_name_override", server_name)] if server_name else []
    channel = (
        grpc.secure_channel(address, credentials, options=options)
        if credentials is not None
        else grpc.insecure_channel(address)
    )
    try:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=timeout_s
        )
    except grpc.RpcError as exc:
        code = exc.code() if isinstance(exc, grpc.Call) else None
        return UNREACHABLE, f"{address}: {code.name if code else 'error'}"
    finally:
        channel.close()
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    return (SERVING if reply.status == health_pb2.HealthCheckResponse.SERVING else NOT_SERVING), (
        f"{address}: {status}"
    )


def run(args: argparse.Namespace) -> int:
    address = args.address or os.environ.get(ADDRESS_ENV) or DEFAULT_ADDRESS
    try:
        credentials = _credentials(args)
    except (OSError, ValueError) as exc:
        print(f"tiermesh probe: {exc}", file=sys.stderr)
        return UNREACHABLE
    code, seen = check(
        address,
        service=args.service,
        timeout_s=args.timeout,
        credentials=credentials,
        server_name=args.tls_server_name,
    )
    if not args.quiet:
        print(seen, file=sys.stdout if code == SERVING else sys.stderr)
    return code


def add_probe_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("probe", help="grpc.health.v1 check: exit 0 only when SERVING")
    add_probe_args(p)
    p.set_defaults(func=run)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tiermesh probe", description=__doc__.split("\n")[0])
    add_probe_args(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
