"""`tiermesh probe ADDRESS`: one grpc.health.v1 Check, for container healthchecks.

Exits 0 only when the server answers SERVING; 1 for anything else (NOT_SERVING while a
service drains or starts; nothing answers, timed out, TLS failure: the line printed says
which), 2 for a usage error, as every subcommand (Docker reserves a HEALTHCHECK's 2).
Used by the image's HEALTHCHECK, docker-compose and the Kubernetes exec probes
of the TLS component (Kubernetes' own `grpc:` probes speak plaintext only). Run it as
`python -m tiermesh.cli.probe` where start-up time matters: it imports only grpc.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tiermesh.cli.args import (
    Parser,
    Subcommands,
    existing_file,
    grpc_address,
    old_spelling,
    parse,
    positive_float,
)
from tiermesh.cli.errors import UsageError, run_command

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

PROBE_DESCRIPTION = (
    "One grpc.health.v1 Check. Exit status: 0 SERVING; 1 anything else (NOT_SERVING,\n"
    "nothing answers, a TLS failure); 2 a usage error."
)
SERVING = 0
NOT_SERVING = 1
UNREACHABLE = 1  # a runtime error, as in every subcommand


def add_probe_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "address",
        nargs="?",
        type=grpc_address,
        default=None,
        help=f"HOST:PORT to ask (default: ${ADDRESS_ENV}, else {DEFAULT_ADDRESS})",
    )
    p.add_argument("--service", default="", help="health service name (default: '', the server)")
    timeout = p.add_argument(
        "--timeout-s", type=positive_float, default=3.0, help="seconds to wait for the answer"
    )
    old_spelling(p, "--timeout", timeout)
    p.add_argument(
        "--tls-ca",
        type=existing_file,
        help="CA that signed the server's certificate: TLS (default: none, plaintext)",
    )
    cert = p.add_argument(
        "--tls-client-cert",
        type=existing_file,
        help="client certificate, when the port asks for one (default: none)",
    )
    old_spelling(p, "--tls-cert", cert)
    key = p.add_argument(
        "--tls-client-key",
        type=existing_file,
        help="private key of --tls-client-cert (default: none)",
    )
    old_spelling(p, "--tls-key", key)
    p.add_argument(
        "--tls-server-name",
        default="",
        help="name to check the server's certificate against (default: the address's host)",
    )
    p.add_argument(
        "--internal-tls",
        action="store_true",
        help="mutual TLS with the files in " + ", ".join(INTERNAL_TLS_ENV),
    )
    p.add_argument("--quiet", action="store_true", help="print nothing")


def _credentials(args: argparse.Namespace) -> grpc.ChannelCredentials | None:
    """UsageError for an incomplete set of files; OSError for one that cannot be read."""
    ca, cert, key = args.tls_ca, args.tls_client_cert, args.tls_client_key
    if args.internal_tls:
        missing = [name for name in INTERNAL_TLS_ENV if not os.environ.get(name)]
        if missing:
            raise UsageError(f"--internal-tls: {', '.join(missing)} not set")
        ca, cert, key = (Path(os.environ[name]) for name in INTERNAL_TLS_ENV)
    if (cert is None) != (key is None):
        raise UsageError("--tls-client-cert and --tls-client-key go together")
    if ca is None and cert is None:
        return None
    return grpc.ssl_channel_credentials(
        root_certificates=ca.read_bytes() if ca else None,
        private_key=key.read_bytes() if key else None,
        certificate_chain=cert.read_bytes() if cert else None,
    )


@dataclass(frozen=True)
class Seen:
    """What one health check saw: the exit status, `ADDRESS: STATUS`, and whether the
    server answered at all."""

    code: int
    text: str
    answered: bool


def check(
    address: str,
    *,
    service: str = "",
    timeout_s: float = 3.0,
    credentials: grpc.ChannelCredentials | None = None,
    server_name: str = "",
) -> Seen:
    """Ask once. Never raises for a server that cannot answer."""
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
        return Seen(UNREACHABLE, f"{address}: {code.name if code else 'error'}", answered=False)
    finally:
        channel.close()
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    serving = reply.status == health_pb2.HealthCheckResponse.SERVING
    return Seen(SERVING if serving else NOT_SERVING, f"{address}: {status}", answered=True)


def run(args: argparse.Namespace) -> int:
    address = args.address or os.environ.get(ADDRESS_ENV) or DEFAULT_ADDRESS
    try:
        address = grpc_address(address)
    except argparse.ArgumentTypeError as exc:
        raise UsageError(f"${ADDRESS_ENV}: {exc}") from None
    seen = check(
        address,
        service=args.service,
        timeout_s=args.timeout_s,
        credentials=_credentials(args),
        server_name=args.tls_server_name,
    )
    if args.quiet:
        pass
    elif seen.code == SERVING:
        print(seen.text)
    elif seen.answered:
        print(seen.text, file=sys.stderr)
    else:
        print(
            f"{args.cli_prog}: error: {seen.text} (is the service up there, and are the TLS "
            "options the ones it asks for?)",
            file=sys.stderr,
        )
    return seen.code


def add_probe_parser(sub: Subcommands) -> None:
    p = sub.add_parser(
        "probe",
        help="grpc.health.v1 check: exit 0 only when SERVING",
        description=PROBE_DESCRIPTION,
    )
    add_probe_args(p)
    p.set_defaults(func=run)


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="tiermesh probe", description=PROBE_DESCRIPTION)
    add_probe_args(p)
    p.set_defaults(cli_prog=p.prog)
    return run_command(run, parse(p, argv))


if __name__ == "__main__":
    sys.exit(main())
