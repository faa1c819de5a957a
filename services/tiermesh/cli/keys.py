"""`tiermesh keys new --tenant NAME`: a fresh API key, printed once, and the tenants-file
entry holding its hash (the key itself is stored nowhere)."""

from __future__ import annotations

import argparse
import re

from tiermesh.cli.args import Subcommands
from tiermesh.cli.errors import UsageError
from tiermesh.core.tenants import TENANT_NAME_PATTERN, new_key, tenant_snippet


def cmd_keys_new(args: argparse.Namespace) -> int:
    if not re.match(TENANT_NAME_PATTERN, args.tenant):
        raise UsageError(
            f"{args.tenant!r}: a tenant name is 1-64 of A-Z a-z 0-9 _ . - "
            "(starting with a letter or digit)"
        )
    key = new_key()
    print(f"API key for tenant '{args.tenant}' (shown once; store it now):\n\n  {key}\n")
    print("Clients send it as the gRPC header 'authorization: Bearer <key>'.")
    print("Add this to the tenants file (TIERMESH_TENANTS_FILE); edit models and limits:\n")
    print(tenant_snippet(args.tenant, key), end="")
    return 0


def add_keys_parser(sub: Subcommands) -> None:
    keys = sub.add_parser("keys", help="API keys for the tenants file")
    actions = keys.add_subparsers(dest="action", required=True, metavar="ACTION")
    new = actions.add_parser("new", help="print a fresh API key and its tenants-file entry")
    new.add_argument("--tenant", required=True, help="the tenant the key belongs to")
    new.set_defaults(func=cmd_keys_new)
