"""The one error path of the `tiermesh` command: a subcommand raises, `run_command` prints
one line on stderr, `tiermesh <subcommand>: error: <what> (<what to do>)`, and returns the
exit status: 2 for a usage error (the command line, or an input file it names, is wrong;
found before anything connects), 1 for a runtime error (nothing answers, the server or
the model repository refuses). An exception nobody expected is one line too, with the
way to see its traceback: TIERMESH_DEBUG=1 (or `tiermesh --debug`)."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Iterator

from tiermesh.cli.args import REPOSITORY_ENV, RUNTIME, USAGE, one_line

DEBUG_ENV = "TIERMESH_DEBUG"
INTERRUPTED = 130
START_MESH = "is the mesh running? start it with `tiermesh up`, or give --url HOST:PORT"


class CliError(Exception):
    """A runtime failure the user can act on: exit status 1."""

    status = RUNTIME

    def __init__(self, what: str, hint: str = "") -> None:
        super().__init__(what)
        self.what = what
        self.hint = hint

    def line(self, prog: str) -> str:
        hint = f" ({self.hint})" if self.hint else ""
        return one_line(f"{prog}: error: {self.what}{hint}")


class UsageError(CliError):
    """The command line (or an input file it names) is wrong: exit status 2."""

    status = USAGE


class Interrupted(CliError):
    """Ctrl-C: exit status 130, as a shell reports a SIGINT."""

    status = INTERRUPTED


def debugging(args: argparse.Namespace) -> bool:
    """--debug or TIERMESH_DEBUG: an unexpected exception shows its traceback."""
    flag = os.environ.get(DEBUG_ENV, "")
    return bool(getattr(args, "debug", False)) or flag not in ("", "0", "false")


def run_command(func: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """Run a subcommand; its status, or one line on stderr and 1 or 2 when it raised."""
    prog = str(getattr(args, "cli_prog", "tiermesh"))
    try:
        return int(func(args))
    except KeyboardInterrupt:
        sys.stdout.flush()
        print(f"\n{prog}: interrupted", file=sys.stderr)
        return INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`| head`): nothing more to say to it.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return RUNTIME
    except Exception as exc:
        if debugging(args):
            raise
        error = explain(exc, args)
        sys.stdout.flush()
        print(error.line(prog), file=sys.stderr)
        return error.status


def _loaded(exc: BaseException, module: str, name: str) -> bool:
    """isinstance(exc, module.name), importing nothing: an exception of a module that was
    never imported cannot have been raised."""
    cls = getattr(sys.modules.get(module), name, None)
    return isinstance(cls, type) and isinstance(exc, cls)


# What grpc says when nothing listens at the address; a TLS mismatch (a plaintext client
# at a TLS port) fails to connect too, with another last error ("Socket closed").
_REFUSED = "Connection refused"


def _grpc_error(code: str, details: str, args: argparse.Namespace) -> CliError:
    """A failed gRPC call (`code` as in StatusCode.NAME, without the prefix); the code
    stays in the line, for scripts and searches."""
    url = getattr(args, "url", None) or getattr(args, "address", None) or "the server"
    if code == "UNAVAILABLE" and _REFUSED in details:
        return CliError(f"UNAVAILABLE: nothing answers at {url}", START_MESH)
    if code == "UNAVAILABLE":
        return CliError(
            f"UNAVAILABLE: {url}: {details}",
            "check --url and the TLS options (--tls, --tls-ca, --tls-client-cert)",
        )
    if code == "DEADLINE_EXCEEDED":
        return CliError(
            f"DEADLINE_EXCEEDED: no answer from {url} in time", "is the mesh overloaded?"
        )
    if code == "UNAUTHENTICATED":
        return CliError(f"UNAUTHENTICATED: {details}", "give --api-key or set TIERMESH_API_KEY")
    return CliError(f"{code}: {details}")


# Exceptions whose message is written for the user: printed as they are.
_DOMAIN_ERRORS = (
    ("tiermesh.bench.calls", "BenchError"),
    ("tiermesh.convert.fetch", "FetchError"),
    ("tiermesh.core.model_config", "RepositoryError"),
    ("tiermesh.rollout.state", "RolloutError"),
    ("tiermesh.up.redis_server", "RedisNotFound"),
    ("tiermesh.up.supervisor", "StartupError"),
)


def explain(exc: BaseException, args: argparse.Namespace) -> CliError:
    """The one-line message (and exit status) for an exception a subcommand raised."""
    if isinstance(exc, CliError):
        return exc
    if _loaded(exc, "tritonclient.utils", "InferenceServerException"):
        status = str(exc.status() or "")  # type: ignore[attr-defined]
        message = str(exc.message() or "")  # type: ignore[attr-defined]
        if status:
            return _grpc_error(status.removeprefix("StatusCode."), message, args)
        return CliError(message or repr(exc))
    if _loaded(exc, "grpc", "RpcError") and callable(getattr(exc, "code", None)):
        details = exc.details() if callable(getattr(exc, "details", None)) else ""  # type: ignore[attr-defined]
        return _grpc_error(exc.code().name, str(details or ""), args)  # type: ignore[attr-defined]
    if _loaded(exc, "redis.exceptions", "ConnectionError") or _loaded(
        exc, "redis.exceptions", "TimeoutError"
    ):
        url = getattr(args, "redis_url", None) or "its URL"
        return CliError(
            f"cannot reach Redis at {url}: {exc}",
            "is the mesh running? give --redis-url or set TIERMESH_REDIS_URL",
        )
    if _loaded(exc, "redis.exceptions", "RedisError"):
        return CliError(f"Redis: {exc}")
    if isinstance(exc, OSError):
        return _os_error(exc)
    for module, name in _DOMAIN_ERRORS:
        if _loaded(exc, module, name):
            if "UNAVAILABLE" in str(exc) and _REFUSED in str(exc):  # the bench's first call
                return _grpc_error("UNAVAILABLE", _REFUSED, args)
            if name == "RepositoryError" and "does not exist" in str(exc):
                return CliError(str(exc), f"give --repository, or set {REPOSITORY_ENV}")
            return CliError(str(exc))
    if isinstance(exc, ValueError):
        return CliError(str(exc))
    return CliError(
        f"unexpected {type(exc).__name__}: {exc}",
        f"rerun with {DEBUG_ENV}=1 to see the traceback",
    )


def _os_error(exc: OSError) -> CliError:
    where = f"{exc.filename}: " if exc.filename else ""
    if isinstance(exc, FileNotFoundError):
        return CliError(f"{where}no such file or directory")
    if isinstance(exc, PermissionError):
        return CliError(f"{where}permission denied")
    return CliError(f"{where}{exc.strerror or exc}")


@contextlib.contextmanager
def usage_errors(*kinds: type[Exception]) -> Iterator[None]:
    """Inside it, `kinds` (ValueError by default) become UsageError: for the checks of a
    subcommand's arguments (and the input files they name) that argparse cannot do."""
    caught = kinds or (ValueError,)
    try:
        yield
    except CliError:
        raise
    except caught as exc:
        raise UsageError(str(exc)) from exc
