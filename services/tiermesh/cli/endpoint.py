"""The options that say where the gateway is and how to reach it, shared by every
subcommand that calls it (infer, generate, similarity, batch): one spelling each."""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from tiermesh.cli.args import existing_file, grpc_address
from tiermesh.cli.errors import UsageError

if TYPE_CHECKING:
    from tiermesh.cli.infer import Endpoint

DEFAULT_URL = "127.0.0.1:8001"
# What `generate` and `bench generate` ask when no --model is given.
GENERATIVE_MODEL = "smollm2"
API_KEY_ENV = "TIERMESH_API_KEY"


def add_url_arg(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    p.add_argument(
        "--url",
        type=grpc_address,
        default=DEFAULT_URL,
        help="the gateway's KServe v2 gRPC address, HOST:PORT (no http://)",
    )


def add_endpoint_args(p: argparse.ArgumentParser) -> None:
    add_url_arg(p)
    p.add_argument(
        "--api-key",
        default="",
        help=f"tenant API key (default: ${API_KEY_ENV}, kept out of history)",
    )
    p.add_argument("--tls", action="store_true", help="TLS with the system's trusted CAs")
    p.add_argument(
        "--tls-ca",
        type=existing_file,
        help="CA that signed the gateway's certificate (implies --tls; default: none)",
    )
    p.add_argument(
        "--tls-client-cert",
        type=existing_file,
        help="client certificate, when the port asks for one (default: none)",
    )
    p.add_argument(
        "--tls-client-key",
        type=existing_file,
        help="private key of --tls-client-cert (default: none)",
    )


def endpoint_of(args: argparse.Namespace) -> Endpoint:
    """The Endpoint the options describe; UsageError for an incomplete client certificate."""
    from tiermesh.cli.infer import Endpoint

    if (args.tls_client_cert is None) != (args.tls_client_key is None):
        raise UsageError("--tls-client-cert and --tls-client-key go together")
    return Endpoint(
        url=args.url,
        api_key=args.api_key or os.environ.get(API_KEY_ENV, ""),
        tls=args.tls,
        ca_file=args.tls_ca,
        cert_file=args.tls_client_cert,
        key_file=args.tls_client_key,
    )
