"""The `tiermesh` command."""

import os

# grpc's C core writes some failures (a refused TLS handshake) to stderr at INFO level,
# beside the command's own one-line error: only its errors, unless the caller chose a
# verbosity. grpc reads the variable when it is first imported, so it is set here, before
# any module of the command imports grpc. `tiermesh up` hands its services their own
# default again (cli/up.py).
GRPC_VERBOSITY = "GRPC_VERBOSITY"
GRPC_VERBOSITY_CHOSEN = GRPC_VERBOSITY in os.environ
os.environ.setdefault(GRPC_VERBOSITY, "ERROR")
