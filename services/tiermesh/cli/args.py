"""What every `tiermesh` subcommand's parser shares: one-line usage errors (exit 2), help
that shows each flag's default, checked value types, and old flag spellings that still
work with a warning. Imports nothing heavy: `python -m tiermesh.cli.probe` uses it too."""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn, TypeAlias

USAGE = 2  # exit status of a usage error, in every subcommand
RUNTIME = 1  # exit status of a runtime error
REDIS_URL_ENV = "TIERMESH_REDIS_URL"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
REPOSITORY_ENV = "TIERMESH_MODEL_REPOSITORY"
DEFAULT_REPOSITORY = "models"

# A URL scheme in front of what should be a gRPC address (`http://...`). grpc's own target
# schemes (dns:///host:port, unix:path, ipv4:..., ipv6:...) are addresses too.
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_GRPC_SCHEMES = ("dns:", "unix:", "unix-abstract:", "ipv4:", "ipv6:", "vsock:")
_REDIS_SCHEMES = ("redis://", "rediss://", "unix://", "redis+cluster://", "rediss+cluster://")


def one_line(text: str) -> str:
    """Any message as a single line (a server's details may hold newlines)."""
    return " ".join(text.split())


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions as written; every option that takes a value shows its default, unless
    its help already says what the default is."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        d = action.default
        # 0 is a default worth showing; None, False and "" are not (the help says).
        empty = d is None or d is False or d is argparse.SUPPRESS or d in ("", [], ())
        if (
            "default" in text
            or empty
            or action.nargs == 0
            or action.required
            or not (action.option_strings or action.nargs in ("?", "*"))
        ):
            return text
        return f"{text} (default: %(default)s)".lstrip()


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage error is one line on stderr naming the subcommand and
    where to read more, with exit status 2; its subcommands' parsers are Parsers too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE, f"{self.prog}: error: {one_line(message)} (see `{self.prog} --help`)\n")


# What add_subparsers returns on a Parser: the `sub` every add_*_parser is given.
Subcommands: TypeAlias = "argparse._SubParsersAction[Parser]"


def parse(p: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """p.parse_args(argv), but an argument nobody takes is reported by the subcommand it
    was given to (argparse leaves it to the top parser, whose help is not the one to read)."""
    args, extra = p.parse_known_args(argv)
    if extra:
        prog = str(getattr(args, "cli_prog", p.prog))
        p.exit(
            USAGE,
            f"{prog}: error: unrecognized arguments: {one_line(' '.join(extra))} "
            f"(see `{prog} --help`)\n",
        )
    return args


def parsers(root: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """`root` and every subcommand's parser below it."""
    yield root
    for action in root._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):  # aliases: once each
                yield from parsers(sub)


class _OldSpelling(argparse.Action):
    """A former spelling of an option: does what the new one does, after a warning."""

    def __init__(self, *args: Any, target: argparse.Action, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.target = target

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        new = self.target.option_strings[0]
        print(f"{parser.prog}: warning: {option_string} is deprecated; use {new}", file=sys.stderr)
        self.target(parser, namespace, values, new)


def old_spelling(container: Any, old: str, action: argparse.Action) -> None:
    """Keep `old` working for `action` (what add_argument returned), hidden from --help."""
    container.add_argument(
        old,
        action=_OldSpelling,
        target=action,
        dest=action.dest,
        nargs=action.nargs,
        type=action.type,
        choices=action.choices,
        metavar=action.metavar,
        default=argparse.SUPPRESS,
        help=argparse.SUPPRESS,
    )


# -- value types: each raises ArgumentTypeError, which argparse reports as a usage error --


def _number(text: str, kind: type[int] | type[float]) -> float:
    try:
        value = kind(text)
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text} is not a finite number")
    return value


def positive_int(text: str) -> int:
    value = int(_number(text, int))
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} must be >= 1")
    return value


def nonneg_int(text: str) -> int:
    value = int(_number(text, int))
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} must be >= 0")
    return value


def positive_float(text: str) -> float:
    value = _number(text, float)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} must be > 0")
    return value


def nonneg_float(text: str) -> float:
    value = _number(text, float)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} must be >= 0")
    return value


def share(text: str) -> float:
    """A share of something, in (0, 1]."""
    value = _number(text, float)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{text} must be in (0, 1]")
    return value


def unit_interval(text: str) -> float:
    """A rate or probability, in [0, 1]."""
    value = _number(text, float)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{text} must be in [0, 1]")
    return value


def percent(text: str) -> float:
    value = _number(text, float)
    if not 0 <= value <= 100:
        raise argparse.ArgumentTypeError(f"{text} must be a percentage in 0..100")
    return value


def port(text: str) -> int:
    """A TCP port; 0: any free one."""
    value = int(_number(text, int))
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text} is not a port (0..65535)")
    return value


def port_or_off(text: str) -> int:
    """A TCP port; 0: any free one; -1: none."""
    return -1 if text.strip() == "-1" else port(text)


def positive_ints(text: str) -> list[int]:
    """Comma-separated integers >= 1, e.g. 1,2,4."""
    values = [positive_int(x.strip()) for x in text.split(",") if x.strip()]
    if not values:
        raise argparse.ArgumentTypeError("needs at least one value, e.g. 1,2,4")
    return values


def json_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON ({exc.msg} at character {exc.pos})") from None


def nonempty(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def grpc_address(text: str) -> str:
    """A gRPC target: HOST:PORT (or one of grpc's own dns:/unix:/ipv4:/ipv6: targets),
    never an http:// URL."""
    text = text.strip()
    if text.startswith(_GRPC_SCHEMES):
        return text
    if _SCHEME.match(text):
        bare = _SCHEME.sub("", text).rstrip("/")
        raise argparse.ArgumentTypeError(
            f"{text} is a URL; a gRPC address is HOST:PORT without a scheme, e.g. {bare}"
        )
    host, sep, number = text.rpartition(":")
    if not sep or not host or not number.isdigit() or not 0 < int(number) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT, e.g. 127.0.0.1:8001")
    return text


def redis_url(text: str) -> str:
    if not text.startswith(_REDIS_SCHEMES):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a Redis URL; give redis://HOST:PORT/DB (or rediss://, unix://, "
            "or redis+cluster://HOST:PORT,... for a Redis Cluster)"
        )
    return text


def http_url(text: str) -> str:
    """An http(s) URL, or '' for none."""
    if text and not text.startswith(("http://", "https://")):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an http:// URL, e.g. http://127.0.0.1:8002/metrics"
        )
    return text


def add_redis_url_arg(p: Any) -> None:
    """--redis-url, for the subcommands that talk to the mesh's Redis themselves."""
    p.add_argument(
        "--redis-url",
        type=redis_url,
        default=os.environ.get(REDIS_URL_ENV, DEFAULT_REDIS_URL),
        help=f"the mesh's Redis (default: ${REDIS_URL_ENV}, else {DEFAULT_REDIS_URL})",
    )


def add_repository_arg(p: Any) -> None:
    """--repository, for the subcommands that read the model repository (repository_of)."""
    p.add_argument(
        "--repository",
        default=None,
        help=f"model repository (default: ${REPOSITORY_ENV}, else {DEFAULT_REPOSITORY})",
    )


def repository_of(args: argparse.Namespace) -> Path:
    """The model repository a subcommand was given: --repository, else the environment's."""
    return Path(args.repository or os.environ.get(REPOSITORY_ENV, DEFAULT_REPOSITORY))


def add_variant_arg(p: Any) -> None:
    """--variant, for the subcommands that send requests or read one variant's file."""
    p.add_argument("--variant", default="", help="fp32, int8, ... (default: the model's)")


def existing_file(text: str) -> Path:
    """A file that is there and readable (checked before anything connects)."""
    path = Path(text)
    if not path.exists():
        raise argparse.ArgumentTypeError(f"{text}: no such file")
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{text}: not a file")
    try:
        with path.open("rb"):
            pass
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"{text}: cannot read it ({exc.strerror})") from None
    return path


def existing_dir(text: str) -> Path:
    path = Path(text)
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: no such directory")
    return path
