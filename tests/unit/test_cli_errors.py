"""Every `tiermesh` subcommand's error cases through the real entry point: no server (a free
port on 127.0.0.1), no Redis, an http:// URL given for a gRPC address, missing or malformed
input files, malformed values. Each prints one line on stderr, `tiermesh <subcommand>:
error: ...`, never a traceback, and exits 2 for a usage error, 1 for a runtime error. Also:
--version, help text with defaults on every option, and the old option spellings."""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc
import onnx
import pytest
from onnx import TensorProto, helper

from tiermesh.cli import main as cli_main
from tiermesh.cli.args import RUNTIME, USAGE, HelpFormatter, parsers
from tiermesh.cli.main import main, parser
from tiermesh.up.certs import DevCerts
from tiermesh.up.processes import free_port

MODELS = Path(__file__).resolve().parents[2] / "models"
# Variables the CLI reads that would change what these cases see.
ENV = (
    "TIERMESH_REDIS_URL",
    "TIERMESH_PROBE_ADDRESS",
    "TIERMESH_API_KEY",
    "TIERMESH_MODEL_REPOSITORY",
    "TIERMESH_DEBUG",
    "TIERMESH_TLS_CERT_FILE",
    "TIERMESH_TLS_KEY_FILE",
    "TIERMESH_TLS_CLIENT_CA_FILE",
    "TIERMESH_INTERNAL_TLS_CA_FILE",
    "TIERMESH_INTERNAL_TLS_CERT_FILE",
    "TIERMESH_INTERNAL_TLS_KEY_FILE",
    "TIERMESH_TENANTS_FILE",
)


@dataclass(frozen=True)
class Case:
    """`argv` (with {placeholders}) fails in subcommand `prog` with `status`, its one
    error line holding `says`; `env`: variables set for it."""

    prog: str
    argv: str
    status: int
    says: str
    env: tuple[tuple[str, str], ...] = ()


U, R = USAGE, RUNTIME
CASES = [
    # up: every check before any process starts
    Case("up", "up --port -5", U, "argument --port: -5 is not a port"),
    Case("up", "up --grace-s -1", U, "argument --grace-s: -1 must be >= 0"),
    Case("up", "up --tiers center,gpu", U, "give one or more of center, edge"),
    Case("up", "up --http-port 70000", U, "is not a port"),
    Case("up", "up --tls-cert {file}", U, "--tls-cert and --tls-key go together"),
    Case("up", "up --internal-tls off --internal-tls-ca {file}", U, "--internal-tls off, yet"),
    Case("up", "up --internal-tls maybe", U, "argument --internal-tls: invalid choice"),
    Case("up", "up --redis-maxmemory lots", U, "a size such as 512mb or 2gb"),
    # beyond loopback: API keys or --insecure; explicit model control: API keys, always
    Case("up", "up --host 0.0.0.0 {free_ports}", U, "--host 0.0.0.0 listens beyond this"),
    Case("up", "up --host :: {free_ports}", U, "or give --insecure to let anyone who reaches"),
    Case("up", "up --host 0.0.0.0 --insecure --repository {missing} {free_ports}", R, "not exist"),
    Case(
        "up",
        "up --host 0.0.0.0 --repository {missing} {free_ports}",
        R,
        "does not exist",
        env=(("TIERMESH_TENANTS_FILE", "{file}"),),
    ),
    Case("up", "up --model-control explicit {free_ports}", U, "explicit needs API keys: set"),
    Case("up", "up --model-control explicit --host :: --insecure", U, "admin: true"),
    Case("up", "up --repository {missing} {free_ports}", R, "does not exist"),
    Case("up", "up --port {busy} --http-port -1 --metrics-port 0", R, "is in use"),
    Case(
        "up",
        "up --repository {repo} {free_ports}",
        R,
        "cannot reach Redis at redis://127.0.0.1:",
        env=(("TIERMESH_REDIS_URL", "{redis}"),),
    ),
    Case(
        "up",
        "up --repository {repo} {free_ports}",
        U,
        "TIERMESH_REDIS_URL=http://x",
        env=(("TIERMESH_REDIS_URL", "http://x"),),
    ),
    # certs
    Case("certs", "certs", U, "the following arguments are required: directory"),
    Case("certs", "certs {file}/certs", R, "Not a directory"),
    # infer
    Case("infer", "infer --url {down} --data [[1,2,3,4]]", R, "UNAVAILABLE: nothing answers at"),
    Case("infer", "infer --url http://127.0.0.1:8001 --data [[1]]", U, "is a URL; a gRPC address"),
    Case("infer", "infer --url localhost --data [[1]]", U, "is not HOST:PORT"),
    Case("infer", "infer --url {down} --data [[1,", U, "argument --data: not JSON"),
    Case("infer", "infer --url {down}", U, "give --data JSON for a numeric input or texts"),
    Case("infer", "infer --url {down} --tls-ca {missing}", U, "--tls-ca: {missing}: no such file"),
    Case("infer", "infer --url {down} --data [[1]] --tls-client-cert {file}", U, "go together"),
    Case("infer", "infer --url {down} --data [[1]] --priority -1", U, "--priority: -1 must be"),
    Case("infer", "infer --url {down} --data [[1]] --timeout-us 0", U, "--timeout-us: 0 must be"),
    Case("infer", "infer --url {tls} --data [[1]]", R, "UNAVAILABLE: {tls}: "),
    # generate
    Case("generate", "generate hi --url {down}", R, "UNAVAILABLE: nothing answers at"),
    Case("generate", "generate hi --url {down} --no-stream", R, "nothing answers at"),
    Case("generate", "generate hi --url http://x:1", U, "is a URL"),
    Case("generate", "generate hi --max-new-tokens 0", U, "--max-new-tokens: 0 must be >= 1"),
    Case("generate", "generate hi --temperature nan", U, "temperature: nan is not a finite"),
    Case("generate", "generate hi --top-p 2", U, "--top-p: 2 must be in (0, 1]"),
    Case("generate", "generate", U, "the following arguments are required: prompt"),
    # similarity
    Case("similarity", "similarity a b --url {down}", R, "nothing answers at"),
    Case("similarity", "similarity a", U, "the following arguments are required: b"),
    Case("similarity", "similarity a b --url grpc://h:1", U, "is a URL"),
    # models
    Case("models verify", "models verify --repository {missing}", R, "does not exist"),
    Case("models list", "models list --repository {missing}", R, "does not exist"),
    Case("models build", "models build --repository {file}", R, "does not exist"),
    Case(
        "models fetch", "models fetch --repository {file} --cache-dir {file}", R, "Not a directory"
    ),
    Case("models fetch", "models fetch nosuch --repository {repo}", U, "unknown model(s) nosuch"),
    Case("models verify", "models verify mlp --repository {repo}", U, "arguments: mlp"),
    Case("models list", "models list mlp", U, "unrecognized arguments: mlp"),
    Case("models build", "models build mlp", U, "unrecognized arguments: mlp"),
    Case("models schema", "models schema --repository {repo}", U, "arguments: --repository"),
    Case("models add", "models add {missing}", U, "PATH.onnx: {missing}: no such file"),
    Case("models add", "models add {file} --repository {repo}", U, "not an ONNX model"),
    Case("models add", "models add {onnx} --repository {broken}", R, "does not load with"),
    Case("models import-triton", "models import-triton {missing}", U, "no such directory"),
    Case("models import-triton", "models import-triton {repo}", U, "no config.pbtxt"),
    Case("models import-triton", "models import-triton {triton} --repository {broken}", R, "x/"),
    Case("models", "models rebuild", U, "invalid choice: 'rebuild'"),
    # bench: every scenario
    Case("bench", "bench", U, "the following arguments are required: SCENARIO"),
    Case("bench single", "bench single --url {down} {bench}", R, "nothing answers at"),
    Case("bench single", "bench single --url http://h:1", U, "is a URL"),
    Case("bench single", "bench single --prices {missing}", U, "cannot read prices file"),
    Case("bench single", "bench single --metrics-url 127.0.0.1:8002", U, "not an http:// URL"),
    Case("bench single", "bench single --mesh-metrics bogus {bench}", U, "expected TIER=URL"),
    Case("bench steady", "bench steady --url {down} {bench}", R, "nothing answers at"),
    Case("bench steady", "bench steady --requests 0 {bench}", U, "must be positive"),
    Case("bench steady", "bench steady --concurrency 0 {bench}", U, "--concurrency and"),
    Case("bench soak", "bench soak --url {down} {bench}", R, "nothing answers at"),
    Case("bench soak", "bench soak --mix short {bench}", U, "argument --mix"),
    Case("bench ladder", "bench ladder --url {down} {bench}", R, "nothing answers at"),
    Case("bench ladder", "bench ladder --steps a,b", U, "argument --steps: 'a' is not an"),
    Case("bench ladder", "bench ladder --max-error-rate 2", U, "must be in [0, 1]"),
    Case("bench ladder", "bench ladder --steps 4,2 {bench}", U, "ladder steps must rise"),
    Case("bench burst", "bench burst --url {down} {bench}", R, "nothing answers at"),
    Case("bench burst", "bench burst --rate -1 {bench}", U, "rates must be >= 0"),
    Case("bench generate", "bench generate --url {down} {bench}", R, "nothing answers at"),
    Case("bench generate", "bench generate --rate 1 --concurrency 2 {bench}", U, "not both"),
    Case("bench generate", "bench generate --prompts {missing} {bench}", U, "cannot read it"),
    Case("bench generate", "bench generate --max-new-tokens 0", U, "1 <= MIN <= MAX"),
    Case("bench compare", "bench compare {missing} {missing}", U, "not a readable report"),
    Case("bench compare", "bench compare a", U, "arguments are required: b"),
    Case("bench compare", "bench compare a b --min-ok -1", U, "--min-ok: -1 must be >= 0"),
    Case("bench replay", "bench replay {missing}", U, "argument capture: {missing}: no such"),
    Case("bench replay", "bench replay {file}", U, "not a capture record"),
    Case("bench replay", "bench replay {capture} --url {down}", R, "nothing answers at"),
    Case("bench replay", "bench replay {capture} --speed 0", U, "--speed: 0 must be > 0"),
    Case("bench capture", "bench capture --redis-url http://h stop", U, "not a Redis URL"),
    Case("bench capture", "bench capture", U, "arguments are required: ACTION"),
    Case("bench capture start", "bench capture --redis-url {redis} start", R, "cannot reach"),
    Case("bench capture start", "bench capture start --rate 5", U, "--rate: 5 must be in (0, 1]"),
    Case("bench capture start", "bench capture start --window-s -1", U, "must be >= 0"),
    Case("bench capture stop", "bench capture --redis-url {redis} stop", R, "cannot reach Redis"),
    Case("bench capture stop", "bench capture stop now", U, "unrecognized arguments: now"),
    Case("bench capture release", "bench capture --redis-url {redis} release", R, "Redis"),
    Case("bench capture release", "bench capture release --rate 1", U, "unrecognized"),
    Case("bench capture clear", "bench capture --redis-url {redis} clear", R, "cannot reach"),
    Case("bench capture clear", "bench capture clear --all", U, "unrecognized arguments: --all"),
    Case("bench capture export", "bench capture --redis-url {redis} export --out x", R, "Redis"),
    Case("bench capture export", "bench capture export", U, "required: --out"),
    Case("bench capture key", "bench capture key --rate 1", U, "unrecognized arguments"),
    # profile
    Case("profile", "profile mlp --repository {missing}", R, "does not exist"),
    Case("profile", "profile nosuch --repository {repo}", R, "unknown model"),
    Case("profile", "profile mlp --seq 0", U, "--seq: 0 must be >= 1"),
    Case("profile", "profile mlp --balance -1", U, "--balance: -1 must be > 0"),
    # optimize
    Case("optimize", "optimize m --repository {missing}", R, "does not exist"),
    Case("optimize", "optimize nosuch --repository {repo}", R, "unknown model 'nosuch'"),
    Case("optimize", "optimize m --gate bogus", U, "gate 'bogus' not understood"),
    Case("optimize", "optimize m --variants fp16,int9", U, "unknown variant(s) int9: choose"),
    Case("optimize", "optimize m --calibration {missing}", U, "no such file"),
    Case("optimize", "optimize m --eval {empty}", U, "no texts"),
    # keys
    Case("keys", "keys", U, "arguments are required: ACTION"),
    Case("keys new", "keys new --tenant 'a b'", U, "a tenant name is 1-64"),
    Case("keys new", "keys new", U, "arguments are required: --tenant"),
    # rollout: every action
    Case("rollout", "rollout", U, "arguments are required: ACTION"),
    Case("rollout start", "rollout start mlp --canary 2 --percent 150", U, "0..100"),
    Case("rollout start", "rollout start mlp --percent 5", U, "required: --canary"),
    Case("rollout start", "rollout start mlp --canary 2 --percent 5 {rollout}", R, "Redis"),
    Case("rollout start", "rollout start nosuch --canary 2 --percent 5 {rollout}", R, "unknown"),
    Case("rollout status", "rollout status mlp {rollout}", R, "cannot reach Redis at"),
    Case("rollout status", "rollout status mlp --redis-url http://h", U, "not a Redis URL"),
    Case("rollout status", "rollout status mlp --events -1", U, "--events: -1 must be >= 0"),
    Case("rollout promote", "rollout promote mlp {rollout}", R, "cannot reach Redis"),
    Case("rollout promote", "rollout promote mlp --repository {missing}", R, "does not exist"),
    Case("rollout promote", "rollout promote --who me", U, "arguments are required: model"),
    Case("rollout rollback", "rollout rollback mlp {rollout}", R, "cannot reach Redis"),
    Case("rollout rollback", "rollout rollback", U, "arguments are required: model"),
    # probe: 1 when nothing (it trusts) answers, as any runtime error
    Case("probe", "probe {down} --timeout-s 2", R, "{down}: UNAVAILABLE"),
    Case("probe", "probe {tls} --timeout-s 2", R, "{tls}: UNAVAILABLE"),
    Case("probe", "probe http://127.0.0.1:1", U, "argument address: http://127.0.0.1:1 is a URL"),
    Case("probe", "probe {down} --timeout-s 0", U, "--timeout-s: 0 must be > 0"),
    Case("probe", "probe {down} --tls-client-cert {file}", U, "go together"),
    Case("probe", "probe {down} --tls-ca {missing}", U, "no such file"),
    Case("probe", "probe {down} --internal-tls", U, "--internal-tls: TIERMESH_INTERNAL"),
    Case("probe", "probe", U, "$TIERMESH_PROBE_ADDRESS", env=(("TIERMESH_PROBE_ADDRESS", "h"),)),
    # batch: every action
    Case("batch", "batch", U, "arguments are required: ACTION"),
    Case("batch submit", "batch submit mlp {missing}", U, "argument input: {missing}: no such"),
    Case("batch submit", "batch submit mlp {file}", U, ":1: not JSON"),
    Case("batch submit", "batch submit mlp {empty}", U, "no inputs"),
    Case("batch submit", "batch submit mlp {jsonl} --url {down}", R, "nothing answers at"),
    Case("batch submit", "batch submit mlp {jsonl} --metrics-url h:1", U, "not an http:// URL"),
    Case("batch status", "batch status j1 --url {down}", R, "UNAVAILABLE: nothing answers at"),
    Case("batch status", "batch status j1 --interval-s 0", U, "--interval-s: 0 must be > 0"),
    Case("batch status", "batch status '' --url {down}", U, "argument job: must not be empty"),
    Case("batch results", "batch results j1 --url {down}", R, "nothing answers at"),
    Case("batch results", "batch results j1 --url http://h:1", U, "is a URL"),
    Case("batch cancel", "batch cancel j1 --url {down}", R, "nothing answers at"),
    Case("batch cancel", "batch cancel --url {down}", U, "arguments are required: job"),
    # the command itself
    Case("", "", U, "the following arguments are required: COMMAND"),
    Case("", "serve", U, "invalid choice: 'serve'"),
]


@pytest.fixture
def where(
    tmp_path: Path, certs: DevCerts, monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[str, str]]:
    """The placeholders of the cases: ports nothing listens on, a port something does, a
    TLS port, a small model repository and input files."""
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)  # bench and optimize would write reports here
    repo = tmp_path / "repo"
    (repo / "mlp").mkdir(parents=True)
    shutil.copy(MODELS / "mlp" / "config.yaml", repo / "mlp" / "config.yaml")
    (tmp_path / "file.txt").write_text("plain text\n")
    (tmp_path / "empty.txt").write_text("\n")
    # A model file, a Triton folder of it, and a repository whose config is broken.
    triton = tmp_path / "triton" / "ident"
    (triton / "1").mkdir(parents=True)
    identity = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "ident",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 2])],
    )
    onnx.save(helper.make_model(identity), triton / "1" / "model.onnx")
    (triton / "config.pbtxt").write_text('platform: "onnxruntime_onnx"\nmax_batch_size: 4\n')
    (tmp_path / "broken" / "x").mkdir(parents=True)
    (tmp_path / "broken" / "x" / "config.yaml").write_text("name: [\n")
    (tmp_path / "inputs.jsonl").write_text('{"text": "hello"}\n')
    (tmp_path / "capture.jsonl").write_text(
        '{"t_ms": 0, "model": "mlp", "priority": 0, '
        '"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4]}]}\n'
    )
    down = free_port()
    busy = socket.create_server(("127.0.0.1", 0))
    tls = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    key, cert = certs.server_key.read_bytes(), certs.server_cert.read_bytes()
    tls_port = tls.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials([(key, cert)]))
    tls.start()
    try:
        yield {
            "down": f"127.0.0.1:{down}",
            "redis": f"redis://127.0.0.1:{down}/0",
            "busy": str(busy.getsockname()[1]),
            "tls": f"127.0.0.1:{tls_port}",
            "repo": str(repo),
            "missing": str(tmp_path / "missing"),
            "onnx": str(triton / "1" / "model.onnx"),
            "triton": str(triton),
            "broken": str(tmp_path / "broken"),
            "file": str(tmp_path / "file.txt"),
            "empty": str(tmp_path / "empty.txt"),
            "jsonl": str(tmp_path / "inputs.jsonl"),
            "capture": str(tmp_path / "capture.jsonl"),
            "free_ports": "--port 0 --http-port -1 --metrics-port 0",
            "bench": f"--no-progress --warmup 0 --out {tmp_path / 'report'}",
            "rollout": f"--redis-url redis://127.0.0.1:{down}/0 --repository {repo}",
        }
    finally:
        tls.stop(grace=None)
        busy.close()


def _argv(case: Case, where: dict[str, str]) -> list[str]:
    return shlex.split(case.argv.format(**where))


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """main(argv) in this process: its status (argparse's usage errors exit), stdout and
    stderr."""
    try:
        status = main(argv)
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else RUNTIME
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def error_line(err: str) -> str:
    """The one line on stderr, an error line, and no traceback."""
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, f"one line expected on stderr, got:\n{err}"
    return lines[0]


@pytest.mark.parametrize("case", CASES, ids=[f"{c.prog or 'tiermesh'}: {c.argv}" for c in CASES])
def test_one_line_and_the_status(
    case: Case,
    where: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in case.env:
        monkeypatch.setenv(name, value.format(**where))
    status, _, err = run(_argv(case, where), capsys)
    line = error_line(err)
    assert line.startswith(f"{' '.join(['tiermesh', case.prog]).rstrip()}: error: "), line
    assert case.says.format(**where) in line
    assert status == case.status, line


@pytest.mark.parametrize(
    ("host", "warning"),
    [
        ("0.0.0.0", "INSECURE (--insecure): no API keys on gRPC on 0.0.0.0 (a free port): "),
        ("127.0.0.1", ""),
    ],
)
def test_up_insecure_starts_and_says_loudly_what_is_open(
    host: str,
    warning: str,
    where: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`up --insecure` passes every check and starts the mesh (its supervisor replaced by a
    recorder: starting the processes is the e2e tests' part) after one line on stderr
    naming each keyless port beyond loopback, which the banner repeats; on loopback it has
    nothing to say."""
    from tiermesh.up import supervisor

    started: list[supervisor.UpOptions] = []

    def record(opts: supervisor.UpOptions) -> int:
        started.append(opts)
        return 0

    monkeypatch.setattr(supervisor, "run", record)
    argv = f"up --host {host} --insecure --repository {{repo}} {{free_ports}}"
    status, _, err = run(shlex.split(argv.format(**where)), capsys)
    assert status == 0, err
    (opts,) = started
    assert opts.host == host
    assert opts.insecure_warning.startswith(warning)
    if warning:
        assert error_line(err) == f"tiermesh up: {opts.insecure_warning}"
    else:
        assert err == "" and opts.insecure_warning == ""


def _leaves() -> set[str]:
    """Every subcommand that runs something: the parsers without subcommands below."""
    found = set()
    for p in parsers(parser()):
        if not any(isinstance(a, argparse._SubParsersAction) for a in p._actions):
            found.add(p.prog.removeprefix("tiermesh").strip())
    return found


def test_the_cases_cover_every_subcommand() -> None:
    covered = {c.prog for c in CASES}
    assert _leaves() <= covered, f"no error case for {sorted(_leaves() - covered)}"
    usage = {c.prog for c in CASES if c.status == USAGE}
    assert _leaves() <= usage
    # Each subcommand that reads or talks to something is tried with nothing there; these
    # three touch nothing outside (compare's 1 is its verdict: B regressed).
    runtime = {c.prog for c in CASES if c.status == RUNTIME}
    assert _leaves() - runtime == {
        "keys new",
        "bench compare",
        "bench capture key",
        "models schema",
    }


def test_an_unexpected_error_is_one_line_and_says_how_to_see_more(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TIERMESH_DEBUG", raising=False)

    def broken(args: argparse.Namespace) -> int:
        raise RuntimeError("a bug\nover two lines")

    monkeypatch.setattr(cli_main, "cmd_infer", broken)
    status, _, err = run(["infer", "--data", "[[1]]"], capsys)
    line = error_line(err)
    assert status == RUNTIME
    assert line == (
        "tiermesh infer: error: unexpected RuntimeError: a bug over two lines "
        "(rerun with TIERMESH_DEBUG=1 to see the traceback)"
    )
    monkeypatch.setenv("TIERMESH_DEBUG", "1")
    with pytest.raises(RuntimeError, match="a bug"):
        main(["infer", "--data", "[[1]]"])
    monkeypatch.delenv("TIERMESH_DEBUG")
    with pytest.raises(RuntimeError, match="a bug"):
        main(["--debug", "infer", "--data", "[[1]]"])


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    status, out, _ = run(["--version"], capsys)
    assert status == 0 and out == f"tiermesh {version('tiermesh')}\n"


def test_every_option_has_help_that_shows_its_default() -> None:
    """Every option and argument is explained; every optional one that takes a value says
    its default (the formatter adds it unless the help tells what the default means)."""
    gaps = []
    for p in parsers(parser()):
        assert p.format_help()  # renders: no stray % in a help text
        formatter = HelpFormatter(p.prog)
        for action in p._actions:
            if isinstance(action, argparse._HelpAction | argparse._VersionAction):
                continue
            if action.help == argparse.SUPPRESS:  # an old spelling
                assert action.default == argparse.SUPPRESS, (p.prog, action.option_strings)
                continue
            if isinstance(action, argparse._SubParsersAction):
                gaps += [(p.prog, c.dest) for c in action._choices_actions if not c.help]
                continue
            name = action.option_strings or [action.dest]
            if not action.help:
                gaps.append((p.prog, *name))
                continue
            optional = action.option_strings or action.nargs in ("?", "*")
            text = formatter._expand_help(action)
            if action.nargs != 0 and optional and not action.required and "default" not in text:
                gaps.append((p.prog, *name, "no default shown"))
    assert gaps == []


def test_help_shows_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(["up", "--help"], capsys)
    assert status == 0
    flat = " ".join(out.split())
    assert "--grace-s GRACE_S drain grace per service, seconds (default: 10.0)" in flat
    assert "--grace " not in flat  # the old spelling is hidden


@pytest.mark.parametrize(
    ("argv", "dest", "value", "warning"),
    [
        (["up", "--grace", "5"], "grace_s", 5.0, "tiermesh up: warning: --grace is deprecated; "),
        (["probe", "--timeout", "2"], "timeout_s", 2.0, "--timeout is deprecated; use --timeout-s"),
        (["probe", "--tls-cert", "{file}"], "tls_client_cert", "{file}", "use --tls-client-cert"),
        (["probe", "--tls-key", "{file}"], "tls_client_key", "{file}", "use --tls-client-key"),
        (["batch", "status", "j", "--interval", "2"], "interval_s", 2.0, "use --interval-s"),
        (["batch", "submit", "m", "{file}", "--interval", "2"], "interval_s", 2.0, "use"),
    ],
)
def test_old_spellings_still_work_with_a_warning(
    argv: list[str],
    dest: str,
    value: object,
    warning: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    file = tmp_path / "file.pem"
    file.write_text("x")
    fill = {"file": str(file)}
    args = parser().parse_args([a.format(**fill) for a in argv])
    got = getattr(args, dest)
    assert (str(got) if isinstance(got, Path) else got) == (
        value.format(**fill) if isinstance(value, str) else value
    )
    (line,) = capsys.readouterr().err.splitlines()
    assert ": warning: " in line and warning in line


def test_old_and_new_spellings_mean_the_same() -> None:
    new = parser().parse_args(["up", "--grace-s", "3"])
    assert new.grace_s == 3.0
    assert parser().parse_args(["up"]).grace_s == 10.0  # the old alias leaves the default


def test_bench_generate_asks_a_generative_model_by_default() -> None:
    assert parser().parse_args(["bench", "generate"]).model == "smollm2"
    assert parser().parse_args(["generate", "hi"]).model == "smollm2"
    # the other scenarios keep theirs
    assert parser().parse_args(["bench", "steady"]).model == "mlp"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("argv", "status", "says"),
    [
        (["-m", "tiermesh.cli.main", "infer", "--url", "http://127.0.0.1:8001"], USAGE, "is a URL"),
        (["-m", "tiermesh.cli.main", "batch", "status", "j", "--url", "{down}"], RUNTIME, "{down}"),
        # grpc's own log of the refused handshake stays off stderr
        (["-m", "tiermesh.cli.main", "infer", "--url", "{tls}", "--tls", "--data", "[[1]]"],
         RUNTIME, "CERTIFICATE_VERIFY_FAILED"),
        (["-m", "tiermesh.cli.probe", "{down}", "--timeout-s", "2"], RUNTIME, "UNAVAILABLE"),
        (["-m", "tiermesh.cli.probe", "--timeout-s", "x"], USAGE, "'x' is not a number"),
    ],
)  # fmt: skip
def test_real_exit_status_in_a_fresh_process(
    argv: list[str], status: int, says: str, where: dict[str, str]
) -> None:
    done = subprocess.run(
        [sys.executable, *(a.format(**where) for a in argv)],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k not in (*ENV, "GRPC_VERBOSITY")},
    )
    assert done.returncode == status, done.stderr
    assert says.format(**where) in error_line(done.stderr)
    assert done.stdout == ""
